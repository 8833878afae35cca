"""Generate text with the Python API: one completion, then the same prompt streamed.

    python examples/generate.py                      # the demo model
    python examples/generate.py model.gguf "Once upon a time"
"""

from __future__ import annotations

import sys

from ember.llm import LLM


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else None
    prompt = sys.argv[2] if len(sys.argv) > 2 else "The three primary colors are"
    llm = LLM(model)

    result = llm.generate(prompt, max_tokens=48, temperature=0.0)
    print(f"{prompt}{result.text}")
    print(f"[{result.finish_reason}; {result.usage.completion_tokens} tokens at "
          f"{result.timings.tokens_per_s:.1f} tokens/s]\n", file=sys.stderr)

    # The same, as it is generated; with a seed, sampling is repeatable.
    print(prompt, end="")
    for piece in llm.stream(prompt, max_tokens=48, temperature=0.7, seed=42, stop=["\n\n"]):
        print(piece, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
