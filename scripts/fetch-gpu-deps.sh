#!/bin/bash
# On a Debian 12 machine with network: downloads the .deb files dcpinfer
# needs beyond the CUDA toolkit and unpacks them into one folder, for a GPU
# machine without network (DEPS_PREFIX=... scripts/gpu-check.sh).
#   scripts/fetch-gpu-deps.sh OUT_DIR
set -eu
out=${1:?usage: fetch-gpu-deps.sh OUT_DIR}
mkdir -p "$out/debs" "$out/root"
cd "$out/debs"
pkgs="libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7
libhdf5-dev libhdf5-103-1 libsz2 libaec0 libcurl4 hdf5-tools libopenblas-dev libopenblas0-pthread libopenblas-pthread-dev
libjansson-dev libjansson4 libgfortran5 libfabric1 libucx0 libpsm2-2 libibverbs1 librdmacm1 libnl-3-200
libnl-route-3-200 autoconf automake autotools-dev m4 pkg-config libpkgconf3 pkgconf pkgconf-bin"
apt-get download $pkgs
for d in *.deb; do dpkg -x "$d" ../root; done
echo "unpacked into $out/root: DEPS_PREFIX=$out/root scripts/gpu-check.sh"
