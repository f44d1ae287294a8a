#!/usr/bin/env bash
# Builds ferry with sanitizers and runs its tests there:
#   scripts/sanitize.sh address [LABELS]   ASan + UBSan (build-asan); every test unless LABELS
#   scripts/sanitize.sh thread  [LABELS]   TSan (build-tsan); LABELS default
#                                          'runtime|protocol|transport|fabric'
# LABELS is a ctest label regex; with one, only the test folders that hold such tests are built
# (tests/runtime, tests/transport, tests/hostile; with actors, collectives or virtual in LABELS,
# tests/actors, tests/collectives and tests/jobs too; with api, tests/api), so tests labelled
# `integration` (they run the ferry binary, which is not built then) are left out. BUILD_DIR and
# CXX override the build folder and the compiler. docs/hardening.md explains the sanitizer options below.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
labels=${2:-}
case "$mode" in
  address) sanitizers='address;undefined'; build_dir=${BUILD_DIR:-build-asan} ;;
  thread) sanitizers='thread'; build_dir=${BUILD_DIR:-build-tsan}; labels=${labels:-runtime|protocol|transport|fabric} ;;
  *) echo "usage: $0 address|thread [ctest label regex]" >&2; exit 2 ;;
esac

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_SANITIZE="$sanitizers" \
  -DFERRY_CUDA=OFF ${CXX:+-DCMAKE_CXX_COMPILER="$CXX"} >/dev/null
if [[ -n "$labels" ]]; then
  folders=(tests/runtime/all tests/transport/all tests/hostile/all)
  # The actors' and collectives' tests (in-process jobs, virtual time) only when asked for.
  [[ "$labels" =~ actors|collectives|virtual ]] && folders+=(tests/actors/all tests/collectives/all tests/jobs/all)
  [[ "$labels" =~ api ]] && folders+=(tests/api/all)
  ninja -C "$build_dir" -j"${BUILD_JOBS:-$(nproc)}" "${folders[@]}"
else
  ninja -C "$build_dir" -j"${BUILD_JOBS:-$(nproc)}"
fi

# Boost.Fiber switches stacks without telling the sanitizers (Debian's Boost.Context is built
# without its ASan/TSan hooks): ASan's fake stacks for use-after-return would be freed under a
# suspended fiber, so that one check is off; every other ASan/UBSan check stays on and aborts.
# libfabric loads psm's libinfinipath, whose signal handlers would swallow a sanitizer's report.
export IPATH_NO_BACKTRACE=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_stack_use_after_return=0:detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
cd "$build_dir"
ctest --output-on-failure --timeout 600 -j"$(nproc)" ${labels:+-L "$labels" -LE integration}
