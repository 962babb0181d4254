#!/usr/bin/env bash
# Builds the guest side of VIRTIO_F_SQCQ_POLL for one guest kernel series
# (scripts/lib/guest-kernel.sh), from the Debian source of the exact version
# of that series' installed linux-image, with patches/linux/SERIES applied:
#
#   6.1   Debian 12's default kernel runs as shipped. Its virtio modules
#         (virtio, virtio_ring, virtio_pci, virtio_pci_modern_dev,
#         virtio_pci_legacy_dev, virtio_scsi, virtio_blk) are rebuilt out of
#         tree against its headers (tests/guest/kmod/Kbuild) and replace
#         Debian's in the guest initramfs (tests/guest/build-initramfs.sh).
#   6.12  Debian 12's 6.12 line builds the virtio core into the kernel
#         (CONFIG_VIRTIO=y, for its built-in virtio console and virtiofs),
#         so a patched virtio_ring cannot be loaded as a module. The guest
#         runs a kernel built from the same source with the series applied,
#         configured for the guest (tests/guest/kmod/guest-6.12.config:
#         allnoconfig plus what the suite needs, virtio_scsi and virtio_blk
#         as modules so that the suite can unload them). The files of the
#         series are also compiled with Debian's own 6.12 configuration.
#
# Every patch is checked with that source's scripts/checkpatch.pl first and
# must apply; a warning in a file the series touches fails the build.
# Cached under $(cache_dir guest-modules)/KEY/ (scripts/lib/cache.sh), KEY =
# series + kernel package version + patches + this script + the Kbuild file
# and guest configuration: a rerun with nothing changed costs a few dpkg
# queries and a hash.
#
#   scripts/build-guest-modules.sh [SERIES]   prints the directory of the
#       .ko files (with 6.12 also vmlinuz, the kernel, and builtin.list, the
#       modules built into it); SERIES: $SQCQ_GUEST_KERNEL, else 6.1
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
source scripts/lib/packages.sh
# shellcheck source=scripts/lib/guest-kernel.sh
source scripts/lib/guest-kernel.sh
log() { echo "build-guest-modules: $*" >&2; }

series="${1:-$(guest_series)}"
SQCQ_GUEST_KERNEL="$series" guest_series > /dev/null
ensure_packages build-guest-modules "$(guest_image_package "$series")"
kver="$(guest_kver "$series")"
[ -n "$kver" ] || { log "no $series kernel with modules found (install $(guest_image_package "$series"))"; exit 1; }
version="$(dpkg-query -W -f='${Version}' "linux-image-$kver" 2>/dev/null ||
           dpkg-query -W -f='${Version}' "linux-image-$kver-unsigned")"
patchdir="patches/linux/$series"
patches=()
for p in "$patchdir"/0*.patch; do
    case "$p" in */0000-*) ;; *) [ -e "$p" ] && patches+=("$p") ;; esac   # not the cover letter
done
[ "${#patches[@]}" -gt 0 ] || { log "no patches in $patchdir"; exit 1; }
kbuild="$repo/tests/guest/kmod/Kbuild"
guestcfg="$repo/tests/guest/kmod/guest-$series.config"
key="$( { echo "$series $kver $version"; cat "${patches[@]}" "$0" "$kbuild" scripts/lib/guest-kernel.sh;
          [ "$series" = 6.1 ] || cat "$guestcfg"; } | sha256sum | cut -c1-16)"
# shellcheck source=scripts/lib/cache.sh
source "$repo/scripts/lib/cache.sh"
cache="$(cache_dir guest-modules)"
out="$cache/$key"
cache_lock "$out"
if [ -d "$out" ] && [ -s "$out/virtio_blk.ko" ]; then
    echo "$out"
    exit 0
fi

ensure_packages build-guest-modules "linux-headers-$kver" make gcc xz-utils
[ "$series" = 6.1 ] || ensure_packages build-guest-modules flex bison bc libelf-dev libssl-dev cpio

log "building the $series guest for $kver ($version, key $key)"
work="$(mktemp -d "${TMPDIR:-/tmp}/sqcq-kmod.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# The source package of exactly this version (downloaded, not installed).
debs="$cache/debs"
mkdir -p "$debs"
deb="$debs/linux-source-${series}_${version}_all.deb"
if [ ! -s "$deb" ]; then
    (cd "$work" && apt-get download -qq "linux-source-$series=$version" >/dev/null 2>&1 ||
        { package_lock apt-get update -qq && apt-get download -qq "linux-source-$series=$version"; })
    mv "$work"/linux-source-*.deb "$deb"
fi
src="$work/linux"
mkdir -p "$src"
dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$work" --wildcards './usr/src/linux-source-*.tar.xz'
if [ "$series" = 6.1 ]; then
    # only the files the out-of-tree build needs
    files=(drivers/virtio drivers/scsi/virtio_scsi.c drivers/scsi/sd.h drivers/block/virtio_blk.c
           include/linux/virtio.h include/linux/virtio_ring.h include/linux/virtio_config.h
           include/uapi/linux/virtio_ring.h include/uapi/linux/virtio_config.h
           scripts/checkpatch.pl scripts/spelling.txt scripts/const_structs.checkpatch)
    tar -xJf "$work"/usr/src/linux-source-*.tar.xz -C "$src" --strip-components=1 \
        "${files[@]/#/linux-source-$series/}"
else
    tar -xJf "$work"/usr/src/linux-source-*.tar.xz -C "$src" --strip-components=1
fi
rm -rf "${work:?}/usr"

for p in "${patches[@]}"; do
    if ! (cd "$src" && perl scripts/checkpatch.pl --no-tree -q "$repo/$p" >&2); then
        log "$(basename "$p"): checkpatch found problems"
        exit 1
    fi
    (cd "$src" && patch -p1 --quiet --forward < "$repo/$p") ||
        { log "$(basename "$p") does not apply to linux-source-$series $version"; exit 1; }
done
# the files the series touches, for the warning checks
touched="$(sed -n 's|^+++ b/||p' "${patches[@]}" | sort -u)"
series_warnings() { # LOG: the warnings and errors in the series' files
    grep -E "warning:|error:" "$1" | grep -F -f <(echo "$touched") || true
}

mkdir -p "$out.tmp"
if [ "$series" = 6.1 ]; then
    mods=(virtio virtio_ring virtio_pci virtio_pci_modern_dev virtio_pci_legacy_dev virtio_scsi virtio_blk)
    build="$work/build"
    guest_flat_build 6.1 "$src" "$kver" "$build" "" > "$work/make.log" 2>&1 ||
        { tail -n 40 "$work/make.log" >&2; exit 1; }
    if grep -E "warning:|error:" "$work/make.log" >&2; then
        log "the modules build with warnings"
        exit 1
    fi
    for m in "${mods[@]}"; do
        cp "$build/$m.ko" "$out.tmp/"
    done
else
    # The series' files with Debian's own configuration of this kernel
    # (scripts/lib/guest-kernel.sh, guest_flat_build).
    guest_flat_build 6.12 "$src" "$kver" "$work/debian-config" "$touched" \
        > "$work/debian-config.log" 2>&1 || { tail -n 40 "$work/debian-config.log" >&2; exit 1; }
    # (laid out flat: the warnings name the files without their folders)
    if grep -E "warning:|error:" "$work/debian-config.log" >&2; then
        log "the series compiles with warnings under Debian's configuration"
        exit 1
    fi
    log "the series' files compile without warnings under Debian's configuration ($(echo "$touched" | grep -c '\.c$') objects)"
    # The guest's kernel: allnoconfig plus the suite's needs, and the
    # kernel release of Debian's with +sqcq in place of its ABI name.
    kobj="$work/guest"
    mkdir -p "$kobj"
    make -C "$src" O="$kobj" KCONFIG_ALLCONFIG="$guestcfg" allnoconfig > "$work/guest.log" 2>&1
    while read -r opt; do
        grep -qx "$opt" "$kobj/.config" || { log "$guestcfg: $opt did not stick (now: $(grep "^${opt%%=*}=" "$kobj/.config" || echo unset))"; exit 1; }
    done < <(grep -E '^CONFIG_[A-Z0-9_]+=[ym]$' "$guestcfg")
    make -C "$src" O="$kobj" -j"$(nproc)" LOCALVERSION=+sqcq bzImage >> "$work/guest.log" 2>&1 ||
        { tail -n 40 "$work/guest.log" >&2; exit 1; }
    make -C "$src" O="$kobj" -j"$(nproc)" LOCALVERSION=+sqcq \
        drivers/scsi/virtio_scsi.ko drivers/block/virtio_blk.ko >> "$work/guest.log" 2>&1 ||
        { tail -n 40 "$work/guest.log" >&2; exit 1; }
    if [ -n "$(series_warnings "$work/guest.log")" ]; then
        series_warnings "$work/guest.log" >&2
        log "the guest kernel builds with warnings in the series' files"
        exit 1
    fi
    cp "$kobj/arch/x86/boot/bzImage" "$out.tmp/vmlinuz"
    cp "$kobj/drivers/scsi/virtio_scsi.ko" "$kobj/drivers/block/virtio_blk.ko" "$out.tmp/"
    # the modules built into it (the guest's init counts them as loaded)
    tr '\0' '\n' < "$kobj/modules.builtin.modinfo" | sed -n 's/^\([a-z0-9_-]*\)\..*/\1/p' |
        sort -u > "$out.tmp/builtin.list"
    cat "$kobj/include/config/kernel.release" > "$out.tmp/kernel.release"
fi
echo "$series" > "$out.tmp/series"
rm -rf "$out"
mv "$out.tmp" "$out"
# drop older builds of the same series
for d in "$cache"/*/; do
    d="${d%/}"
    [ "$d" != "$out" ] && [ "$d" != "$cache/debs" ] || continue
    [ "$(cat "$d/series" 2>/dev/null || echo 6.1)" = "$series" ] && rm -rf "$d"
done
log "built the $series guest into $out"
echo "$out"
