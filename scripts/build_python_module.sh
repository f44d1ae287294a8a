#!/usr/bin/env bash
# Builds the `ferry` Python module for this host's python3 against a libferry.so built elsewhere:
# for a host without ferry's build dependencies (the GPU host: Python 3.12, torch from pip, whose
# headers include pybind11). CMake builds the module everywhere else.
# Usage: scripts/build_python_module.sh LIBFERRY_DIR OUT_DIR [DLPACK_INCLUDE_DIR]
#   then PYTHONPATH=OUT_DIR python3 -c 'import ferry'
set -euo pipefail
cd "$(dirname "$0")/.."
lib=$(realpath "$1") out=$2 dlpack=${3:-/usr/include}
python=${PYTHON:-python3}
includes=$("$python" - <<'PY'
import sysconfig
paths = [sysconfig.get_paths()["include"]]
try:
    import pybind11
    paths.append(pybind11.get_include())
except ImportError:  # pip's torch ships pybind11's headers
    import torch.utils.cpp_extension
    paths += torch.utils.cpp_extension.include_paths()
print(" ".join("-I" + p for p in paths))
PY
)
suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
mkdir -p "$out/ferry"
cp python/ferry/*.py "$out/ferry/"
# shellcheck disable=SC2086  # $includes is a list of flags
g++ -std=c++20 -O2 -shared -fPIC -fvisibility=hidden python/module.cpp $includes -I"$dlpack" -Iapi/include \
  -L"$lib" -l:libferry.so.0 -Wl,-rpath,"$lib" -o "$out/ferry/_ferry$suffix"
echo "built $out/ferry/_ferry$suffix"
