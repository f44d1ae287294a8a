#!/usr/bin/env bash
# The test command of the README and of CI: install, build, run every test, print ctest's summary.
# Then the hardening phases (docs/hardening.md), each with its own summary: the frame fuzzer for
# FUZZ_SECONDS (default 45), and the protocol and transport tests under ASan+UBSan.
# SKIP_HARDENING=1 stops after the main run.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh "$@"
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure --timeout 300 -j"$(nproc)")
[[ "${SKIP_HARDENING:-0}" == 1 ]] && exit 0

# Both phases share one clang build (ASan+UBSan, build-fuzz): the library is built once.
echo "== hardening: frame fuzzer, ${FUZZ_SECONDS:-45} s (clang, ASan+UBSan) =="
mkdir -p build-fuzz
if ! ./scripts/fuzz.sh "${FUZZ_SECONDS:-45}" >build-fuzz/fuzz.log 2>&1; then
  tail -n 80 build-fuzz/fuzz.log
  echo "fuzz: FAILED (the crash input is in build-fuzz/artifacts/)"
  exit 1
fi
grep -E '^(ferry_fuzz_seeds|fuzz:|Done|stat::)' build-fuzz/fuzz.log
echo "fuzz: no crash"
echo "== hardening: protocol and transport tests under ASan+UBSan =="
BUILD_DIR=build-fuzz CXX=${FERRY_FUZZ_CXX:-clang++-16} ./scripts/sanitize.sh address 'protocol|transport'
