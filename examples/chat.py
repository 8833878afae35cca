"""A short conversation with the Python API, streamed; the second turn reuses the first's
KV cache, so only its new tokens are evaluated.

    python examples/chat.py            # the demo model (SmolLM2-135M-Instruct)
    python examples/chat.py model.gguf
"""

from __future__ import annotations

import sys

from ember.llm import LLM


def main() -> None:
    llm = LLM(sys.argv[1] if len(sys.argv) > 1 else None)
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    for question in ["What is the capital of France?", "And what is it famous for?"]:
        messages.append({"role": "user", "content": question})
        print(f">>> {question}")
        answer = ""
        for delta in llm.chat_deltas(messages, temperature=0.0, max_tokens=128):
            print(delta.text, end="", flush=True)
            answer += delta.text
            if delta.result is not None:
                usage = delta.result.usage
        print()
        print(f"[{usage.completion_tokens} tokens; {usage.cached_tokens} of "
              f"{usage.prompt_tokens} prompt tokens reused from the cache]", file=sys.stderr)
        messages.append({"role": "assistant", "content": answer})

    # The same request, shaped like OpenAI's chat completion response.
    out = llm.create_chat_completion(messages[:2], temperature=0.0, max_tokens=32)
    print(out["choices"][0]["message"], out["usage"])


if __name__ == "__main__":
    main()
