#!/usr/bin/env bash
# Checks that every C and C++ source git tracks is laid out as clang-format (the root
# .clang-format) lays it out. Mend a failure with: clang-format -i FILE...
#   scripts/check_format.sh [ROOT]    exit 0 when clean; else the first differences, exit 1
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
if ! command -v clang-format >/dev/null; then
  echo "check_format: clang-format is missing (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.c' '*.cpp' '*.h' '*.hpp')
report=$(clang-format --dry-run --Werror "${files[@]}" 2>&1) && exit 0
errors=$(grep -E ': error:' <<<"$report" || true)
head -20 <<<"$errors"
echo "check_format: $(wc -l <<<"$errors") place(s) in $(cut -d: -f1 <<<"$errors" | sort -u | wc -l) file(s)" \
  "differ from clang-format's layout"
exit 1
