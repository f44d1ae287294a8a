#!/usr/bin/env bash
# The README's first command: install, build, and run ferry's main job on its embedded default
# (the in-process demo). Arguments go to `ferry demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=ferry_cli ./scripts/build.sh >/dev/null  # the demo needs only the ferry command
exec "${BUILD_DIR:-build}/cli/ferry" demo "$@"
