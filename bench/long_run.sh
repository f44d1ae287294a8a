#!/bin/bash
# A long run under chaos stays flat: `ferry chaos --versions N --footprint` on tcp and on fabric
# tcp;ofi_rxm, every version verified, and each process alive at a tenth of the versions and at
# the last: resident memory and open files at both, and the largest growth of either.
# long_run.sh [FERRY] [VERSIONS] [SEED]   (defaults: build/cli/ferry, 1000, 5); each verdict goes to
# $OUT/long_run_TRANSPORT.json (OUT defaults to /tmp).
set -u
ferry=${1:-build/cli/ferry}
versions=${2:-1000}
seed=${3:-5}
export FERRY_SECRET=${FERRY_SECRET:-0123456789abcdef0123456789abcdef} FI_TCP_IFACE=lo
for transport in tcp fabric; do
  extra=()
  [ "$transport" = fabric ] && extra=(--fabric-provider 'tcp;ofi_rxm')
  echo "== $transport: ferry chaos --versions $versions --kill-rate 0.5 --seed $seed --footprint"
  start=$SECONDS
  "$ferry" chaos --versions "$versions" --kill-rate 0.5 --seed "$seed" \
    --transport "$transport" "${extra[@]}" --footprint --update-bound 60 --timeout 3600 --json 2>/dev/null |
    tee "${OUT:-/tmp}/long_run_$transport.json" | python3 "$(dirname "$0")/footprint_table.py"
  echo "$((SECONDS - start)) s of wall time"
done
