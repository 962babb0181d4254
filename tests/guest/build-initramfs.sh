#!/usr/bin/env bash
# Builds the guest of the QEMU interop suite from the host's Debian packages:
# the kernel of linux-image-amd64, the modules the guest needs (with their
# dependencies and soft dependencies, resolved by modprobe against the
# kernel's own modules.dep/modules.softdep), busybox-static, sg3-utils, fio
# and e2fsprogs with every shared library ldd reports, and tests/guest/init.
#
# The result is cached under target/guest/, keyed by the versions of the
# packages it is made of and by the content of tests/guest/: a rerun with
# nothing changed costs a few dpkg queries.
#
# Usage: tests/guest/build-initramfs.sh OUTDIR [MODULES_DIR]
#   prints two lines: "kernel PATH" and "initrd PATH"
# The kernel is Debian's of the series $SQCQ_GUEST_KERNEL
# (scripts/lib/guest-kernel.sh: 6.1 by default, or 6.12). MODULES_DIR
# (scripts/build-guest-modules.sh) holds modules that replace Debian's of
# the same name (the VIRTIO_F_SQCQ_POLL guest); when it also holds a
# vmlinuz (the 6.12 series), that kernel runs instead, with only the
# modules of MODULES_DIR (builtin.list names those built into it). They
# are part of the cache key.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build-initramfs.sh OUTDIR [MODULES_DIR]}"
override="${2:-}"
mkdir -p "$out"

log() { echo "guest-build: $*" >&2; }

# The kernel: the newest one of the series with both a vmlinuz and a
# module tree.
# shellcheck source=scripts/lib/guest-kernel.sh
source "$here/../../scripts/lib/guest-kernel.sh"
series="$(guest_series)"
kver="$(guest_kver "$series")"
[ -n "$kver" ] || { log "no $series kernel with modules found (install $(guest_image_package "$series"))"; exit 1; }
own_kernel=""
[ -n "$override" ] && [ -e "$override/vmlinuz" ] && own_kernel="$override/vmlinuz"

# Modules the guest loads, in this order; modprobe adds dependencies and
# pre soft dependencies (ext4 -> crypto-crc32c -> crc32c-intel/generic).
# virtio_blk is loaded only by the blk runs (sqcq_dev=blk).
modules=(virtio_pci virtio_scsi sd_mod sg ext4 virtio_blk)
# Programs copied with their shared libraries (path in the guest = host path).
programs=(
    /usr/bin/sg_inq /usr/bin/sg_vpd /usr/bin/sg_readcap /usr/bin/sg_luns
    /usr/bin/sg_turs /usr/bin/sg_modes /usr/bin/sg_requests /usr/bin/sg_sync
    /usr/bin/sg_unmap /usr/bin/sg_write_same /usr/bin/sg_persist
    /usr/bin/sg_rtpg /usr/bin/sg_dd /usr/bin/sg_opcodes /usr/bin/sg_reset
    /usr/bin/fio
    /usr/sbin/mke2fs /usr/sbin/e2fsck
    /usr/sbin/blkdiscard
)
pkgs=("linux-image-$kver" busybox-static sg3-utils fio e2fsprogs libc6 util-linux)

pkgver() { dpkg-query -W -f='${Package}=${Version}\n' "$@" 2>/dev/null | sort; }

# Cache key: package versions + the suite's own files (the init script and
# this builder). The manifest also records the packages that own the shared
# libraries, which are re-checked on a hit.
key="$( { echo "$kver"; pkgver "${pkgs[@]}"; cat "$here/init" "$here/build-initramfs.sh";
          [ -z "$override" ] || cat "$override"/*.ko; [ -z "$own_kernel" ] || cat "$own_kernel"; } \
        | sha256sum | cut -c1-16)"
initrd="$out/initramfs-$key.cpio"
manifest="$out/initramfs-$key.libpkgs"
kernel="${own_kernel:-/boot/vmlinuz-$kver}"
if [ -s "$initrd" ] && [ -s "$manifest" ] \
   && [ "$(pkgver $(sed 's/=.*//' "$manifest"))" = "$(cat "$manifest")" ]; then
    echo "kernel $kernel"
    echo "initrd $initrd"
    exit 0
fi

log "building the guest initramfs for kernel $kver (key $key)"
stage="$(mktemp -d "$out/stage.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,mnt,run,lib/modules}
mknod -m 600 "$stage/dev/console" c 5 1
mknod -m 666 "$stage/dev/null" c 1 3

# busybox and its applets (real programs in /usr/{s,}bin come first in PATH)
cp /bin/busybox "$stage/bin/busybox"
for a in $(/bin/busybox --list); do
    [ "$a" = busybox ] || ln -sf busybox "$stage/bin/$a"
done

# programs and libraries
libs=()
for p in "${programs[@]}"; do
    [ -x "$p" ] || { log "missing $p"; exit 1; }
    mkdir -p "$stage$(dirname "$p")"
    cp -L "$p" "$stage$p"
    while read -r lib; do libs+=("$lib"); done < <(
        ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
done
ln -sf e2fsck "$stage/usr/sbin/fsck.ext4"
ln -sf mke2fs "$stage/usr/sbin/mkfs.ext4"
[ -r /etc/mke2fs.conf ] && cp /etc/mke2fs.conf "$stage/etc/"
mapfile -t libs < <(printf '%s\n' "${libs[@]}" | sort -u)
for l in "${libs[@]}"; do
    mkdir -p "$stage$(dirname "$l")"
    cp -L "$l" "$stage$l"
done
# packages owning the libraries, for the cache check
owners="$(for l in "${libs[@]}"; do
    dpkg -S "$l" 2>/dev/null || dpkg -S "$(readlink -f "$l")" 2>/dev/null || true
done | sed 's/:.*//; s/,.*//' | sort -u)"
log "${#programs[@]} programs, ${#libs[@]} shared libraries"

# modules: modprobe --show-depends gives dependencies and soft dependencies
# in load order; keep the first occurrence of each.
mods="$(for m in "${modules[@]}"; do
    if [ -n "$own_kernel" ]; then
        # the project's kernel: its own modules, the rest built in
        [ ! -e "$override/$m.ko" ] || echo "/lib/modules/$kver/$m.ko"
    else
        modprobe -S "$kver" --show-depends "$m" | awk '$1=="insmod"{print $2}'
    fi
done | awk '!seen[$0]++')"
: > "$stage/etc/builtin.list"
[ -z "$own_kernel" ] || cp "$override/builtin.list" "$stage/etc/builtin.list"
: > "$stage/etc/modules.load"
replaced=0
for m in $mods; do
    rel="${m#/lib/modules/$kver/}"
    mkdir -p "$stage/lib/modules/$(dirname "$rel")"
    if [ -n "$override" ] && [ -e "$override/$(basename "$m")" ]; then
        cp "$override/$(basename "$m")" "$stage/lib/modules/$rel"
        replaced=$((replaced + 1))
    else
        cp "$m" "$stage/lib/modules/$rel"
    fi
    echo "/lib/modules/$rel" >> "$stage/etc/modules.load"
done
[ -z "$override" ] || log "$replaced modules from $override"
log "$(wc -l < "$stage/etc/modules.load") modules"

install -m 755 "$here/init" "$stage/init"
echo "$kver" > "$stage/etc/kernel-version"

# Uncompressed: unpacking gzip under TCG costs more than the larger
# fw_cfg transfer.
(cd "$stage" && find . -mindepth 1 | sort | cpio --quiet -o -H newc -R 0:0) > "$initrd.tmp"
mv "$initrd.tmp" "$initrd"
pkgver ${owners} > "$manifest"
# drop older cache entries (of the same kind: stock or with modules)
kind() { cat "${1%.cpio}.kind" 2>/dev/null || echo "?"; }
echo "$kver $([ -z "$override" ] && echo stock || echo mods)" > "${initrd%.cpio}.kind"
for f in "$out"/initramfs-*.cpio; do
    if [ "$f" != "$initrd" ] && [ "$(kind "$f")" = "$(kind "$initrd")" ]; then
        rm -f "$f" "${f%.cpio}.libpkgs" "${f%.cpio}.kind"
    fi
done
log "initramfs $(du -h "$initrd" | cut -f1)"
echo "kernel $kernel"
echo "initrd $initrd"
