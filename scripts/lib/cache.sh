# Sourced by the build scripts: where what they build from source is kept.
#
# cache_dir NAME: prints the folder for NAME's builds. Outside the work
# tree, so that a fresh clone on the same machine (CI runs in one) finds
# QEMU, the qtest and the guest modules built already: $SQCQ_CACHE if
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

# unpack_qemu_source VERSION: fetches Debian's qemu source package of
# VERSION with the ordinary apt client (scripts/enable-deb-src.sh first)
# into the current folder and unpacks it into ./src.
unpack_qemu_source() {
    apt-get source -qq --download-only "qemu=$1" >/dev/null 2>&1 ||
        apt-get source --download-only "qemu=$1"
    dpkg-source -x ./*.dsc src >/dev/null
}
