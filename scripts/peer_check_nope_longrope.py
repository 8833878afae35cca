"""llama.cpp reads ember's SmolLM3 and Phi-3 LongRoPE files: converts the tiny random checkpoints
of tests/checkpoints.py (test_model_nope_longrope.py's) with ember convert (f32), serves each with the peer's
llama-server (one slot, the given context) and compares, for one prompt of token ids, the peer's
log-probabilities of its first generated token (its top 5) and its greedy continuation with
ember's Model at the same context.

    PYTHONPATH=build/dev/pkg python scripts/peer_check_nope_longrope.py [--peer-bin DIR]

Cases: SmolLM3 with llama.cpp's every-4th NoPE pattern (which llama.cpp hard-codes for smollm3)
and with another pattern (which only ember reads from the file: llama.cpp is expected to
disagree); Phi-3 LongRoPE trained for 32 tokens, which llama.cpp always runs with the long
factors (it rounds every context up to 256 tokens), and for 256, at n_ctx 256 (short factors) and
512 (long). ember runs each at the context llama.cpp really used."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from checkpoints import (  # noqa: E402
    NOPE_FLAGS,
    make_phi3_longrope,
    make_smollm3,
    save_checkpoint,
    tokens_for_test,
)

from ember import _core  # noqa: E402
from ember.convert import convert  # noqa: E402

N_GREEDY = 12


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peer_completion(server: str, model: Path, n_ctx: int, prompt: list[int]) -> tuple[dict, int]:
    """The peer's /completion of `prompt` (greedy, top-5 log-probabilities) and the context it
    really ran with (llama.cpp rounds n_ctx up to a multiple of 256)."""
    port = free_port()
    proc = subprocess.Popen([server, "-m", str(model), "-c", str(n_ctx), "-np", "1", "-t", "1",
                             "--port", str(port), "--host", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                with urllib.request.urlopen(url + "/health") as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        body = json.dumps({"prompt": prompt, "n_predict": N_GREEDY, "temperature": 0.0, "n_probs": 5,
                           "return_tokens": True, "cache_prompt": False}).encode()
        req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as r:
            completion = json.loads(r.read())
        with urllib.request.urlopen(url + "/props") as r:
            props = json.loads(r.read())
        return completion, int(props["default_generation_settings"]["n_ctx"])
    finally:
        proc.terminate()
        proc.wait()


def ember_run(path: Path, n_ctx: int, prompt: list[int]) -> tuple[np.ndarray, list[int]]:
    """Log-probabilities of the token after `prompt` and the greedy continuation."""
    model = _core.Model(str(path), n_threads=1, n_ctx=n_ctx)
    logits = model.eval_last(prompt)
    first = logits - logits.max()
    first = first - np.log(np.exp(first).sum())
    out = [int(logits.argmax())]
    while len(out) < N_GREEDY:
        out.append(int(model.eval_last([out[-1]], reset=False).argmax()))
    return first, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer-bin", type=Path,
                        default=Path.home() / ".cache/ember-peer/llama.cpp/build/bin")
    args = parser.parse_args()
    server = str(args.peer_bin / "llama-server")
    work = Path(tempfile.mkdtemp(prefix="peer-nope-longrope-"))
    default_flags = [1, 1, 1, 0]
    cases = [("smollm3 rope [1,1,1,0] (llama.cpp's)", make_smollm3(default_flags), [24]),
             (f"smollm3 rope {NOPE_FLAGS} (ember only)", make_smollm3(NOPE_FLAGS), [24]),
             ("phi3 LongRoPE, original context 32", make_phi3_longrope(), [32]),
             ("phi3 LongRoPE, original context 256", make_phi3_longrope(original_ctx=256), [256, 512])]
    print(f"{'case':40} {'n_ctx asked, run':>16} {'top-5 |dlogprob|':>17} {'same top-5':>10} "
          f"{'greedy equal':>13}")
    for i, (name, hf, contexts) in enumerate(cases):
        folder = save_checkpoint(hf, work / f"hf{i}")
        path = convert(folder, work / f"m{i}.gguf", "f32", progress=False).path
        for n_ctx in contexts:
            prompt = tokens_for_test(min(n_ctx, 100) - N_GREEDY - 4, seed=3)
            peer, peer_ctx = peer_completion(server, path, n_ctx, prompt)
            ours, greedy = ember_run(path, peer_ctx, prompt)  # the same choice of factors
            top = peer["completion_probabilities"][0]["top_logprobs"]
            ids = [t["id"] for t in top]
            diff = max(abs(t["logprob"] - float(ours[t["id"]])) for t in top)
            same_top = ids == np.argsort(-ours)[:5].tolist()
            # The token ids themselves: completion_probabilities leaves out a token whose text is
            # an incomplete UTF-8 sequence (a byte token).
            peer_greedy = peer["tokens"]
            n_equal = sum(a == b for a, b in zip(greedy, peer_greedy))
            print(f"{name:40} {n_ctx:>9}, {peer_ctx:>4} {diff:17.2e} {str(same_top):>10} "
                  f"{n_equal:>6}/{N_GREEDY}")


if __name__ == "__main__":
    main()
