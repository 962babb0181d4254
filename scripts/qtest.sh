#!/usr/bin/env bash
# QEMU's own functional tests of vhost-user-blk back-ends against sqcqd:
# the vhost-user-blk tests of QEMU 7.2's `qos-test` (basic, indirect, idx,
# nxvirtq, hotplug, multiqueue), built with the QEMU 7.2 of the guest
# suite by scripts/build-qemu.sh (Debian 12's source and patches/qemu/7.2,
# `sqcq_poll` off as by default), with
# sqcqd started through scripts/qsd-compat.sh where the test starts
# qemu-storage-daemon. Fails unless every one of them runs and passes.
#
#   scripts/qtest.sh            SQCQD: the sqcqd binary (default: target/debug/sqcqd,
#                               built here if missing)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/lib/packages.sh
source "$repo/scripts/lib/packages.sh"
cd "$repo"
log() { echo "qtest: $*" >&2; }

# Firmware of the pc machine the tests run (seabios; option ROMs).
ensure_packages qtest qemu-system-data seabios ipxe-qemu
out="$(dirname "$(dirname "$(scripts/build-qemu.sh 7.2)")")"
if [ -z "${SQCQD:-}" ]; then
    cargo build --quiet -p sqcq-target --bin sqcqd
    SQCQD="$repo/target/debug/sqcqd"
fi
SQCQD="$(realpath "$SQCQD")"
export SQCQD

# Every vhost-user-blk test of the graph, by its full path.
mapfile -t tests < <(QTEST_QEMU_BINARY="$out/bin/qemu-system-x86_64" "$out/bin/qos-test" -l |
    grep -E '^/.*/vhost-user-blk(-pci)?-tests/' || true)
# basic and indirect (vhost-user-blk); idx, nxvirtq, hotplug, multiqueue
# (vhost-user-blk-pci).
[ "${#tests[@]}" -ge 6 ] || { log "qos-test lists ${#tests[@]} vhost-user-blk tests, not 6"; exit 1; }

# The tests make their disk images in the working directory.
mkdir -p "$repo/target/qtest"
work="$(mktemp -d "$repo/target/qtest/run.XXXXXX")"
trap 'rm -rf "$work"' EXIT
log "${#tests[@]} tests against $SQCQD"
# One qos-test process per test: a failed g_assert aborts the process,
# which would hide the results of the tests after it.
passed=0
failed=0
for t in "${tests[@]}"; do
    rc=0
    (
        cd "$work"
        QTEST_QEMU_BINARY="$out/bin/qemu-system-x86_64" \
        QTEST_QEMU_STORAGE_DAEMON_BINARY="$repo/scripts/qsd-compat.sh" \
        SQCQD_ARGS="${SQCQD_ARGS:-}" \
            timeout 300 "$out/bin/qos-test" --tap -p "$t"
    ) > "$work/tap.txt" 2> "$work/stderr.txt" || rc=$?
    # Passed: it ran, was not skipped, and the process ended well.
    if [ "$rc" = 0 ] && grep -qE "^ok [0-9]+ $t\$" "$work/tap.txt"; then
        passed=$((passed + 1))
        echo "ok ${t##*/}" >&2
    else
        failed=$((failed + 1))
        echo "FAILED ${t##*/} (exit status $rc); the daemon's and QEMU's messages:" >&2
        tail -n 30 "$work/stderr.txt" >&2
    fi
done
echo "qtest: $passed passed, $failed failed"
[ "$failed" = 0 ]
