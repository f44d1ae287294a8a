#!/bin/bash
# Before/after of a fabric progress change, in one run on one host: fabric_bench (ferry's bulk
# path against plain libfabric loops) and fabric chaos (regroup times, CPU seconds), each binary
# pair interleaved. DIR holds fabric_bench_{before,after} and ferry_{before,after}; LIBS the
# libraries the host lacks (bench/carry.sh's folder).
# fabric_progress_ab.sh DIR LIBS OUT
set -u
dir=$(realpath "$1")
export LD_LIBRARY_PATH=$(realpath "$2")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=$3
mkdir -p "$out"
export FERRY_SECRET=0123456789abcdef0123456789abcdef FI_TCP_IFACE=lo NCCL_NVLS_ENABLE=0 IPATH_NO_BACKTRACE=1
echo "host: $(nproc) cores"
for round in ${ROUNDS:-1 2}; do
  for which in before after; do
    echo "== fabric_bench $which (round $round)"
    "$dir/fabric_bench_$which" --reps 5 --bytes-mib 512 --providers 'tcp;ofi_rxm,shm' --sizes-mib 1,4,16,64 2>&1 |
      grep -E "^(provider|tcp|shm)"
  done
done
for seed in 7 11 23; do
  for which in before after; do
    /usr/bin/time -f "$which seed $seed: %e s wall, %U s user, %S s sys" -o "$out/time_${which}_$seed" \
      timeout 300 "$dir/ferry_$which" chaos --versions 20 --kill-rate 0.8 --transport fabric \
      --fabric-provider 'tcp;ofi_rxm' --seed "$seed" --json > "$out/chaos_${which}_$seed.json" 2> "$out/chaos_${which}_$seed.err"
    cat "$out/time_${which}_$seed"
    python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
print({k: r[k] for k in ('verified', 'regroups', 'regroup_ms_median', 'regroup_ms_max', 'update_seconds_max')})" \
      "$out/chaos_${which}_$seed.json"
  done
done
