#!/usr/bin/env bash
# Builds the QEMU of the guest suite's VIRTIO_F_SQCQ_POLL runs from
# Debian's own source package, with the patch series for that QEMU
# applied (patches/qemu/SERIES/), configured with the least that runs the
# suite (x86_64 system emulation, TCG, vhost-user; firmware from Debian's
# qemu-system-data and seabios packages):
#
#   7.2   Debian 12's: the source of the installed qemu-system-x86 (the
#         default)
#   10.0  bookworm-backports': its source package, fetched with the
#         ordinary apt client (scripts/lib/backports.sh enables the suite,
#         source entries included); built with the backports' meson,
#         unpacked beside it, not installed (QEMU 10 needs meson 1.5,
#         Debian 12 has 1.0). When the Debian packaging tarball of the
#         backport cannot be fetched, the upstream tarball of the same
#         source package is built as it is.
#
# Cached under $(cache_dir qemu)/KEY/ (scripts/lib/cache.sh: /var/cache/sqcq
# as root), KEY = source version + patches + configure options: a rerun
# with nothing changed costs a dpkg or apt query and a hash.
#
# 7.2's build also makes QEMU's own functional tests of vhost-user-blk
# back-ends, `qos-test` (tests/qtest/vhost-user-blk-test.c, run against
# sqcqd by scripts/qtest.sh), beside the emulator in the same tree: the
# patched QEMU with `sqcq_poll` off, as its default is, must pass them as
# the unpatched one does (what a maintainer taking the series would run),
# and one QEMU build serves both. Meson compiles that test in only with
# the tools and the vhost-user-blk server enabled (neither is built).
#
#   scripts/build-qemu.sh [7.2|10.0]    prints the path of qemu-system-x86_64
#                                       (7.2: bin/qos-test beside it)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/lib/packages.sh
source "$repo/scripts/lib/packages.sh"
# shellcheck source=scripts/lib/backports.sh
source "$repo/scripts/lib/backports.sh"
cd "$repo"
log() { echo "build-qemu: $*" >&2; }

series="${1:-7.2}"
case "$series" in
7.2)
    ensure_packages build-qemu qemu-system-x86
    # The source version of the installed binary package (no binNMU suffix).
    version="$(dpkg-query -W -f='${source:Version}' qemu-system-x86 2>/dev/null || true)"
    [ -n "$version" ] || { log "qemu-system-x86 is not installed"; exit 1; }
    ;;
10.0)
    enable_backports build-qemu
    version="$(backports_version qemu)"
    [ -n "$version" ] || { log "no qemu source in bookworm-backports (apt-get update?)"; exit 1; }
    ;;
*) log "unknown QEMU series '$series' (7.2 or 10.0)"; exit 2 ;;
esac
case "$version" in
    *:"$series"*) ;;
    *) log "the $series series found QEMU $version"; exit 1 ;;
esac
# the series without its cover letter
patches=()
for p in patches/qemu/"$series"/0*.patch; do
    case "$p" in */0000-*) ;; *) [ -e "$p" ] && patches+=("$p") ;; esac
done
[ "${#patches[@]}" -gt 0 ] || { log "no patches in patches/qemu/$series"; exit 1; }
configure_opts=(--target-list=x86_64-softmmu
    --without-default-features --enable-tcg --enable-vhost-user
    --disable-docs --disable-werror
    --firmwarepath=/usr/share/qemu:/usr/share/seabios:/usr/lib/ipxe/qemu)
targets=(qemu-system-x86_64)
if [ "$series" = 7.2 ]; then
    configure_opts+=(--enable-tools --enable-vhost-user-blk-server)
    targets+=(tests/qtest/qos-test)
else
    # (the firmware blobs are stripped from Debian's +ds tarball of 10.0;
    # the suite's come from qemu-system-data and seabios)
    configure_opts+=(--disable-install-blobs)
fi
key="$( { echo "$version ${configure_opts[*]} ${targets[*]}"; cat "${patches[@]}"; } |
    sha256sum | cut -c1-16)"
# shellcheck source=scripts/lib/cache.sh
source "$repo/scripts/lib/cache.sh"
out="$(cache_dir qemu)/$key"
bin="$out/bin/qemu-system-x86_64"
cache_lock "$out"
built() {
    local t
    for t in "${targets[@]}"; do [ -x "$out/bin/${t##*/}" ] || return 1; done
}
if built; then
    echo "$bin"
    exit 0
fi

ensure_packages build-qemu dpkg-dev meson ninja-build pkg-config python3-venv \
    libglib2.0-dev libpixman-1-dev zlib1g-dev libfdt-dev patch
scripts/enable-deb-src.sh

log "building QEMU $version with patches/qemu/$series (key $key)"
work="$(mktemp -d "${TMPDIR:-/tmp}/sqcq-qemu.XXXXXX")"
trap 'rm -rf "$work"' EXIT
if [ "$series" = 10.0 ]; then
    # QEMU 10's configure wants meson >= 1.5 and pycotap (the wheels in
    # its tarball are stripped from Debian's +ds source): the backports'
    # packages, unpacked, found by configure's Python through PYTHONPATH.
    for pkg in meson python3-pycotap; do
        (cd "$work" && apt-get download -qq "$pkg=$(backports_version "$pkg")" 2>/dev/null &&
            dpkg-deb -x "${pkg}"_*.deb pydeps) || { log "cannot fetch $pkg from bookworm-backports"; exit 1; }
    done
    export PYTHONPATH="$work/pydeps/usr/lib/python3/dist-packages${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$work/pydeps/usr/bin:$PATH"
fi
(
    cd "$work"
    unpack_qemu_source "$version"
    cd src
    for p in "${patches[@]}"; do
        patch -p1 --quiet --forward < "$repo/$p" || { log "$(basename "$p") does not apply"; exit 1; }
    done
    if [ "$series" = 10.0 ]; then
        # pc-bios/meson.build names the edk2 images that the +ds tarball
        # strips: empty stand-ins, never built (only the emulator is)
        grep -o "'edk2-[a-z0-9_-]*\.fd'" pc-bios/meson.build | tr -d "'" |
            while read -r f; do [ -e "pc-bios/$f.bz2" ] || : > "pc-bios/$f.bz2"; done
    fi
    mkdir build && cd build
    ../configure --prefix="$out" "${configure_opts[@]}" \
        > "$work/configure.log" 2>&1 || { tail -n 30 "$work/configure.log" >&2; exit 1; }
    if [ "$series" = 7.2 ]; then
        grep -q 'vhost-user-blk-test\.c' build.ninja ||
            { log "configure left vhost-user-blk-test.c out of qos-test"; exit 1; }
    fi
    # The emulator (and qos-test): not the tools or the documentation.
    ninja -j"$(nproc)" "${targets[@]}" > "$work/make.log" 2>&1 ||
        { tail -n 40 "$work/make.log" >&2; exit 1; }
    mkdir -p "$out/bin"
    for t in "${targets[@]}"; do
        cp "$t" "$out/bin/${t##*/}.tmp"
        mv "$out/bin/${t##*/}.tmp" "$out/bin/${t##*/}"
    done
)
built || { log "not all of ${targets[*]} in $out/bin after the build"; exit 1; }
log "built $bin"
echo "$bin"
