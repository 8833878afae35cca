#!/usr/bin/env bash
# scripts/lint.sh: the style checks CI runs — ruff over the Python, clang-format (.clang-format at
# the root) over the tracked C/C++ files. Exits non-zero on any finding and prints the fix command.
# scripts/lint.sh --fix applies what both tools can fix. Generated files
# (cpp/tokenizer/unicode_tables.cpp) and test data are not checked.
set -uo pipefail
cd "$(dirname "$0")/.."

fix=0
[[ "${1:-}" == "--fix" ]] && fix=1

for tool in ruff clang-format; do
  if ! command -v "$tool" >/dev/null; then
    echo "lint: $tool is not installed (ruff: pip install ruff; clang-format: apt-get install clang-format)" >&2
    exit 2
  fi
done

mapfile -t cxx_files < <(git ls-files '*.c' '*.cc' '*.cpp' '*.cxx' '*.h' '*.hpp' '*.cu' '*.cuh' '*.mm' |
                         grep -v -e '^tests/data/' -e '^cpp/tokenizer/unicode_tables\.cpp$')

if ((fix)); then
  ruff check --fix .
  clang-format -i "${cxx_files[@]}"
  exit 0
fi

status=0
ruff check . || status=1
clang-format --dry-run --Werror "${cxx_files[@]}" || status=1
if ((status)); then
  echo "lint: findings above; fix with: scripts/lint.sh --fix (then fix by hand what ruff cannot)" >&2
fi
exit $status
