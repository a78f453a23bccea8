#!/usr/bin/env bash
# Builds te-cpp against LibTorch 2.6 (Debian 13's libtorch-dev, CPU, with Gloo) and runs the whole
# test suite there, inside a Debian 13 root made once with mmdebstrap (~30 s, 1.4 GB) and kept at
# ${TE_TRIXIE_ROOT:-/var/cache/te-cpp/trixie}. Runs as root: mmdebstrap, a private mount namespace
# (unshare) and chroot. The build goes to ${TE_LIBTORCH2_BUILD_DIR:-build-libtorch2} in this tree,
# with a ccache kept in the root. .ci/run calls this after the README's test command.
#
#   bash scripts/test-libtorch2.sh              # whole suite on LibTorch 2.6
#   bash scripts/test-libtorch2.sh -R Attention # extra args go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)
root=${TE_TRIXIE_ROOT:-/var/cache/te-cpp/trixie}
build_dir=${TE_LIBTORCH2_BUILD_DIR:-build-libtorch2}

# What the root holds: the Debian 13 names of scripts/setup.sh's build and test packages.
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git python3 python3-numpy python3-safetensors
  libtorch-dev libgloo-dev libopenblas0-openmp
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev zlib1g-dev libcpp-httplib-dev libboost-dev libicu-dev libpcre2-dev libdnnl-dev
)

if [ "$(id -u)" -ne 0 ]; then
  echo "te: scripts/test-libtorch2.sh needs root (mmdebstrap, unshare, chroot)" >&2
  exit 1
fi
if ! command -v mmdebstrap >/dev/null; then
  echo "te: installing mmdebstrap (apt-get, once)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq mmdebstrap >/dev/null
fi

# The root is (re)made when missing or when the package list changed; made beside and moved in,
# so an interrupted run never leaves half a root behind.
wanted="${PACKAGES[*]}"
if [ ! -f "$root/.te-packages" ] || [ "$(cat "$root/.te-packages")" != "$wanted" ]; then
  echo "te: making the Debian 13 root at $root (mmdebstrap, once)"
  mkdir -p "$(dirname "$root")"
  rm -rf "$root.new"
  include=$(IFS=,; echo "${PACKAGES[*]}")
  mmdebstrap --variant=apt --mode=root --quiet --include="$include" trixie "$root.new"
  echo "$wanted" >"$root.new/.te-packages"
  # The compiler cache outlives a package change (most objects stay valid).
  if [ -d "$root/var/cache/ccache" ]; then
    mkdir -p "$root.new/var/cache"
    mv "$root/var/cache/ccache" "$root.new/var/cache/ccache"
  fi
  rm -rf "$root"
  mv "$root.new" "$root"
fi
mkdir -p "$root/src"

inner=$(cat <<'EOF'
set -euo pipefail
cd /src
export CCACHE_DIR=/var/cache/ccache CCACHE_MAXSIZE=4G
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTE_CUDA=OFF --log-level=WARNING
fi
cmake --build "$BUILD_DIR" -- -k 0  # every error at once
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" "$@"
EOF
)

# The mounts live in a private namespace: they vanish with it, whatever way the run ends.
BUILD_DIR=$build_dir exec unshare --mount --propagation private -- bash -c '
  set -euo pipefail
  root=$1 src=$2; shift 2
  mount --rbind /dev "$root/dev"
  mount -t proc proc "$root/proc"
  mount --bind "$src" "$root/src"
  exec chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    BUILD_DIR="$BUILD_DIR" bash -c "$0" te-libtorch2 "$@"
' "$inner" "$root" "$src" "$@"
