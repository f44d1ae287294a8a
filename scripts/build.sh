#!/usr/bin/env bash
# Installs the dependencies and configures + builds ferry into BUILD_DIR (default: build).
# Extra arguments go to CMake (e.g. -DFERRY_SANITIZE='address;undefined'); TARGETS (default: all)
# names the ninja targets to build.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
ninja -C "$build_dir" -j"$(nproc)" ${TARGETS:-}
