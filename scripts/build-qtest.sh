#!/usr/bin/env bash
# Builds QEMU's own functional tests of vhost-user-blk back-ends: `qos-test`
# (whose vhost-user-blk-test.c starts the back-end named by
# QTEST_QEMU_STORAGE_DAEMON_BINARY) and the qemu-system-x86_64 it drives,
# from Debian 12's source package of QEMU 7.2, unpatched (fetched with the
# ordinary apt client, scripts/enable-deb-src.sh). Configured with the
# least that compiles vhost-user-blk-test.c into qos-test: x86_64 system
# emulation, vhost-user, and the tools and vhost-user-blk server that its
# meson.build asks for (neither is built here: only the two programs).
#
# Cached under $(cache_dir qtest)/KEY/ (scripts/lib/cache.sh), KEY = source version + the configure
# options and ninja targets below (what decides the binaries; comments may
# change without a rebuild): a rerun with nothing changed costs one
# apt-cache query and a hash.
#
#   scripts/build-qtest.sh      prints the folder holding bin/qos-test and
#                               bin/qemu-system-x86_64
#
# The build runs niced on at most QTEST_JOBS (default 2) jobs.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/lib/packages.sh
source "$repo/scripts/lib/packages.sh"
cd "$repo"
log() { echo "build-qtest: $*" >&2; }

ensure_packages build-qtest dpkg-dev meson ninja-build pkg-config python3-venv \
    libglib2.0-dev libpixman-1-dev zlib1g-dev libfdt-dev gcc
scripts/enable-deb-src.sh

# Debian 12's QEMU 7.2: the newest 1:7.2 source version apt knows (the
# machine may also see a backported QEMU, whose tests are another matter).
version="$(apt-cache showsrc qemu 2>/dev/null | sed -n 's/^Version: \(1:7\.2[^ ]*\)$/\1/p' |
    sort -V | tail -n 1)"
[ -n "$version" ] || { log "no QEMU 7.2 source package known to apt"; exit 1; }
configure_opts=(--target-list=x86_64-softmmu
    --without-default-features --enable-tcg --enable-vhost-user
    --enable-tools --enable-vhost-user-blk-server
    --disable-docs --disable-werror
    --firmwarepath=/usr/share/qemu:/usr/share/seabios:/usr/lib/ipxe/qemu)
targets=(qemu-system-x86_64 tests/qtest/qos-test)
key="$(echo "$version ${configure_opts[*]} ${targets[*]}" | sha256sum | cut -c1-16)"
# shellcheck source=scripts/lib/cache.sh
source "$repo/scripts/lib/cache.sh"
out="$(cache_dir qtest)/$key"
cache_lock "$out"
if [ -x "$out/bin/qos-test" ] && [ -x "$out/bin/qemu-system-x86_64" ]; then
    echo "$out"
    exit 0
fi

log "building qos-test and qemu-system-x86_64 of QEMU $version (key $key)"
work="$(mktemp -d "${TMPDIR:-/tmp}/sqcq-qtest.XXXXXX")"
trap 'rm -rf "$work"' EXIT
(
    cd "$work"
    unpack_qemu_source "$version"
    cd src
    mkdir build && cd build
    ../configure "${configure_opts[@]}" > "$work/configure.log" 2>&1 || { tail -n 30 "$work/configure.log" >&2; exit 1; }
    grep -q 'vhost-user-blk-test\.c' build.ninja ||
        { log "configure left vhost-user-blk-test.c out of qos-test"; exit 1; }
    nice -n 10 ninja -j"${QTEST_JOBS:-2}" "${targets[@]}" > "$work/make.log" 2>&1 || { tail -n 40 "$work/make.log" >&2; exit 1; }
    mkdir -p "$out/bin"
    cp qemu-system-x86_64 "$out/bin/qemu-system-x86_64.tmp"
    cp tests/qtest/qos-test "$out/bin/qos-test.tmp"
    mv "$out/bin/qemu-system-x86_64.tmp" "$out/bin/qemu-system-x86_64"
    mv "$out/bin/qos-test.tmp" "$out/bin/qos-test"
)
[ -x "$out/bin/qos-test" ] || { log "no $out/bin/qos-test after the build"; exit 1; }
log "built $out/bin/qos-test"
echo "$out"
