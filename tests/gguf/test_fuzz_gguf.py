"""Fuzz the GGUF reader with mutated real files for a bounded time.

The loop runs in a child process so that a crash (a signal) shows up as a failed test with the
seed to reproduce it, instead of taking pytest down. Each mutated file must either load — and
then every metadata value and tensor must be readable — or raise ember.GGUFError.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

FUZZ_LOOP = r'''
import os, random, struct, sys, tempfile, time
import ember
from gguf_builder import small_model

seed, seconds = int(sys.argv[1]), float(sys.argv[2])
rng = random.Random(seed)
seeds = [open(p, "rb").read() for p in sys.argv[3:]] + [small_model().data]
INTERESTING = [0, 1, 2, 3, 4, 7, 8, 9, 12, 13, 31, 32, 255, 256, 2**31 - 1, 2**32 - 1, 2**32,
               2**62, 2**63 - 1, 2**63, 2**64 - 1]

def mutate(data: bytearray) -> bytearray:
    # Most of the structure sits in the first few KiB (header, metadata, directory).
    focus = rng.random() < 0.8
    for _ in range(rng.randint(1, 4)):
        hot = min(len(data), 16384) if focus else len(data)
        kind = rng.random()
        at = rng.randrange(max(1, hot - 8))
        if kind < 0.35:
            data[at] = rng.randrange(256)
        elif kind < 0.65:
            fmt = rng.choice(["<Q", "<I"])
            size = struct.calcsize(fmt)
            value = rng.choice(INTERESTING) % (1 << (8 * size))
            data[at:at + size] = struct.pack(fmt, value)
        elif kind < 0.8:
            del data[rng.randrange(len(data)):]
        elif kind < 0.9:
            del data[at:at + rng.randint(1, 64)]
        else:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        if not data:
            data = bytearray(b"G")
    return data

def exercise(f):
    md = f.metadata
    for t in f.tensors:
        raw = f.raw(t.name)
        assert raw.nbytes == t.n_bytes
        if raw.nbytes:
            int(raw[0]) + int(raw[-1])
        if t.n_elements <= 1 << 16:
            try:
                f.dequantize(t.name)
            except ember.UnsupportedError:
                pass
    return md

n = n_error = n_ok = 0
deadline = time.monotonic() + seconds
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "fuzz.gguf")
    while time.monotonic() < deadline:
        data = mutate(bytearray(rng.choice(seeds)))
        with open(path, "wb") as out:
            out.write(data)
        n += 1
        try:
            f = ember.GGUFFile(path)
        except ember.GGUFError as err:
            assert path in str(err), str(err)
            n_error += 1
            continue
        exercise(f)
        n_ok += 1
print(f"fuzz: seed {seed}: {n} files, {n_error} rejected with GGUFError, {n_ok} loaded")
'''


def test_fuzz_gguf_reader(stories_path):
    seconds = float(os.environ.get("EMBER_FUZZ_SECONDS", "15"))
    seed = int(os.environ.get("EMBER_FUZZ_SEED", str(time.time_ns() % 1_000_000_007)))
    tests_dir = Path(__file__).parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tests_dir)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    result = subprocess.run(
        [sys.executable, "-c", FUZZ_LOOP, str(seed), str(seconds), str(stories_path)],
        capture_output=True, text=True, env=env, timeout=seconds + 120)
    assert result.returncode == 0, (
        f"fuzzing crashed or failed (reproduce with EMBER_FUZZ_SEED={seed}), "
        f"exit {result.returncode}:\n{result.stdout}\n{result.stderr[-4000:]}")
    line = result.stdout.strip().splitlines()[-1]
    n_files = int(line.split(": ")[2].split()[0])
    assert n_files >= 100, line
    print(line)
