#!/usr/bin/env bash
# The QEMU (TCG) interop suite: an unmodified Linux guest (virtio-scsi,
# sg3_utils, fio, ext4) against a vhost-user SCSI daemon. docs/guest-tests.md.
#
#   scripts/guest-test.sh                            # sqcqd (skips if not built)
#   scripts/guest-test.sh --sqcq [--packed]          # bit 42 in the guest (on packed rings)
#   scripts/guest-test.sh --daemon vhost-device-scsi # rust-vmm's peer
#   scripts/guest-test.sh --daemon-cmd 'CMD {socket}' --num-queues N --disks N
#   scripts/guest-test.sh --restart | --migrate      # issue 12 (tests/guest/live.sh)
#   scripts/guest-test.sh [--blk|--migrate|--restart] --rbd   # disks on Ceph RBD
#
# Installs the Debian packages it needs when missing (as root, idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib/packages.sh
ensure_packages guest-test qemu-system-x86 qemu-system-data seabios linux-image-amd64 \
    busybox-static sg3-utils fio e2fsprogs cpio kmod

# restart and live migration under I/O: their own harness
for arg in "$@"; do
    case "$arg" in
    --restart|--migrate)
        ensure_packages guest-test python3
        exec tests/guest/live.sh "$@" ;;
    esac
done
exec tests/guest/run.sh "$@"
