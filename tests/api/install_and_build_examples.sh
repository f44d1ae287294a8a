#!/usr/bin/env bash
# Installs ferry into a fresh prefix, builds examples/ there as an outside project against the
# installed package (find_package(ferry CONFIG)), and runs each example.
# Usage: install_and_build_examples.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 source=$2
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
