#!/usr/bin/env python3
"""Generates cpp/tokenizer/unicode_tables.cpp from Python's unicodedata.

The tokenizers need, per code point: its general category group (the regex classes \\p{L},
\\p{N}, \\p{P}, \\p{S}, \\p{M}, \\p{Z}, \\p{C}), the White_Space property (\\s), its letter
case (\\p{Lu}/\\p{Lt} against \\p{Ll}, for the case-aware regexes), whether it is a decimal
digit (\\d) or a nonspacing mark (BERT accent stripping), a simple lower-case mapping and its
canonical decomposition with nonspacing marks removed. All of that comes from the Unicode
database that ships with this Python; the output names the Unicode version it was built from.

Usage: python scripts/gen_unicode_tables.py [-o cpp/tokenizer/unicode_tables.cpp]
"""

from __future__ import annotations

import argparse
import sys
import unicodedata
from pathlib import Path

MAX_CODEPOINT = 0x110000
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3  # decomposed algorithmically in unicode.cpp

# Bit values; must match CodepointFlags in cpp/tokenizer/unicode.h.
NUMBER = 1 << 0
LETTER = 1 << 1
SEPARATOR = 1 << 2
MARK = 1 << 3
PUNCTUATION = 1 << 4
SYMBOL = 1 << 5
CONTROL = 1 << 6  # Cc, Cf, Cs, Co and unassigned (Cn)
WHITESPACE = 1 << 7
NONSPACING_MARK = 1 << 8
UNASSIGNED = 1 << 9
UPPER = 1 << 10  # Lu, Lt: the cased letters that are not lower case
LOWER = 1 << 11  # Ll
DECIMAL = 1 << 12  # Nd: what \\d matches

GROUP_FLAG = {
    "L": LETTER,
    "N": NUMBER,
    "Z": SEPARATOR,
    "M": MARK,
    "P": PUNCTUATION,
    "S": SYMBOL,
    "C": CONTROL,
}

# The White_Space property (PropList.txt). unicodedata does not expose it; it is exactly the
# ASCII controls TAB..CR, NEL, and the Zs/Zl/Zp code points, which is checked below.
ASCII_WHITESPACE = {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x85}


def flags_of(cp: int) -> int:
    cat = unicodedata.category(chr(cp))
    flags = GROUP_FLAG[cat[0]]
    if cat == "Cn":
        flags |= UNASSIGNED
    if cat == "Mn":
        flags |= NONSPACING_MARK
    if cat in ("Lu", "Lt"):
        flags |= UPPER
    if cat == "Ll":
        flags |= LOWER
    if cat == "Nd":
        flags |= DECIMAL
    if cp in ASCII_WHITESPACE or cat in ("Zs", "Zl", "Zp"):
        flags |= WHITESPACE
    return flags


def category_runs() -> list[tuple[int, int]]:
    """(first code point, flags) for each maximal run of equal flags, covering 0..0x10FFFF."""
    runs: list[tuple[int, int]] = []
    for cp in range(MAX_CODEPOINT):
        f = flags_of(cp)
        if not runs or runs[-1][1] != f:
            runs.append((cp, f))
    return runs


def lowercase_runs() -> list[tuple[int, int, int, int]]:
    """(first, last, stride, delta): lower(cp) = cp + delta for first, first+stride, ..., last.

    Uses the first code point of str.lower() (the simple mapping for every code point but
    U+0130, whose full mapping appends a combining dot).
    """
    pairs = []
    for cp in range(MAX_CODEPOINT):
        low = chr(cp).lower()
        if low != chr(cp):
            pairs.append((cp, ord(low[0]) - cp))
    runs: list[list[int]] = []
    for cp, delta in pairs:
        if runs:
            first, last, stride, d = runs[-1]
            step = cp - last
            if d == delta and (step == stride or (first == last and step in (1, 2))):
                runs[-1] = [first, cp, step, d]
                continue
        runs.append([cp, cp, 1, delta])
    return [tuple(r) for r in runs]


def stripped_decomposition(cp: int) -> str:
    nfd = unicodedata.normalize("NFD", chr(cp))
    return "".join(c for c in nfd if unicodedata.category(c) != "Mn")


def accent_tables() -> tuple[list[tuple[int, int, int]], list[tuple[int, list[int]]]]:
    """Code points whose NFD form, minus nonspacing marks, is not the code point itself.

    Returns runs (first, last, base) where it is the single code point `base`, and the few
    exceptions (cp, [code points]) where it is empty or longer. Hangul syllables are left out.
    """
    runs: list[list[int]] = []
    special: list[tuple[int, list[int]]] = []
    for cp in range(MAX_CODEPOINT):
        if HANGUL_FIRST <= cp <= HANGUL_LAST or unicodedata.category(chr(cp)) == "Mn":
            continue  # Hangul: algorithmic; Mn: dropped by its flag
        s = stripped_decomposition(cp)
        if s == chr(cp):
            continue
        if len(s) == 1:
            base = ord(s)
            if runs and runs[-1][1] == cp - 1 and runs[-1][2] == base:
                runs[-1][1] = cp
            else:
                runs.append([cp, cp, base])
        else:
            special.append((cp, [ord(c) for c in s]))
    return [tuple(r) for r in runs], special


def check_whitespace() -> None:
    expected = {
        0x09,
        0x0A,
        0x0B,
        0x0C,
        0x0D,
        0x20,
        0x85,
        0xA0,
        0x1680,
        *range(0x2000, 0x200B),
        0x2028,
        0x2029,
        0x202F,
        0x205F,
        0x3000,
    }
    got = {cp for cp in range(MAX_CODEPOINT) if flags_of(cp) & WHITESPACE}
    if got != expected:
        sys.exit(
            f"White_Space derivation changed: extra {sorted(got - expected)}, "
            f"missing {sorted(expected - got)}"
        )


def emit_rows(items: list[str], per_line: int) -> str:
    lines = []
    for k in range(0, len(items), per_line):
        lines.append("    " + " ".join(items[k : k + per_line]))
    return "\n".join(lines)


def render() -> str:
    check_whitespace()
    cats = category_runs()
    lows = lowercase_runs()
    accent_runs, accent_special = accent_tables()
    max_special = max(len(v) for _, v in accent_special)
    if max_special > 3:
        sys.exit(
            f"an accent-stripped decomposition has {max_special} code points; AccentSpecial holds 3"
        )
    ascii_flags = [flags_of(cp) for cp in range(128)]

    out = []
    out.append(
        "// tokenizer/unicode_tables.cpp: GENERATED by scripts/gen_unicode_tables.py from Python "
        f"{sys.version_info.major}.{sys.version_info.minor}'s"
    )
    out.append(
        f"// unicodedata, Unicode {unicodedata.unidata_version}. Do not edit; re-run the script."
    )
    out.append(
        "// Flag bits are defined in tokenizer/unicode.h; the table shapes in tokenizer/unicode_tables.h."
    )
    out.append('#include "tokenizer/unicode_tables.h"')
    out.append("")
    out.append("namespace ember::unicode {")
    out.append("")
    out.append(f'const char* const k_unicode_version = "{unicodedata.unidata_version}";')
    out.append("")
    out.append("// flags of code points 0..127")
    out.append("const uint16_t k_ascii_flags[128] = {")
    out.append(emit_rows([f"{f}," for f in ascii_flags], 16))
    out.append("};")
    out.append("")
    out.append(f"// {len(cats)} runs covering U+0000..U+10FFFF; run k spans [first_k, first_k+1)")
    out.append(f"static const CategoryRun k_category_runs[{len(cats)}] = {{")
    out.append(emit_rows([f"{{0x{a:X}, {f}}}," for a, f in cats], 6))
    out.append("};")
    out.append("")
    out.append(f"static const LowercaseRun k_lowercase_runs[{len(lows)}] = {{")
    out.append(emit_rows([f"{{0x{a:X}, 0x{b:X}, {s}, {d}}}," for a, b, s, d in lows], 4))
    out.append("};")
    out.append("")
    out.append(f"static const AccentRun k_accent_runs[{len(accent_runs)}] = {{")
    out.append(emit_rows([f"{{0x{a:X}, 0x{b:X}, 0x{c:X}}}," for a, b, c in accent_runs], 4))
    out.append("};")
    out.append("")
    out.append(f"static const AccentSpecial k_accent_special[{len(accent_special)}] = {{")
    rows = []
    for cp, seq in accent_special:
        padded = seq + [0] * (3 - len(seq))
        rows.append(f"{{0x{cp:X}, {len(seq)}, {{{', '.join(f'0x{c:X}' for c in padded)}}}}},")
    out.append(emit_rows(rows, 3))
    out.append("};")
    out.append("")
    out.append("std::span<const CategoryRun> category_runs() { return k_category_runs; }")
    out.append("std::span<const LowercaseRun> lowercase_runs() { return k_lowercase_runs; }")
    out.append("std::span<const AccentRun> accent_runs() { return k_accent_runs; }")
    out.append("std::span<const AccentSpecial> accent_special() { return k_accent_special; }")
    out.append("")
    out.append("}  // namespace ember::unicode")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parent.parent / "cpp" / "tokenizer" / "unicode_tables.cpp"
    parser.add_argument("-o", "--output", type=Path, default=default)
    args = parser.parse_args()
    args.output.write_text(render(), encoding="utf-8")
    print(f"wrote {args.output} (Unicode {unicodedata.unidata_version})")


if __name__ == "__main__":
    main()
