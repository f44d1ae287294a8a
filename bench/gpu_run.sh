#!/bin/bash
# On the GPU host, from the repository root: environment checks, the GPU tests, then the GPU
# benchmark. gpu_run.sh BIN_DIR OUT_DIR [--quick] [--no-bench]
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
for k in 1 3; do
  echo "== job_gpu_one_trainer_instance_of_three_k$k"
  timeout 300 python3 tests/gpu/run_if_gpus.py 4 python3 tests/integration/check_job.py --workers 3 -- \
    "$BIN/ferry" local --gpus --trainers 1 --instances 1 --workers 3 --stripes $k --model-bytes 3GiB \
    --chunk-bytes 64MiB --depth 2 --versions 2 --transport cma --json --timeout 150 2>&1 | tail -12
done
echo "== ferry demo --gpu"
timeout 300 "$BIN/ferry" demo --gpu --model-bytes 2GiB 2>&1 | tail -8
case " $* " in *" --no-bench "*) exit 0 ;; esac
python3 bench/gpu_bench.py "$BIN" "$OUT" "$@"
