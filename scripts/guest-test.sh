#!/usr/bin/env bash
# The QEMU (TCG) interop suite: an unmodified Linux guest (virtio-scsi,
# sg3_utils, fio, ext4) against a vhost-user SCSI daemon. docs/guest-tests.md.
#
#   scripts/guest-test.sh                            # sqcqd (skips if not built)
#   scripts/guest-test.sh --sqcq [--packed]          # bit 42 in the guest (on packed rings)
#   scripts/guest-test.sh --blk [--sqcq]             # vhost-user-blk (bit 42 in virtio_blk)
#   scripts/guest-test.sh --daemon vhost-device-scsi # rust-vmm's peer
#   scripts/guest-test.sh --daemon-cmd 'CMD {socket}' --num-queues N --disks N
#   scripts/guest-test.sh --restart | --migrate      # issue 12 (tests/guest/live.sh)
#   scripts/guest-test.sh [--blk|--migrate|--restart] --rbd   # disks on Ceph RBD
#
# Any of them on another kernel or QEMU:
#   --kernel 6.1|6.12       the guest's kernel series (default 6.1, Debian
#                           12's; 6.12 is its 6.12 line): SQCQ_GUEST_KERNEL
#   --qemu-version 7.2|10.0 QEMU built from Debian's source with that
#                           series' patches (scripts/build-qemu.sh; 10.0 is
#                           bookworm-backports'): SQCQ_GUEST_QEMU. Without
#                           it, Debian's own 7.2 runs the stock guests and
#                           the patched 7.2 the --sqcq ones and migrations.
#
# Installs the Debian packages it needs when missing (as root, idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."

args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --kernel) export SQCQ_GUEST_KERNEL="$2"; shift ;;
    --qemu-version) export SQCQ_GUEST_QEMU="$2"; shift ;;
    *) args+=("$1") ;;
    esac
    shift
done
set -- "${args[@]}"

source scripts/lib/packages.sh
# shellcheck source=scripts/lib/guest-kernel.sh
source scripts/lib/guest-kernel.sh
series="$(guest_series)"
ensure_packages guest-test qemu-system-x86 qemu-system-data seabios linux-image-amd64 \
    "$(guest_image_package "$series")" busybox-static sg3-utils fio e2fsprogs cpio kmod
case "${SQCQ_GUEST_QEMU:-}" in
    ""|7.2|10.0) ;;
    *) echo "guest-test: unknown --qemu-version '$SQCQ_GUEST_QEMU' (7.2 or 10.0)" >&2; exit 2 ;;
esac

# restart and live migration under I/O: their own harness
for arg in "$@"; do
    case "$arg" in
    --restart|--migrate)
        ensure_packages guest-test python3
        exec tests/guest/live.sh "$@" ;;
    esac
done
exec tests/guest/run.sh "$@"
