"""Talk to `ember serve` with the official openai client, unchanged.

    ember serve                       # the demo model on http://127.0.0.1:8080
    python examples/openai_client.py  # or: --base-url http://host:port/v1 --api-key KEY
"""

from __future__ import annotations

import argparse
import asyncio

import openai


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--api-key", default="unused", help="the server's --api-key, if any")
    args = parser.parse_args()

    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = client.models.list().data[0].id
    question = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]

    # One answer, greedy.
    answer = client.chat.completions.create(model=model, messages=question, temperature=0,
                                            max_tokens=64)
    print("answer:", answer.choices[0].message.content)
    print("usage: ", answer.usage)

    # The same, streamed as it is generated, with the usage at the end.
    print("stream: ", end="", flush=True)
    stream = client.chat.completions.create(model=model, messages=question, temperature=0,
                                            max_tokens=64, stream=True,
                                            stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
        if chunk.usage:
            print(f"\n({chunk.usage.completion_tokens} tokens)")

    # A plain completion with the log-probabilities of the two likeliest tokens at each step.
    completion = client.completions.create(model=model, prompt="The capital of France is",
                                           max_tokens=3, temperature=0, logprobs=2)
    print("completion:", repr(completion.choices[0].text))
    print("top logprobs:", completion.choices[0].logprobs.top_logprobs)

    # Several requests at once from the async client (the server queues what its slots can't
    # take yet).
    async def many() -> list[str]:
        aclient = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key)
        cities = ["Italy", "Spain", "Japan"]
        answers = await asyncio.gather(*(aclient.chat.completions.create(
            model=model, temperature=0, max_tokens=24,
            messages=[{"role": "user", "content": f"What is the capital of {c}?"}])
            for c in cities))
        await aclient.close()
        return [a.choices[0].message.content or "" for a in answers]

    for text in asyncio.run(many()):
        print("async:", text)


if __name__ == "__main__":
    main()
