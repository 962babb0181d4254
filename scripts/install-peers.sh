#!/usr/bin/env bash
# Installs the interoperability peers the driver-side tests run against,
# into the project-local target/tools (never system-wide), idempotently:
# nothing happens when the binary is already there.
#
#   rust-vmm's vhost-device-scsi 0.1.0: one connection per process, one
#   request queue, 512-byte blocks.
#
# Usage: scripts/install-peers.sh   (then target/tools/bin/vhost-device-scsi)
set -euo pipefail
cd "$(dirname "$0")/.."

root="${SQCQ_TOOLS:-$PWD/target/tools}"
bin="$root/bin/vhost-device-scsi"
if [ -x "$bin" ]; then
    exit 0
fi
command -v cargo >/dev/null || { echo "install-peers: cargo not found" >&2; exit 1; }
echo "install-peers: installing vhost-device-scsi 0.1.0 into $root" >&2
# --locked uses the versions the peer was released with; fall back to a
# fresh resolution when that lock no longer builds with this toolchain.
if ! cargo install --quiet --root "$root" --locked vhost-device-scsi --version 0.1.0; then
    echo "install-peers: --locked failed, retrying without it" >&2
    cargo install --quiet --root "$root" vhost-device-scsi --version 0.1.0
fi
test -x "$bin"
