# shellcheck shell=bash
# Sourced by the build scripts: where what they build from source is kept.
#
# cache_dir NAME: prints the folder for NAME's builds. Outside the work
# tree, so that a fresh clone on the same machine (CI runs in one) finds
# QEMU (with its qos-test) and the guest modules built already: $SQCQ_CACHE if
# set, /var/cache/sqcq as root, else target/ of the work tree. Every entry
# in it is keyed by what it was built from (source version, patches,
# options), so a stale one is never used.
cache_dir() {
    local base="${SQCQ_CACHE:-}"
    if [ -z "$base" ]; then
        if [ "$(id -u)" = 0 ]; then
            base=/var/cache/sqcq
        else
            base="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/target"
        fi
    fi
    mkdir -p "$base/$1"
    echo "$base/$1"
}

# cache_lock ENTRY: waits for, then holds until the calling script exits,
# the lock of the cache entry ENTRY (ENTRY.lock beside it, on fd 8), so
# that two scripts building one entry at once build it once: the second
# waits for the first, then finds the entry built. scripts/test.sh builds
# in its host lane what its guest lane will ask for.
cache_lock() {
    exec 8>"$1.lock"
    flock 8
}

# unpack_qemu_source VERSION: fetches Debian's qemu source package of
# VERSION with the ordinary apt client (scripts/enable-deb-src.sh first)
# into the current folder and unpacks it into ./src, Debian's patches
# applied. When only the upstream tarball of the package can be fetched
# (bookworm-backports' packaging tarball is not served everywhere), that
# tarball alone, as QEMU released it, and says so.
unpack_qemu_source() {
    apt-get source -qq --download-only "qemu=$1" >/dev/null 2>&1 ||
        apt-get source --download-only "qemu=$1" >&2 || true
    if [ -e ./*.dsc ] && [ -e ./*.debian.tar.* ]; then
        dpkg-source -x ./*.dsc src >/dev/null
    elif [ -e ./*.orig.tar.* ]; then
        echo "unpack_qemu_source: Debian's packaging of qemu $1 could not be fetched: building its upstream tarball as released" >&2
        mkdir src && tar -xf ./*.orig.tar.* -C src --strip-components=1
    else
        echo "unpack_qemu_source: could not fetch the source of qemu $1" >&2
        return 1
    fi
}
