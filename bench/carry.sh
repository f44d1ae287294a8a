#!/bin/bash
# Makes the folder a device call carries to a GPU host (run's `carry`): the binaries of BUILD_DIR
# and libferry.so, stripped, and what that host lacks (toml++, Boost.Fiber; Debian's fi_info for
# probing libfabric; DLPack's header for building the Python module there).
# carry.sh [BUILD_DIR] [OUT_DIR]   (defaults: build, .device-build/carry)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-.device-build/carry}
rm -rf "$out"
mkdir -p "$out"
for b in cli/ferry bench/ferry_gpu_bench bench/ferry_api_bench tests/gpu/cuda_copy_engine_test tests/gpu/nccl_broadcast_test; do
  strip -o "$out/$(basename "$b")" "$build/$b"
done
strip -o "$out/libferry.so.0" "$build/api/libferry.so.0"
cp -L /usr/lib/x86_64-linux-gnu/libtomlplusplus.so.3 /usr/lib/x86_64-linux-gnu/libboost_fiber.so.1.74.0 \
  /usr/lib/x86_64-linux-gnu/libboost_context.so.1.74.0 /usr/bin/fi_info "$out/"
mkdir -p "$out/include/dlpack"
cp /usr/include/dlpack/dlpack.h "$out/include/dlpack/"
du -sh "$out"
