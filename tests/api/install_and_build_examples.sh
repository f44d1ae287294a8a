#!/usr/bin/env bash
# Installs ferry into a fresh prefix, builds examples/ there as an outside project against the
# installed package (find_package(ferry CONFIG)), and runs each example; with PYTHON, also the
# Python examples against the installed `ferry` package.
# Usage: install_and_build_examples.sh BUILD_DIR SOURCE_DIR [PYTHON]
set -euo pipefail
build=$1 source=$2 python=${3:-}
work=$(mktemp -d /tmp/ferry-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" --component Unspecified >/dev/null
echo "installed: $(cd "$work/prefix" && find . -type f -o -type l | sort | tr '\n' ' ')"
cmake -S "$source/examples" -B "$work/examples" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/examples" >/dev/null
cd "$work"
export IPATH_NO_BACKTRACE=1
"$work/examples/trainer_and_rollout" 3
"$work/examples/minimal"

[[ -z "$python" ]] && exit 0
export PYTHONPATH="$work/prefix/lib/python3/dist-packages"
"$python" "$source/examples/python/trainer.py" --rollouts 2 --versions 3 --address-file "$work/address" &
trainer=$!
for _ in $(seq 300); do [[ -s "$work/address" ]] && break; sleep 0.1; done
rollouts=()
for rank in 0 1; do
  "$python" "$source/examples/python/rollout.py" --coordinator "$(cat "$work/address")" --rank $rank --versions 3 &
  rollouts+=($!)
done
for pid in "${rollouts[@]}" "$trainer"; do wait "$pid"; done
echo "python examples: every version verified"
