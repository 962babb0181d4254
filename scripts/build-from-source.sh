#!/usr/bin/env bash
# Everything the tests build from source, one after the other, each
# cached under its key (scripts/lib/cache.sh), so that a rerun with
# nothing changed costs a few queries:
#   - QEMU 7.2 with patches/qemu/7.2, and its qos-test (scripts/build-qemu.sh 7.2)
#   - the 6.1 guest modules with patches/linux/6.1 (scripts/build-guest-modules.sh 6.1)
#   - QEMU 10.0 with patches/qemu/10.0 (scripts/build-qemu.sh 10.0)
#   - the 6.12 guest kernel with patches/linux/6.12 (scripts/build-guest-modules.sh 6.12)
# in the order the guest runs need them (scripts/test-guests.sh).
#
# scripts/test.sh runs it in the background at a low priority from the
# start of its two lanes: the builds then take the CPU time the host
# tests and the guests leave idle (the cargo tests wait on daemons,
# timers and the Ceph cluster much of the time) instead of a stage of
# their own. Whoever needs a build before it is done waits for it (each
# build holds the lock of its cache entry), and builds it if this script
# failed to.
#
#   scripts/build-from-source.sh     prints the path of each build
set -euo pipefail
cd "$(dirname "$0")/.."
SQCQ_STAGES_LANE=build
# shellcheck source=scripts/lib/stages.sh
source scripts/lib/stages.sh

stage "build: QEMU 7.2 with patches/qemu/7.2 and qos-test"
scripts/build-qemu.sh 7.2
stage "build: the 6.1 guest modules"
scripts/build-guest-modules.sh 6.1
stage "build: QEMU 10.0 with patches/qemu/10.0"
scripts/build-qemu.sh 10.0
stage "build: the 6.12 guest kernel"
scripts/build-guest-modules.sh 6.12
stage "build: done"
