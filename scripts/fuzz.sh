#!/usr/bin/env bash
# Fuzzes ferry's control-frame decoding with libFuzzer for SECONDS (default 60):
#   scripts/fuzz.sh [SECONDS] [extra libFuzzer flags...]
# Configures a clang build (BUILD_DIR, default build-fuzz) with FERRY_FUZZ=ON and
# ASan+UBSan, builds the fuzz target and the seed generator, writes one valid frame per message
# kind into the corpus (CORPUS, default BUILD_DIR/corpus, kept between runs so a long run goes
# on from what earlier runs found), then fuzzes with JOBS workers (default 1). Crash inputs land
# in BUILD_DIR/artifacts/; the exit code is non-zero when one was found.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
build_dir=${BUILD_DIR:-build-fuzz}
corpus=${CORPUS:-$build_dir/corpus}
jobs=${JOBS:-1}
clang=${FERRY_FUZZ_CXX:-clang++-16}
if ! command -v "$clang" >/dev/null; then
  echo "fuzz: $clang not found (scripts/install-deps.sh installs clang-16)" >&2
  exit 2
fi

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$clang" \
  -DFERRY_FUZZ=ON -DFERRY_SANITIZE='address;undefined' -DFERRY_CUDA=OFF >/dev/null
ninja -C "$build_dir" -j"${BUILD_JOBS:-$(nproc)}" ferry_fuzz_frame ferry_fuzz_seeds
"$build_dir/tests/fuzz/ferry_fuzz_seeds" "$corpus"
mkdir -p "$build_dir/artifacts"

# Same sanitizer settings as scripts/sanitize.sh (docs/hardening.md). libfabric loads psm's
# libinfinipath, whose signal handlers would turn a sanitizer's crash report into a bare exit().
export IPATH_NO_BACKTRACE=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=0}
symbolizer=$(command -v llvm-symbolizer-16 || command -v llvm-symbolizer || true)
[[ -n "$symbolizer" ]] && export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$symbolizer}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
parallel=()
# libFuzzer writes each job's log to fuzz-N.log when jobs > 1.
((jobs > 1)) && parallel=(-jobs="$jobs" -workers="$jobs")
echo "fuzz: ${seconds}s, corpus $corpus"
"$build_dir/tests/fuzz/ferry_fuzz_frame" "$corpus" -max_total_time="$seconds" -max_len=65536 \
  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build_dir/artifacts/" \
  ${parallel[@]+"${parallel[@]}"} "$@"
