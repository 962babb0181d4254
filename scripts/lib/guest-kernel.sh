# shellcheck shell=bash
# Sourced by the guest suite's builders (scripts/build-guest-modules.sh,
# tests/guest/build-initramfs.sh, scripts/guest-test.sh): which kernel the
# guest runs.
#
# The series is $SQCQ_GUEST_KERNEL (scripts/guest-test.sh --kernel):
#   6.1   Debian 12's default kernel (linux-image-amd64), the default
#   6.12  Debian 12's 6.12 line (linux-image-6.12-amd64)

# guest_series: the series asked for
guest_series() {
    case "${SQCQ_GUEST_KERNEL:-6.1}" in
        6.1|6.12) echo "${SQCQ_GUEST_KERNEL:-6.1}" ;;
        *) echo "unknown guest kernel series '${SQCQ_GUEST_KERNEL}' (6.1 or 6.12)" >&2; return 1 ;;
    esac
}

# guest_image_package SERIES: Debian's package of that series' kernel
guest_image_package() {
    case "$1" in 6.1) echo linux-image-amd64 ;; *) echo "linux-image-$1-amd64" ;; esac
}

# guest_kver SERIES: the newest installed kernel release of SERIES with
# both a vmlinuz and a module tree, or nothing
guest_kver() {
    local d kver=""
    # shellcheck disable=SC2012 # kernel release names
    for d in $(ls -1 /lib/modules 2>/dev/null | sort -V); do
        case "$d" in "$1".*) ;; *) continue ;; esac
        [ -r "/boot/vmlinuz-$d" ] && [ -r "/lib/modules/$d/modules.dep" ] && kver="$d"
    done
    echo "$kver"
}

# guest_flat_build SERIES SRC KVER DIR TOUCHED: compiles the guest's virtio
# files of the kernel source SRC out of tree against KVER's headers package
# (Debian's own configuration of that kernel), laid out flat in DIR with
# SRC's include/ ahead of the kernel's (NOSTDINC_FLAGS come before
# LINUXINCLUDE); make's output on stdout.
#   6.1   the modules the 6.1 guest loads in place of Debian's
#         (tests/guest/kmod/Kbuild: virtio, virtio_ring, virtio_pci and its
#         two _dev halves, virtio_scsi, virtio_blk)
#   6.12  each .c file of TOUCHED (the files a series changes, one path a
#         line) as an object of its own, with no modpost: Debian builds the
#         virtio core into this kernel, so virtio_ring's symbols are in
#         vmlinux already; as a module an object differs by -DMODULE only
# Three objects take seconds, where a configured tree of the whole source
# costs a `make prepare` first.
guest_flat_build() {
    local series=$1 src=$2 kver=$3 dir=$4 touched=$5 f targets=()
    rm -rf "$dir" && mkdir -p "$dir"
    if [ "$series" = 6.1 ]; then
        cp "$src"/drivers/virtio/{virtio.c,virtio_ring.c,virtio_pci_common.c,virtio_pci_common.h} \
           "$src"/drivers/virtio/{virtio_pci_legacy.c,virtio_pci_modern.c} \
           "$src"/drivers/virtio/{virtio_pci_modern_dev.c,virtio_pci_legacy_dev.c} \
           "$src"/drivers/scsi/virtio_scsi.c "$src"/drivers/block/virtio_blk.c \
           "$(dirname "${BASH_SOURCE[0]}")/../../tests/guest/kmod/Kbuild" "$dir/"
        targets=(modules)
    else
        for f in $(echo "$touched" | grep '\.c$'); do
            cp "$src/$f" "$dir/"
            targets+=("$(basename "${f%.c}").o")
        done
        echo "obj-m += ${targets[*]}" > "$dir/Kbuild"
    fi
    # virtio_scsi.c's own header
    [ ! -e "$src/drivers/scsi/sd.h" ] || cp "$src/drivers/scsi/sd.h" "$dir/"
    cp -r "$src/include" "$dir/include"
    make -C "/lib/modules/$kver/build" M="$dir" NOSTDINC_FLAGS="-I$dir/include" \
        -j"$(nproc)" "${targets[@]}"
}
