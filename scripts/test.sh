#!/usr/bin/env bash
# The test command of the README and of CI: install, build, run every test, print ctest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh "$@"
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 300 -j"$(nproc)"
