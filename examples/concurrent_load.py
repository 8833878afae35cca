"""Many users at once: N concurrent streaming chat requests with the async openai client, each
printing nothing until the end, then a summary of what the server sustained.

    ember serve --parallel 16                       # in one terminal
    python examples/concurrent_load.py --clients 16 --requests 64

For a benchmark with percentiles at several concurrency levels, see benchmarks/serve_bench.py.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import openai

QUESTIONS = [
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "Why is the sky blue?",
    "Write one sentence about the sea.",
]


async def run(base_url: str, api_key: str, clients: int, requests: int, max_tokens: int) -> None:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key)
    model = (await client.models.list()).data[0].id
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    first_token: list[float] = []
    tokens: list[int] = []

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            sent = time.perf_counter()
            stream = await client.chat.completions.create(
                model=model, max_tokens=max_tokens, temperature=0.7, seed=i, stream=True,
                stream_options={"include_usage": True},
                messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
            seen_first = False
            async for chunk in stream:
                if not seen_first and chunk.choices and chunk.choices[0].delta.content:
                    first_token.append(time.perf_counter() - sent)
                    seen_first = True
                if chunk.usage:
                    tokens.append(chunk.usage.completion_tokens)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - start
    await client.close()
    first_token.sort()
    print(f"{len(tokens)} requests from {clients} clients in {elapsed:.1f} s")
    print(f"generated {sum(tokens)} tokens: {sum(tokens) / elapsed:.1f} tokens/s in all")
    if first_token:
        print(f"time to first token: median {1000 * first_token[len(first_token) // 2]:.0f} ms, "
              f"worst {1000 * first_token[-1]:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--api-key", default="unused", help="the server's --api-key, if any")
    parser.add_argument("--clients", type=int, default=8, help="requests in flight at once")
    parser.add_argument("--requests", type=int, default=32, help="requests in all")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    asyncio.run(run(args.base_url, args.api_key, args.clients, args.requests, args.max_tokens))


if __name__ == "__main__":
    main()
