#!/bin/bash
# On a GPU host, from the repository root: builds the Python module there (its python3, torch's
# pybind11) against the carried libferry.so, then runs the Python tests (their GPU ones included)
# and the verl job on CUDA tensors, with and without global_steps; then the benches: the verl
# backend against the C++ API (python_bench.py) and against verl's nccl-backend logic, or on one
# GPU against a D2H+H2D of the same bytes (verl_peer_bench.py).
# python_gpu_run.sh BIN_DIR OUT_DIR [--no-bench]   (BIN_DIR: what bench/carry.sh made)
set -u
BIN=$(realpath "$1")
OUT=$2
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo IPATH_NO_BACKTRACE=1 LD_LIBRARY_PATH=$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
module=$(mktemp -d)
scripts/build_python_module.sh "$BIN" "$module" "$BIN/include" || exit 1
export PYTHONPATH=$module
gpus=$(nvidia-smi -L | grep -c '^GPU ')
replica=$([ "$gpus" -ge 2 ] && echo 2 || echo 1)  # NCCL takes one rank of a replica per GPU
status=0
echo "== pytest (the module and the verl backend)"
python3 -m pytest -q -p no:cacheprovider -rs tests/python/test_module.py tests/python/test_verl_backend.py || status=1
for steps in "" --without-global-steps; do
  echo "== verl_job.py --device cuda --replica-size $replica $steps"
  timeout 300 python3 tests/python/verl_job.py --device cuda --replica-size "$replica" $steps || status=1
done
[ "${3:-}" = --no-bench ] && exit $status
echo "== python_bench.py"
FERRY_LOG=error python3 bench/python_bench.py --api-bench "$BIN/ferry_api_bench" --rounds 3 --versions 9 \
  --out "$OUT/python_bench.md" || status=1
echo "== verl_peer_bench.py"
python3 bench/verl_peer_bench.py "$OUT" --model-gib 16 --rounds 2 --syncs 3 || status=1
exit $status
