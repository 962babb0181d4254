#!/usr/bin/env bash
# Builds the guest's virtio modules with VIRTIO_F_SQCQ_POLL: the Debian
# kernel's own sources (the linux-source package of the exact version of
# the guest's linux-image), patches/linux applied, built out of tree
# against that kernel's headers. The modules (virtio, virtio_ring,
# virtio_pci, virtio_pci_modern_dev, virtio_pci_legacy_dev, virtio_scsi)
# replace Debian's in the guest initramfs (tests/guest/build-initramfs.sh).
#
# The patches are checked with that source's scripts/checkpatch.pl first.
# Cached under $(cache_dir guest-modules)/KEY/ (scripts/lib/cache.sh), KEY = kernel package version +
# patches + this script + the Kbuild file: a rerun with nothing changed
# costs a few dpkg queries and a hash.
#
#   scripts/build-guest-modules.sh      prints the directory of the .ko files
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
source scripts/lib/packages.sh
log() { echo "build-guest-modules: $*" >&2; }

# The guest kernel: as tests/guest/build-initramfs.sh picks it.
kver=""
for d in $(ls -1 /lib/modules 2>/dev/null | sort -V); do
    [ -r "/boot/vmlinuz-$d" ] && [ -r "/lib/modules/$d/modules.dep" ] && kver="$d"
done
[ -n "$kver" ] || { log "no kernel with modules found (install linux-image-amd64)"; exit 1; }
version="$(dpkg-query -W -f='${Version}' "linux-image-$kver")"
series="$(echo "$kver" | cut -d. -f1,2)"
kbuild="$repo/tests/guest/kmod/Kbuild"
key="$( { echo "$kver $version"; cat patches/linux/*.patch "$0" "$kbuild"; } | sha256sum | cut -c1-16)"
# shellcheck source=scripts/lib/cache.sh
source "$repo/scripts/lib/cache.sh"
cache="$(cache_dir guest-modules)"
out="$cache/$key"
mods=(virtio virtio_ring virtio_pci virtio_pci_modern_dev virtio_pci_legacy_dev virtio_scsi)
if [ -d "$out" ] && [ -s "$out/virtio_scsi.ko" ]; then
    echo "$out"
    exit 0
fi

ensure_packages build-guest-modules "linux-headers-$kver" make gcc xz-utils

log "building the guest modules for $kver ($version, key $key)"
work="$(mktemp -d "${TMPDIR:-/tmp}/sqcq-kmod.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# The source package of exactly this version (downloaded, not installed:
# only a few files of its tarball are needed).
debs="$cache/debs"
mkdir -p "$debs"
deb="$debs/linux-source-${series}_${version}_all.deb"
if [ ! -s "$deb" ]; then
    (cd "$work" && apt-get download -qq "linux-source-$series=$version" >/dev/null 2>&1 ||
        { apt-get update -qq && apt-get download -qq "linux-source-$series=$version"; })
    mv "$work"/linux-source-*.deb "$deb"
fi
src="$work/linux"
mkdir -p "$src"
dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$work" --wildcards './usr/src/linux-source-*.tar.xz'
files=(drivers/virtio drivers/scsi/virtio_scsi.c drivers/scsi/sd.h
       include/linux/virtio.h include/linux/virtio_ring.h include/linux/virtio_config.h
       include/uapi/linux/virtio_ring.h include/uapi/linux/virtio_config.h
       scripts/checkpatch.pl scripts/spelling.txt scripts/const_structs.checkpatch)
tar -xJf "$work"/usr/src/linux-source-*.tar.xz -C "$src" --strip-components=1 \
    "${files[@]/#/linux-source-$series/}"

patches=()
for p in patches/linux/*.patch; do
    case "$(basename "$p")" in 0000-*) continue ;; esac
    patches+=("$p")
done
for p in "${patches[@]}"; do
    if ! (cd "$src" && perl scripts/checkpatch.pl --no-tree -q "$repo/$p" >&2); then
        log "$(basename "$p"): checkpatch found problems"
        exit 1
    fi
    (cd "$src" && patch -p1 --quiet --forward < "$repo/$p") ||
        { log "$(basename "$p") does not apply to linux-source-$series $version"; exit 1; }
done

# Laid out flat, as the Kbuild file expects; the patched headers come
# before the kernel's own (NOSTDINC_FLAGS precede LINUXINCLUDE).
build="$work/build"
mkdir -p "$build"
cp "$src"/drivers/virtio/{virtio.c,virtio_ring.c,virtio_pci_common.c,virtio_pci_common.h} \
   "$src"/drivers/virtio/{virtio_pci_legacy.c,virtio_pci_modern.c} \
   "$src"/drivers/virtio/{virtio_pci_modern_dev.c,virtio_pci_legacy_dev.c} \
   "$src"/drivers/scsi/{virtio_scsi.c,sd.h} "$kbuild" "$build/"
cp -r "$src/include" "$build/include"
make -C "/lib/modules/$kver/build" M="$build" NOSTDINC_FLAGS="-I$build/include" \
    -j"$(nproc)" modules > "$work/make.log" 2>&1 || { tail -n 40 "$work/make.log" >&2; exit 1; }
if grep -E "warning:|error:" "$work/make.log" >&2; then
    log "the modules build with warnings"
    exit 1
fi
mkdir -p "$out.tmp"
for m in "${mods[@]}"; do
    cp "$build/$m.ko" "$out.tmp/"
done
rm -rf "$out"
mv "$out.tmp" "$out"
# drop older builds
for d in "$cache"/*/; do
    d="${d%/}"
    case "$d" in "$out"|*/debs) ;; *) rm -rf "$d" ;; esac
done
log "built ${#mods[@]} modules into $out"
echo "$out"
