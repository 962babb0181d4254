#!/usr/bin/env bash
# The QEMU (TCG) interop suite: an unmodified Linux guest (virtio-scsi,
# sg3_utils, fio, ext4) against a vhost-user SCSI daemon. docs/guest-tests.md.
#
#   scripts/guest-test.sh                            # sqcqd (skips if not built)
#   scripts/guest-test.sh --daemon vhost-device-scsi # rust-vmm's peer
#   scripts/guest-test.sh --daemon-cmd 'CMD {socket}' --num-queues N --disks N
#
# Installs the Debian packages it needs when missing (as root, idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(qemu-system-x86 qemu-system-data seabios linux-image-amd64 busybox-static
          sg3-utils fio e2fsprogs cpio kmod)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "guest-test: missing packages ${missing[*]} (run as root, or apt-get install them)" >&2
        exit 1
    fi
    echo "guest-test: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >/dev/null
fi

exec tests/guest/run.sh "$@"
