#!/bin/bash
# A long run under chaos stays flat: `ferry chaos --versions N --footprint` on tcp and on fabric
# tcp;ofi_rxm, every version verified, and each process alive at a tenth of the versions and at
# the last: resident memory and open files at both, and the largest growth of either.
# long_run.sh [FERRY] [VERSIONS] [SEED]   (defaults: build/cli/ferry, 1000, 5)
set -u
ferry=${1:-build/cli/ferry}
versions=${2:-1000}
seed=${3:-5}
export FERRY_SECRET=${FERRY_SECRET:-0123456789abcdef0123456789abcdef} FI_TCP_IFACE=lo
for transport in tcp fabric; do
  extra=()
  [ "$transport" = fabric ] && extra=(--fabric-provider 'tcp;ofi_rxm')
  echo "== $transport: ferry chaos --versions $versions --kill-rate 0.5 --seed $seed --footprint"
  /usr/bin/time -f "%e s wall" "$ferry" chaos --versions "$versions" --kill-rate 0.5 --seed "$seed" \
    --transport "$transport" "${extra[@]}" --footprint --update-bound 60 --timeout 3600 --json 2>/dev/null |
    python3 -c '
import json, sys
r = json.loads(sys.stdin.readline())
f = r.get("footprint", {})
print(f"verified {r[\"verified\"]}, {r[\"versions\"]} versions, {r[\"kills\"]} kills, {r[\"regroups\"]} regroups, "
      f"regroup median {r[\"regroup_ms_median\"]:.1f} ms, worst {r[\"regroup_ms_max\"]:.1f} ms")
print("| process | RSS KiB first | last | open files first | last |")
print("| --- | --- | --- | --- | --- |")
for p in f.get("processes", []):
    print(f"| {p[\"process\"]} | {p[\"rss_kib\"][0]} | {p[\"rss_kib\"][1]} | {p[\"fds\"][0]} | {p[\"fds\"][1]} |")
print(f"largest growth: RSS {100 * f.get(\"rss_growth_max\", 0):.2f}%, open files {100 * f.get(\"fds_growth_max\", 0):.2f}%")'
done
