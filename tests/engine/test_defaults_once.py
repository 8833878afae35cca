"""Each engine option's default is written once: in cpp/engine/engine_options.h (EngineOptions),
or for the context cap and the KV byte budget beside the code that applies them. Every other
place reads it (EngineOptions{}.x in C++; ember.EngineOptions / ember.options.DEFAULTS in
Python, flags and help texts included). This test reads the sources (cpp/ without the kernels,
python/) for lines that define or restate one of those defaults and fails on any line outside
its one definition."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_ASSIGN = r"[^=\n]*(?<![=!<>])=\s*"  # `name ... = value`, not ==, != ...
# (what, pattern): a line that gives an engine option its default, or says what the default is.
PATTERNS = [
    ("the context cap 4096", r"(ctx|context|max_model_len)[^\n]*\b4096\b|\bmost 4096\b"),
    ("the KV byte budget of 1 GiB", r"\b1 GiB\b|int64_t\{1\} << 30"),
    ("512 tokens per step",
     r"\b(max_batch_tokens|max_num_batched_tokens|n_batch)\b" + _ASSIGN + r"512\b|\bto 512\b"),
    ("16 requests at once, tokens per block, drafts",
     r"\b(parallel|max_num_seqs|block_size|draft_max)\b(\"\))?" + _ASSIGN + r"16\b"
     r"|\"--draft-max\"[^\n]*\]\s*=\s*16\b"),
    ("draft_min 1", r"\bdraft_min\b(\"\))?" + _ASSIGN + r"1\b"),
    ("the f16 KV cache", r"\bkv_type\b(\"\))?" + _ASSIGN + r"\"f16\""),
    ("no speculation", r"\bspec\b(\"\))?" + _ASSIGN + r"\"none\""),
    ("the disk cache's 2 GiB", r"int64_t\{2\} << 30|\b2 GiB\b"),
    ("an unbounded queue", r"\bmax_queue\b(\"\))?" + _ASSIGN + r"0\b"),
    ("prefix caching, batch invariance and adaptive drafting on",
     r"\b(prefix_caching|enable_prefix_caching|batch_invariant|rows_independent|spec_adaptive"
     r"|adaptive)\b(\"\))?" + _ASSIGN + r"(true|True)\b"),
]

# The one line allowed to write each default: (path, the line's text; runs of spaces count as one).
DEFINITIONS = {
    ("cpp/model/context.h", "static constexpr int64_t kDefaultMaxCtx = 4096;"),
    ("cpp/engine/model_engine.h", "inline constexpr int64_t kDefaultKVBytes = int64_t{1} << 30;"),
    ("cpp/engine/engine_options.h",
     "int64_t max_batch_tokens = 512;   // token budget of one step: rows of the largest batch"),
    ("cpp/engine/engine_options.h",
     "int parallel = 16;                // requests running at once (\"--parallel\")"),
    ("cpp/engine/engine_options.h", "int block_size = 16;              // tokens per KV block"),
    ("cpp/engine/engine_options.h",
     "int64_t cache_disk_bytes = int64_t{2} << 30;  // the files in cache_dir at most (2 GiB); the least"),
    ("cpp/engine/engine_options.h",
     "int draft_max = 16;                      // drafts per request and step at most"),
    ("cpp/engine/engine_options.h",
     "int draft_min = 1;                       // a request given fewer drafts than this gets none"),
    ("cpp/engine/engine_options.h",
     "std::string kv_type = \"f16\";      // KV cache rows: \"f16\", or \"q8_0\" (34 bytes per 32 values"),
    ("cpp/engine/engine_options.h", "std::string spec = \"none\";"),
    ("cpp/engine/engine_options.h",
     "int64_t max_queue = 0;            // requests waiting for one of the `parallel` slots at most;"),
    ("cpp/engine/engine_options.h",
     "bool prefix_caching = true;       // prompts with equal prefixes share their K/V (full blocks by"),
    ("cpp/engine/engine_options.h",
     "bool batch_invariant = true;      // a request's output never depends on what else runs (see"),
    ("cpp/engine/engine_options.h",
     "bool spec_adaptive = true;               // draft only as deep as the measured step cost says"),
    # Model.eval's micro-batch (ContextOptions::n_batch) is an option of its own, of the model.
    ("cpp/model/context.h",
     "int64_t n_batch = 512;  // rows per forward pass (bounds the scratch memory)"),
    # The KV layer sits below the engine and cannot read EngineOptions; the engine always sets it
    # (model_engine_config).
    ("cpp/kv/kv_cache_manager.h", "bool prefix_caching = true;"),
}


def _words(text: str) -> str:
    return " ".join(text.split())


_ALLOWED = {(rel, _words(text)) for rel, text in DEFINITIONS}


def sources(root: Path) -> list[Path]:
    """The C++ and Python sources that hold engine options: cpp/ but the kernels (cpu/, whose
    block sizes are formats', not options), and python/."""
    files = [p for p in (root / "cpp").rglob("*") if p.suffix in (".h", ".cpp")
             and "cpu" not in p.relative_to(root / "cpp").parts[:1]]
    files += [p for p in (root / "python").rglob("*") if p.suffix in (".py", ".cpp", ".h")]
    return sorted(files)


def restated_defaults(root: Path) -> list[str]:
    """`path:line: what: text` for each line that writes a default outside its definition."""
    found = []
    for path in sources(root):
        rel = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for what, pattern in PATTERNS:
                if re.search(pattern, line) and (rel, _words(line)) not in _ALLOWED:
                    found.append(f"{rel}:{number}: {what}: {line.strip()}")
    return found


def test_each_engine_default_is_written_once() -> None:
    assert restated_defaults(ROOT) == []


def test_every_definition_is_still_there() -> None:
    # A definition that moved would leave its whitelist entry behind and the pattern unguarded.
    missing = [(rel, text) for rel, text in DEFINITIONS
               if _words(text) not in [_words(line) for line in
                                       (ROOT / rel).read_text(encoding="utf-8").splitlines()]]
    assert missing == []
