#!/bin/bash
# On the GPU host, from the repository root: environment checks, the GPU tests (the jobs of
# tests/gpu/CMakeLists.txt that this host's GPUs allow), then the GPU benchmark.
# gpu_run.sh BIN_DIR OUT_DIR [--quick] [--no-bench]
set -u
BIN=$1
OUT=$2
shift 2
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
mkdir -p "$OUT"
nvidia-smi -L
nvidia-smi topo -m | head -8
ldd "$BIN/ferry" | grep -E "not found|nccl|fabric|cuda|stdc" || true
echo "== cma_peak (plain process_vm_readv between two processes)"; "$BIN/cma_peak" 4
echo "== cuda_copy_engine_test"; "$BIN/cuda_copy_engine_test" 2>&1 | tail -6
echo "== nccl_broadcast_test"; timeout 180 "$BIN/nccl_broadcast_test" 2>&1 | tail -8
# job NAME GPUS WORKERS FLAGS...: one job of the GPU tests, skipped below GPUS visible GPUs.
job() {
  local name=$1 gpus=$2 workers=$3
  shift 3
  echo "== job_gpu_$name"
  timeout 300 python3 tests/gpu/run_if_gpus.py "$gpus" python3 tests/integration/check_job.py --workers "$workers" -- \
    "$BIN/ferry" local --gpus --instances 1 --workers "$workers" --model-bytes 3GiB --chunk-bytes 64MiB --depth 2 \
    --versions 2 --transport cma --json --timeout 150 "$@" 2>&1 | tail -12
}
job one_trainer_instance_of_three_k1 4 3 --trainers 1 --stripes 1 --p2p host
job one_trainer_instance_of_three_k3 4 3 --trainers 1 --stripes 3 --p2p host
job shared_host_copies_k3 4 3 --trainers 1 --stripes 3 --shared-host-copies --p2p host
job shared_host_copies_one_to_one 2 1 --trainers 1 --shared-host-copies --p2p host
job shared_host_copies_host_trainer_k2 2 2 --host-trainers --trainers 1 --stripes 2 --shared-host-copies
job sharded_tp_host_trainers 2 2 --host-trainers --trainers 2 --shard-rollout tp
job sharded_ep_host_trainers 2 2 --host-trainers --trainers 2 --shard-rollout ep
job device_direct_instance_of_three_k3 4 3 --trainers 1 --stripes 3
job device_direct_two_trainers_k2 4 2 --trainers 2 --stripes 2
echo "== ferry demo --gpu"
timeout 300 "$BIN/ferry" demo --gpu --model-bytes 2GiB 2>&1 | tail -8
case " $* " in *" --no-bench "*) exit 0 ;; esac
python3 bench/gpu_bench.py "$BIN" "$OUT" "$@"
