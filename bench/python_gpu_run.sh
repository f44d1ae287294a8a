#!/bin/bash
# On a GPU host, from the repository root: builds the Python module there (its python3, torch's
# pybind11) against the carried libferry.so, then runs the Python tests (their GPU ones included)
# and the verl job on CUDA tensors, with and without global_steps.
# python_gpu_run.sh BIN_DIR OUT_DIR   (BIN_DIR: what bench/carry.sh made)
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
exit $status
