"""How far the Vulkan and CPU backends each are from the true forward pass of a quantized llama
GGUF file: its weights dequantized (gguf-py) and run in numpy float64.

    python benchmarks/vulkan_agreement.py [MODEL.gguf] [--tokens 200] [--prompt TEXT] [--top-k 50]

Both backends round (the CPU rounds activations to q8 before each quantized matmul, as
llama.cpp does, and so does Vulkan; their sums run in other orders), so neither equals the
reference: what tells a near-tie from a defect is whether Vulkan's distance from float64 is
comparable to the CPU's. First, for each prompt, where the two backends' greedy continuations
(the engine's, as `ember run` gives) first differ, and the top-2 logit margins of the CPU,
Vulkan and float64 at that step. Then one token sequence (the first prompt and the CPU's greedy
continuation) is fed, teacher forced, to all three; per backend against float64 (and Vulkan
against the CPU), over its positions, mean and max of: |Δ logprob| of the sequence's next
token, max |Δ logprob| over the reference's top-k tokens, KL(reference ‖ backend) over the
whole vocabulary.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from ember import _core
from ember.engine import Engine
from ember.sampling import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from float64_llama import Float64Llama, distances  # noqa: E402  (the tests' reference)


def greedy(path: Path, device: str, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens after `prompt` from the engine on `device` (what `ember run` does)."""
    with Engine(path, device=device, parallel=1, n_ctx=len(prompt) + n + 8) as engine:
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        return list(engine.generate(prompt, params).tokens)


def margin(row: np.ndarray) -> float:
    """The top logit minus the second."""
    a, b = np.sort(row)[-2:][::-1]
    return float(a - b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", type=Path, help="default: the demo model, SmolLM2-135M-Instruct Q4_1")
    ap.add_argument("--tokens", type=int, default=200, help="teacher-forced positions compared")
    ap.add_argument("--prompt", action="append", help="prompts (repeatable)")
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--divergence-tokens", type=int, default=32)
    ap.add_argument("--vulkan", default="vulkan:0")
    args = ap.parse_args()
    if args.model is None:
        from ember.hub.models import demo_model_path

        args.model = demo_model_path(quiet=True)
    prompts = args.prompt or ["The capital of France is", "def add(a, b):"]

    reference = Float64Llama(args.model)
    tokenizer = _core.Tokenizer(str(args.model))
    cpu, vk = _core.Model(str(args.model), device="cpu"), _core.Model(str(args.model), device=args.vulkan)
    for prompt in prompts:
        ids = list(tokenizer.encode(prompt))
        c_tok = greedy(args.model, "cpu", ids, args.divergence_tokens)
        v_tok = greedy(args.model, args.vulkan, ids, args.divergence_tokens)
        print(f"prompt {prompt!r}:\n  cpu    {tokenizer.decode(c_tok)!r}\n"
              f"  vulkan {tokenizer.decode(v_tok)!r}")
        first = next((i for i, (a, b) in enumerate(zip(c_tok, v_tok)) if a != b), None)
        if first is None:
            print(f"  the same {args.divergence_tokens} greedy tokens")
            continue
        context = ids + c_tok[:first]
        c, v = (np.asarray(m.eval(context))[-1] for m in (cpu, vk))
        r = reference.logits(context)[-1]
        a, b = c_tok[first], v_tok[first]
        name_a, name_b = tokenizer.decode([a]), tokenizer.decode([b])
        print(f"  first divergent token #{first}, after {tokenizer.decode(c_tok[:first])!r}: cpu {a} "
              f"{name_a!r}, vulkan {b} {name_b!r}\n"
              f"  top-2 margin: cpu {margin(c):.4f}, vulkan {margin(v):.4f}, float64 {margin(r):.4f}\n"
              f"  logit({name_a!r}) - logit({name_b!r}): cpu {c[a] - c[b]:+.4f}, "
              f"vulkan {v[a] - v[b]:+.4f}, float64 {r[a] - r[b]:+.4f}")

    # One teacher-forced sequence: the first prompt and the CPU's greedy continuation.
    ids = list(tokenizer.encode(prompts[0]))
    seq = (ids + greedy(args.model, "cpu", ids, max(1, args.tokens + 1 - len(ids))))[:args.tokens + 1]
    targets = np.array(seq[1:])
    logits = {"float64": reference.logits(seq[:-1]), "cpu": np.asarray(cpu.eval(seq[:-1])),
              "vulkan": np.asarray(vk.eval(seq[:-1]))}
    print(f"\nteacher-forced: {len(targets)} positions ({prompts[0]!r} and the CPU's greedy text), "
          f"log-probabilities against float64's (top-{args.top_k}: the reference's top tokens; KL in nats)")
    print(f"{'':16} {'mean|Δ| next':>13} {'max|Δ| next':>12} {'mean top-k':>11} {'max top-k':>10} "
          f"{'mean KL':>10} {'max KL':>10}")
    for ref, got in (("float64", "cpu"), ("float64", "vulkan"), ("cpu", "vulkan")):
        d = distances(logits[ref], logits[got], targets, args.top_k)
        print(f"{got + ' vs ' + ref:16} {d['target'].mean():13.5f} {d['target'].max():12.5f} "
              f"{d['top_k'].mean():11.5f} {d['top_k'].max():10.5f} "
              f"{d['kl'].mean():10.2e} {d['kl'].max():10.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
