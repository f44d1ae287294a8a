#!/bin/bash
# Makes the folder a device call carries to a GPU host (run's `carry`): the binaries of BUILD_DIR,
# stripped, and the libraries that host lacks (toml++; Debian's fi_info for probing libfabric).
# carry.sh [BUILD_DIR] [OUT_DIR]   (defaults: build, .device-build/carry)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-.device-build/carry}
rm -rf "$out"
mkdir -p "$out"
for b in cli/ferry bench/ferry_gpu_bench tests/gpu/cuda_copy_engine_test tests/gpu/nccl_broadcast_test; do
  strip -o "$out/$(basename "$b")" "$build/$b"
done
cp -L /usr/lib/x86_64-linux-gnu/libtomlplusplus.so.3 /usr/bin/fi_info "$out/"
du -sh "$out"
