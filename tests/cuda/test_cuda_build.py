"""A build with the CUDA backend, on any machine (CI builds it on one with no NVIDIA driver): the
module imports and runs on the CPU without the driver, `ember info --devices` says why CUDA is
missing, "auto" falls back to the CPU, and an explicit `--device cuda` is a clear error, never a
traceback. The driver's absence is forced with EMBER_CUDA_DRIVER (the library the backend checks
for before the CUDA runtime opens it), so these tests mean the same on a machine with a GPU.

They need a build with the CUDA backend (pip install . -C cmake.define.EMBER_CUDA=ON); on
another build they are skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ember import UnsupportedError, _core

NO_BACKEND = "cuda: this build has no CUDA backend"
if any(note.startswith(NO_BACKEND) for note in _core.devices()[1]):
    pytest.skip("this build has no CUDA backend (pip install . -C cmake.define.EMBER_CUDA=ON)",
                allow_module_level=True)

MISSING = "libcuda-missing.so.1"


def without_driver() -> dict[str, str]:
    return dict(os.environ, EMBER_CUDA_DRIVER=MISSING)


def test_no_driver_is_a_note_and_the_cpu_runs(stories_path: Path) -> None:
    code = ("from ember import _core; import json; devices, notes = _core.devices(); "
            "print(json.dumps([[d['device'] for d in devices], notes])); "
            f"m = _core.Model({str(stories_path)!r}, device='auto'); print(m.device); "
            "print(len(m.eval([1, 2, 3])))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=without_driver())
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith('[["cpu"') and f"cuda: no NVIDIA driver ({MISSING} not found)" in lines[0]
    assert lines[1] == "cpu" and int(lines[2]) == 3


def test_info_devices_says_why_cuda_is_missing() -> None:
    info = subprocess.run([sys.executable, "-m", "ember.cli", "info", "--devices"], capture_output=True,
                          text=True, timeout=120, env=without_driver())
    assert info.returncode == 0, info.stderr
    assert f"note: cuda: no NVIDIA driver ({MISSING} not found)" in info.stdout


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_an_explicit_cuda_device_without_a_driver_is_a_clear_error(stories_path: Path,
                                                                    device: str) -> None:
    command = [sys.executable, "-m", "ember.cli", "run", str(stories_path), "-p", "Once", "-n", "2",
               "--device", device]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, env=without_driver())
    assert run.returncode != 0 and f"cuda: no NVIDIA driver ({MISSING} not found)" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_malformed_device_name_lists_cuda() -> None:
    expected = r"expected auto, cpu, cuda, cuda:N, vulkan or vulkan:N \(available: cpu, cuda"
    with pytest.raises(UnsupportedError, match=expected):
        _core.Model("unused.gguf", device="cuda:x")
