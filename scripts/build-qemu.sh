#!/usr/bin/env bash
# Builds the QEMU of the guest suite's VIRTIO_F_SQCQ_POLL runs: Debian 12's
# own source package of the installed qemu-system-x86 (fetched with the
# ordinary apt client, scripts/enable-deb-src.sh), with the patches of
# patches/qemu/ applied, configured with the least that runs the suite
# (x86_64 system emulation, TCG, vhost-user; firmware from Debian's
# qemu-system-data and seabios packages).
#
# Cached under $(cache_dir qemu)/KEY/ (scripts/lib/cache.sh: /var/cache/sqcq
# as root), KEY = source version + patches + configure options: a rerun
# with nothing changed costs one dpkg query and a hash.
#
#   scripts/build-qemu.sh      prints the path of qemu-system-x86_64
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/lib/packages.sh
source "$repo/scripts/lib/packages.sh"
cd "$repo"
log() { echo "build-qemu: $*" >&2; }

# The source version of the installed binary package (no binNMU suffix).
version="$(dpkg-query -W -f='${source:Version}' qemu-system-x86 2>/dev/null || true)"
[ -n "$version" ] || { log "qemu-system-x86 is not installed"; exit 1; }
configure_opts=(--target-list=x86_64-softmmu
    --without-default-features --enable-tcg --enable-vhost-user
    --disable-docs --disable-werror
    --firmwarepath=/usr/share/qemu:/usr/share/seabios:/usr/lib/ipxe/qemu)
key="$( { echo "$version ${configure_opts[*]} qemu-system-x86_64"; cat patches/qemu/*.patch; } |
    sha256sum | cut -c1-16)"
# shellcheck source=scripts/lib/cache.sh
source "$repo/scripts/lib/cache.sh"
out="$(cache_dir qemu)/$key"
bin="$out/bin/qemu-system-x86_64"
if [ -x "$bin" ]; then
    echo "$bin"
    exit 0
fi

ensure_packages build-qemu dpkg-dev meson ninja-build pkg-config python3-venv \
    libglib2.0-dev libpixman-1-dev zlib1g-dev libfdt-dev patch
scripts/enable-deb-src.sh

log "building QEMU $version with patches/qemu (key $key)"
work="$(mktemp -d "${TMPDIR:-/tmp}/sqcq-qemu.XXXXXX")"
trap 'rm -rf "$work"' EXIT
(
    cd "$work"
    unpack_qemu_source "$version"
    cd src
    for p in "$repo"/patches/qemu/*.patch; do
        patch -p1 --quiet --forward < "$p" || { log "$(basename "$p") does not apply"; exit 1; }
    done
    mkdir build && cd build
    ../configure --prefix="$out" "${configure_opts[@]}" \
        > "$work/configure.log" 2>&1 || { tail -n 30 "$work/configure.log" >&2; exit 1; }
    # The emulator alone: not the tools, tests or documentation.
    ninja -j"$(nproc)" qemu-system-x86_64 > "$work/make.log" 2>&1 ||
        { tail -n 40 "$work/make.log" >&2; exit 1; }
    mkdir -p "$out/bin"
    cp qemu-system-x86_64 "$bin.tmp"
    mv "$bin.tmp" "$bin"
)
[ -x "$bin" ] || { log "no $bin after the build"; exit 1; }
log "built $bin"
echo "$bin"
