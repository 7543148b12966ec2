#!/usr/bin/env bash
# Installs the Debian packages fsc/fsexec need (only those missing), then configures and
# builds into build/ (or $FS_BUILD_DIR). Extra arguments go to cmake's configure step,
# e.g. scripts/setup.sh -DFS_SANITIZE=ON.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake pkg-config flex bison libjansson-dev libcriterion-dev
          libopenblas-dev libopenmpi-dev openmpi-bin python3-torch python3-numpy)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

build="${FS_BUILD_DIR:-build}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFS_WERROR=ON "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
