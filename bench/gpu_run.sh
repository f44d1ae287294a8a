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
echo "== cuda_copy_engine_test"; "$BIN/cuda_copy_engine_test" 2>&1 | tail -6
echo "== nccl_broadcast_test"; timeout 180 "$BIN/nccl_broadcast_test" 2>&1 | tail -8
echo "== job_gpu_one_trainer_instance_of_three"
timeout 300 python3 tests/gpu/run_if_gpus.py 4 python3 tests/integration/check_job.py --workers 3 -- \
  "$BIN/ferry" local --gpus --trainers 1 --instances 1 --workers 3 --model-bytes 3GiB --chunk-bytes 64MiB \
  --depth 2 --versions 2 --transport tcp --json --timeout 150 2>&1 | tail -20
case " $* " in *" --no-bench "*) exit 0 ;; esac
python3 bench/gpu_bench.py "$BIN" "$OUT" "$@"
