"""Where a checkpoint comes from: a local folder, or a Hugging Face Hub repo id downloaded with
huggingface_hub.snapshot_download (only the files the converter reads)."""

from __future__ import annotations

import re
from pathlib import Path

from .errors import ConvertError

# What the converter reads from a repo: config, tokenizer, chat template, safetensors weights.
HUB_PATTERNS = [
    "config.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
    "chat_template.jinja",
    "model.safetensors.index.json",
    "model*.safetensors",  # not consolidated.safetensors, Mistral's copy in its own layout
]

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def looks_like_repo_id(src: str) -> bool:
    return bool(_REPO_ID.match(src)) and not src.startswith((".", "/", "~"))


def resolve_source(src: str, revision: str | None = None) -> Path:
    """A model folder for SRC: the folder itself, or the hub snapshot of repo id SRC."""
    path = Path(src).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConvertError(f"{path} has no config.json; is it a Hugging Face model folder?")
        return path
    if path.exists():
        raise ConvertError(f"{path} is a file; give a Hugging Face model folder or a hub repo "
                           f"id like Qwen/Qwen2.5-0.5B-Instruct")
    if not looks_like_repo_id(src):
        raise ConvertError(f"{src}: no such folder, and not a Hugging Face repo id (owner/name)")
    return _download(src, revision)


def _download(repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from ember.hub.hf import refusal

    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS)
    except RepositoryNotFoundError as err:  # also gated repos
        raise ConvertError(refusal(err, repo_id, repo_id)) from None
    except RevisionNotFoundError:
        raise ConvertError(f"{repo_id}: revision {revision!r} not found on the Hugging Face "
                           f"Hub") from None
    except LocalEntryNotFoundError as err:
        reason = str(err).strip().splitlines()[0]
        raise ConvertError(f"cannot download {repo_id}: the Hugging Face Hub is unreachable "
                           f"(offline, or HF_HUB_OFFLINE is set) and the repo is not in the "
                           f"local cache ({reason}); download it on a connected machine and "
                           f"pass its folder instead") from None
    except OSError as err:
        raise ConvertError(f"cannot download {repo_id} from the Hugging Face Hub: {err}") from None
    return Path(folder)
