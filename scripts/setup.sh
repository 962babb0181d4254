#!/usr/bin/env bash
# Installs what the build and the tests need, idempotently: when
# everything is present this costs a few dpkg queries and nothing else.
set -euo pipefail

# Debian packages the test suite uses: spin (the models), gcc, and
# qemu-system-common for qemu-storage-daemon, the vhost-user-blk peer of
# sqcq-bench's blk tests.
packages=(spin gcc qemu-system-common)

missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

command -v cargo >/dev/null || { echo "setup: cargo not found; install Rust (rustup) first" >&2; exit 1; }
