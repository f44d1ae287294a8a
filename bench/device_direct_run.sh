#!/bin/bash
# On a GPU host, from the repository root: device-direct's GPU tests (those this host's GPUs
# allow), a probe of the libfabric providers for FI_HMEM, then device_direct_bench.py.
# device_direct_run.sh BIN_DIR OUT_DIR [--no-bench | --bench-only [bench args...]]
# BIN_DIR is what bench/carry.sh made.
set -u
BIN=$(realpath "$1")
OUT=$2
mode=${3:-}
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo IPATH_NO_BACKTRACE=1 LD_LIBRARY_PATH=$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
gpus=$(nvidia-smi -L | grep -c '^GPU ')
if [ "$mode" != --bench-only ]; then
  nvidia-smi -L
  ldd "$BIN/ferry" | grep -E "not found|nccl|fabric|toml|stdc"
  echo "== libfabric: providers offering FI_RMA with FI_HMEM (GPUDirect RDMA), and the whole list"
  "$BIN/fi_info" -c "FI_RMA|FI_HMEM" -t FI_EP_RDM 2>&1 | grep -E "provider:|fabric:|No data" | sort | uniq -c
  "$BIN/fi_info" -l 2>&1 | head -30
  echo "== cuda_copy_engine_test"; "$BIN/cuda_copy_engine_test" 2>&1 | tail -4
  check() {
    local name=$1 workers=$2
    shift 2
    echo "== $name"
    timeout 300 python3 tests/integration/check_job.py --workers "$workers" --device-direct -- "$BIN/ferry" local \
      --instances 1 --workers "$workers" --model-bytes 3GiB --chunk-bytes 64MiB --depth 2 --versions 2 \
      --transport cma --json --timeout 150 "$@" 2>&1 | tail -4
  }
  check job_gpu_device_direct_same_gpu 1 --trainers 1 --gpu-list 0,0
  [ "$gpus" -ge 2 ] && check job_gpu_device_direct_one_to_one 1 --trainers 1 --gpus
  check job_gpu_device_direct_sharded_tp_same_gpu 2 --trainers 1 --gpu-list 0,0,0 --shard-rollout tp
  echo "== job_gpu_device_direct_faults"
  timeout 400 python3 tests/gpu/device_direct_faults.py "$BIN/ferry" 2>&1 | tail -6
  echo "== ferry demo --gpu"
  timeout 300 "$BIN/ferry" demo --gpu --model-bytes 2GiB 2>&1 | tail -7
fi
[ "$mode" = --no-bench ] && exit 0
[ "$mode" = --bench-only ] && shift 3 || shift 2
python3 bench/device_direct_bench.py "$BIN" "$OUT" "$@"
