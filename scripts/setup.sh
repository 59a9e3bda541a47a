# Sourced by demo.sh and test.sh: installs what dcpinfer needs on Debian 12
# when it is missing, then bootstraps, configures and builds in BUILD_DIR
# (default build/). Extra configure arguments come from CONFIGURE_ARGS.
set -u
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$TOP/build}
PACKAGES="gcc g++ libtbb-dev make autoconf automake pkg-config openmpi-bin libopenmpi-dev libhdf5-dev hdf5-tools \
libopenblas-dev libjansson-dev libpcre2-dev libutf8proc-dev valgrind clang"

ensure_packages() {
    local missing="" p
    for p in $PACKAGES; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    [ -z "$missing" ] && return 0
    echo "dcpinfer setup: installing$missing"
    if [ "$(id -u)" != 0 ]; then
        echo "dcpinfer setup: not root; install these Debian packages first:$missing" >&2
        return 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing >/dev/null ||
        { echo "dcpinfer setup: apt-get install$missing failed" >&2; return 1; }
}

build_dcpinfer() {
    local jobs
    jobs=$(nproc 2>/dev/null || echo 2)
    if [ ! -x "$TOP/configure" ] || [ "$TOP/configure.ac" -nt "$TOP/configure" ] || [ "$TOP/Makefile.am" -nt "$TOP/Makefile.in" ]; then
        (cd "$TOP" && autoreconf -fi) || return 1
    fi
    mkdir -p "$BUILD_DIR"
    if [ ! -f "$BUILD_DIR/Makefile" ] || [ "$TOP/configure" -nt "$BUILD_DIR/config.status" ]; then
        (cd "$BUILD_DIR" && "$TOP/configure" ${CONFIGURE_ARGS:-} >configure.out 2>&1) ||
            { tail -15 "$BUILD_DIR/configure.out" >&2; return 1; }
    fi
    make -C "$BUILD_DIR" -j"$jobs" >"$BUILD_DIR/make.out" 2>&1 || { tail -40 "$BUILD_DIR/make.out" >&2; return 1; }
}

# W: a scratch folder for a benchmark script, removed when it exits
bench_workdir() {
    W=$(mktemp -d "${TMPDIR:-/tmp}/dcpbench.XXXXXX")
    trap 'rm -rf "$W"' EXIT
}

# a benchmark's start: the packages, the build (B: its folder) and W
bench_start() {
    ensure_packages || exit 1
    build_dcpinfer || exit 1
    bench_workdir
    B="$BUILD_DIR"
}

# mpirun as root on a CI machine, oversubscribed without busy-waiting
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
