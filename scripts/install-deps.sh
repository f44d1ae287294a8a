#!/usr/bin/env bash
# Installs ferry's build and test dependencies from Debian's packages. Idempotent: packages
# already present are left alone, and apt is not touched when nothing is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libboost-dev libboost-fiber-dev libboost-context-dev
  libmsgpack-cxx-dev libfabric-dev libfabric-bin
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libfmt-dev libxxhash-dev libsodium-dev nlohmann-json3-dev libtomlplusplus-dev
  gnuplot-nox  # ferry sim --sweep's plot
  libgoogle-perftools-dev  # tcmalloc for the ferry command (the simulation allocates per message)
  clang libclang-rt-14-dev clang-format
  clang-16 libclang-rt-16-dev  # libFuzzer builds: clang >= 16 takes libstdc++ 12's std::expected
  python3 python3-msgpack
  python3-dev pybind11-dev libdlpack-dev python3-torch python3-numpy python3-pytest  # the Python module
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install-deps: all ${#packages[@]} packages present"
