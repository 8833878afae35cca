"""GGUF files from the Hugging Face Hub: `hf://USER/REPO[:QUANT]` and `hf://USER/REPO/path/file.gguf`.

huggingface_hub does the work: the repo listing (HfApi.model_info), the download with its
progress bar and its retries (a transfer that breaks resumes with a Range request), its cache
(~/.cache/huggingface/hub, or $HF_HOME / $HF_HUB_CACHE, shared with transformers and llama.cpp)
and its offline mode (HF_HUB_OFFLINE=1). This module decides which file a reference names, the
way llama.cpp's `-hf` does, and says in one line what is wrong when nothing fits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ember.hub.errors import ModelNotFound

HF_SCHEME = "hf://"

# The quantizations tried, in order, when a reference names none (llama.cpp's `-hf` order).
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")
# GGUF files in model repos that are not models (llama.cpp skips the same names).
SIDECAR_MARKS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
# Below this many bits per weight, a quantization is a last resort, not a default.
SENSIBLE_BITS = 4

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
_REF = re.compile(rf"^(?P<repo>{_NAME}/{_NAME})(?::(?P<quant>[A-Za-z0-9_.-]+)|/(?P<file>.+))?$")
_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Za-z0-9_]+)$")


@dataclass(frozen=True)
class HubRef:
    """What a user names: a repo, and a quantization or a file inside it (or neither)."""

    repo_id: str               # "USER/REPO"
    quant: str | None = None   # "Q4_K_M"; None with file None: the default pick
    file: str | None = None    # a path inside the repo, named outright

    def __str__(self) -> str:
        tail = f":{self.quant}" if self.quant else f"/{self.file}" if self.file else ""
        return f"{HF_SCHEME}{self.repo_id}{tail}"


def parse_ref(text: str) -> HubRef:
    """`USER/REPO`, `USER/REPO:QUANT` or `USER/REPO/path/file.gguf`, with or without hf://."""
    bare = text[len(HF_SCHEME):] if text.startswith(HF_SCHEME) else text
    m = _REF.match(bare)
    file = m["file"] if m else None
    if m is None or (file is not None and not _is_gguf(file)) or (file and ".." in file.split("/")):
        raise ModelNotFound(f"{text!r} is not a Hub model reference: write hf://USER/REPO, "
                            f"hf://USER/REPO:QUANT (e.g. :Q4_K_M) or hf://USER/REPO/path/file.gguf")
    return HubRef(m["repo"], m["quant"], file)


def looks_like_ref(text: str) -> bool:
    """Whether a model argument that is not a local file reads as USER/REPO[:QUANT] (a missing
    `dir/file.gguf` does not)."""
    try:
        ref = parse_ref(text)
    except ModelNotFound:
        return False
    return ref.file is None and not _is_gguf(ref.repo_id) and not text.startswith((".", "~"))


# --- which file a reference names ----------------------------------------------------------------

@dataclass(frozen=True)
class SplitInfo:
    prefix: str   # the path without `-0000i-of-0000n.gguf` (or `.gguf`)
    index: int    # 1-based; 1 for a single file
    count: int    # 1 for a single file


def _is_gguf(path: str) -> bool:
    return path.lower().endswith(".gguf")


def split_info(path: str) -> SplitInfo:
    prefix = path[:-len(".gguf")]
    m = _SPLIT.match(prefix)
    if m is None:
        return SplitInfo(prefix, 1, 1)
    return SplitInfo(m["prefix"], int(m["index"]), int(m["count"]))


def quant_tag(path: str) -> str | None:
    """The quantization a file name ends with: `Model-Q4_K_M.gguf` -> `Q4_K_M`."""
    m = _TAG.search(PurePosixPath(split_info(path).prefix).name)
    return m[1].upper() if m else None


def quant_bits(tag: str | None) -> int:
    """Bits per weight as the tag spells them: Q4_K_M -> 4, IQ2_XS -> 2, BF16 -> 16; 0: unknown."""
    m = re.search(r"\d+", tag or "")
    return int(m[0]) if m else 0


def is_model_file(path: str) -> bool:
    name = PurePosixPath(path).name.lower()
    return _is_gguf(name) and not any(mark in name for mark in SIDECAR_MARKS)


def names_quant(path: str, quant: str) -> bool:
    """`quant` appears in the path as a whole name part, in any case: Q4_K_M matches
    `m-q4_k_m.gguf` and `Q4_K_M/m-Q4_K_M-00001-of-00002.gguf`; F16 does not match `m-BF16.gguf`."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(quant)}[.-]", path, re.IGNORECASE) is not None


def _sensible_first(path: str) -> tuple[int, int, str]:
    """Fallback order: the fewest bits at or above SENSIBLE_BITS, then the most bits below."""
    bits = quant_bits(quant_tag(path))
    return (0, bits, path) if bits >= SENSIBLE_BITS else (1, -bits, path)


def pick_file(files: list[str], quant: str | None) -> str | None:
    """The model file for `quant` among a repo's files (the first part of a split one): the
    first match by name; with no quant, Q4_K_M, else Q8_0, else the smallest sensible one."""
    models = sorted(f for f in files if is_model_file(f) and split_info(f).index == 1)
    for wanted in (quant,) if quant else DEFAULT_QUANTS:
        for f in models:
            if names_quant(f, wanted):
                return f
    if quant or not models:
        return None
    return min(models, key=_sensible_first)


def split_parts(files: list[str], path: str) -> list[str]:
    """All parts of the (possibly split) GGUF `path` belongs to, in order."""
    info = split_info(path)
    if info.count == 1:
        return [path]
    parts = sorted((f for f in files if _is_gguf(f) and split_info(f).prefix == info.prefix
                    and split_info(f).count == info.count), key=lambda f: split_info(f).index)
    if [split_info(f).index for f in parts] != list(range(1, info.count + 1)):
        raise ModelNotFound(f"{path} is part of a GGUF split into {info.count} files, but only "
                            f"{len(parts)} of them are there")
    return parts


def available(files: list[str]) -> str:
    """The model files of a listing, by quantization where the names say it: `Q4_K_M, Q8_0`."""
    firsts = sorted(f for f in files if is_model_file(f) and split_info(f).index == 1)
    names = {quant_tag(f) or f for f in firsts}
    return ", ".join(sorted(names, key=lambda n: (quant_bits(n) or 99, n))) or "none"


def choose(ref: HubRef, files: list[str]) -> list[str]:
    """The file(s) `ref` names in a repo listing (several for a split GGUF), or ModelNotFound."""
    if ref.file is not None:
        if ref.file not in files:
            raise ModelNotFound(f"{ref}: the repo has no file {ref.file} (its GGUF files: "
                                f"{', '.join(sorted(f for f in files if _is_gguf(f))) or 'none'})")
        return split_parts(files, ref.file)
    if not any(is_model_file(f) for f in files):
        shown = ", ".join(sorted(files)[:6]) + (", ..." if len(files) > 6 else "")
        raise ModelNotFound(f"{ref} has no GGUF model file (it holds {len(files)} files: {shown}); "
                            f"`ember convert {ref.repo_id} -o model.gguf` converts a Hugging Face "
                            f"checkpoint")
    picked = pick_file(files, ref.quant)
    if picked is None:
        raise ModelNotFound(f"{ref}: no {ref.quant} file in the repo; it has {available(files)} "
                            f"(ask for one with hf://{ref.repo_id}:QUANT)")
    return split_parts(files, picked)


# --- the listing, online or from the cache -------------------------------------------------------

@dataclass(frozen=True)
class Listing:
    files: list[str]                # paths inside the repo
    offline: str | None = None      # None: listed by the Hub; else why it came from the cache
    fix: str = ""                   # what to do when the cache does not have what is asked


def list_repo(repo_id: str) -> Listing:
    """The repo's files from the Hub; if the Hub cannot be reached (or HF_HUB_OFFLINE is set),
    the files of its cached `main` snapshot."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import OfflineModeIsEnabled

    try:
        info = HfApi().model_info(repo_id)
    except OfflineModeIsEnabled:
        return Listing(cached_files(repo_id), "offline mode is on (HF_HUB_OFFLINE=1)",
                       "unset HF_HUB_OFFLINE to download it")
    except Exception as err:  # noqa: BLE001 - no network, proxy, Hub down: the cache may serve
        refused = refusal(err, repo_id, f"{HF_SCHEME}{repo_id}")
        if refused is not None:
            raise ModelNotFound(refused) from None
        return Listing(cached_files(repo_id), f"the Hub cannot be reached ({_one_line(err)})",
                       "check the network (and HF_ENDPOINT or proxy settings) and try again")
    return Listing([s.rfilename for s in info.siblings or []])


def refusal(err: Exception, repo_id: str, shown: str) -> str | None:
    """The message for a repo the Hub refuses (gated, missing, or private), naming it `shown`;
    None for other errors. The converter says the same."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if isinstance(err, GatedRepoError):
        return (f"{shown} is gated on the Hugging Face Hub: accept its terms on "
                f"huggingface.co/{repo_id} and log in (`hf auth login`, or set HF_TOKEN)")
    if isinstance(err, RepositoryNotFoundError):
        return (f"{shown}: no such model repo on the Hugging Face Hub (a private one needs "
                f"`hf auth login` or HF_TOKEN)")
    return None


def cached_files(repo_id: str) -> list[str]:
    """The files of repo_id's `main` snapshot in huggingface_hub's cache (empty if none)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir()
    except CacheNotFound:
        return []
    for repo in cache.repos:
        if repo.repo_id == repo_id and repo.repo_type == "model":
            for revision in repo.revisions:
                if "main" in revision.refs:
                    return sorted(f.file_path.relative_to(revision.snapshot_path).as_posix()
                                  for f in revision.files)
    return []


def _one_line(err: Exception) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first[:200]}"


def _not_cached(ref: HubRef, listing: Listing) -> ModelNotFound:
    from huggingface_hub import constants

    cached = f"; cached from this repo: {available(listing.files)}" if listing.files else ""
    return ModelNotFound(f"{ref} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and "
                         f"{listing.offline}: {listing.fix}{cached}")


# --- fetching -------------------------------------------------------------------------------------

def fetch(ref: HubRef) -> list[Path]:
    """The local paths of the file(s) `ref` names, downloaded into the cache when missing (all
    parts of a split GGUF, in order: the loader opens the model from any of them)."""
    listing = list_repo(ref.repo_id)
    try:
        names = choose(ref, listing.files)
    except ModelNotFound:
        if listing.offline is not None:
            raise _not_cached(ref, listing) from None
        raise
    return [_download(ref, name, listing) for name in names]


def _download(ref: HubRef, name: str, listing: Listing) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(ref.repo_id, name, local_files_only=listing.offline is not None))
    except Exception as err:  # noqa: BLE001 - network errors differ by huggingface_hub version
        if listing.offline is not None:
            raise _not_cached(ref, listing) from None
        refused = refusal(err, ref.repo_id, str(ref))  # a gated repo lists, but does not serve
        if refused is not None:
            raise ModelNotFound(refused) from None
        raise ModelNotFound(f"downloading {name} from hf://{ref.repo_id} failed ({_one_line(err)}); "
                            f"run the command again to retry") from None
