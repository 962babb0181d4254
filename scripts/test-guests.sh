#!/usr/bin/env bash
# Every Linux guest run of the test command: the guests under QEMU (TCG)
# against sqcqd, unmodified and with VIRTIO_F_SQCQ_POLL over virtio-scsi
# and virtio-blk (patches/linux, patches/qemu), on Debian 12's 6.1 and 6.12
# kernels and on QEMU 7.2 and 10.0; sqcqd killed and restarted, and the
# guest migrated, under a verified fio load; the guest on Ceph RBD disks.
# Each run is one scripts/guest-test.sh command (docs/guest-tests.md).
#
#   scripts/test-guests.sh     alone: builds sqcqd (with fault injection)
#                              unless SQCQD names one; the RBD runs use
#                              the cluster of the environment
#                              (scripts/ceph-cluster.sh start), else their
#                              own
#
# scripts/test.sh runs it as its guest lane, beside the host tests: a TCG
# guest keeps about one of the machine's two CPUs busy and the host tests
# about the other, so the two lanes take the time of the longer one. It
# sets SQCQ_GUEST_AFTER, a file that the host lane creates once its Ceph
# failure tests (which stop the cluster's OSD and monitor,
# crates/sqcq-bench/tests/rbd_failure.rs) are over: the RBD runs wait
# for it, and come after the patched QEMU 7.2's runs, by when the host
# lane's cargo test is over (before them, the lane sat idle waiting for
# it: docs/guest-tests.md, "CI's time"). The runs that need no patched
# QEMU come first, so that
# scripts/build-from-source.sh, which test.sh runs beside both lanes,
# can build that QEMU and the guest kernels meanwhile (each build is
# locked and cached: a run that needs one waits for it, or builds it).
set -euo pipefail
cd "$(dirname "$0")/.."
SQCQ_STAGES_LANE=guest
# shellcheck source=scripts/lib/stages.sh
source scripts/lib/stages.sh

if [ -z "${SQCQD:-}" ]; then
    cargo build --quiet -p sqcq-target --bin sqcqd --features fault-injection
    export SQCQD=target/debug/sqcqd
fi
# the RBD runs wait for the host lane's Ceph failure tests
after_host() {
    [ -n "${SQCQ_GUEST_AFTER:-}" ] || return 0
    local t0=$SECONDS
    while [ ! -e "$SQCQ_GUEST_AFTER" ]; do sleep 2; done
    echo "test-guests: waited $((SECONDS - t0)) s for the host lane's Ceph failure tests"
}
g() { scripts/guest-test.sh "$@"; }
rm -f target/guest/measure.txt

# On Debian's QEMU 7.2 and kernel 6.1, unmodified guests.
stage "guest: an unmodified Linux guest under QEMU (TCG) against sqcqd (--poll kick: classic virtio)"
g --daemon-extra "--poll kick" --measure --label classic
# (`--daemon-extra "--poll ring"` only outside CI: the run against the
# default asserts that its busy queues were served by ring polling)
stage "guest: an unmodified guest against the default (--poll auto: kicks while idle, ring polling while busy)"
g --measure --label auto --only-run1
stage "guest: vhost-user-blk (sqcqd --device-type blk) with Debian's virtio_blk (the default --poll auto)"
g --blk
stage "libvirt: the blk guest as a libvirt domain with two <disk type='vhostuser'>"
scripts/libvirt-test.sh
stage "guest: restart without lost I/O: sqcqd killed (-9) and restarted 3 times under fio (vhost-user-blk, reconnect=1; the default --poll auto, and --poll kick)"
g --restart
g --restart --daemon-extra "--poll kick"

# The patched QEMU 7.2 (patches/qemu/7.2) and the 6.1 series (patches/linux/6.1).
stage "guest: VIRTIO_F_SQCQ_POLL in Linux (patches/linux/6.1) through QEMU (patches/qemu/7.2)"
g --sqcq --measure --label sqcq
stage "guest: VIRTIO_F_SQCQ_POLL on packed rings (QEMU packed=on, sqcqd --packed, patch 8)"
g --sqcq --packed --measure --label sqcq-packed --only-run1
stage "guest: backpressure: the SQCQ_POLL guest on file disks while the host limits the daemon's I/O (sqcqd --max-inflight 4, THROTTLE held back by virtio_scsi)"
g --sqcq --backpressure --only-run1
stage "guest: the same guest and QEMU against sqcqd --no-sqcq: classic virtio"
g --sqcq --daemon-extra --no-sqcq --only-run1
stage "guest: the patched virtio_blk with VIRTIO_F_SQCQ_POLL (patches 9-12, QEMU patch 4)"
g --blk --sqcq --measure --label blk-sqcq
stage "guest: backpressure on virtio_blk, on packed rings: the SQCQ_POLL blk guest (packed=on, bits 34 and 42) on file disks under the host's I/O limit (sqcqd --max-inflight 4, THROTTLE held back by virtio_blk, patch 11)"
g --blk --sqcq --packed --backpressure --only-run1
stage "guest: restart of the SQCQ_POLL virtio_blk guest, and on packed rings (QEMU packed=on, sqcqd --packed: the packed in-flight record)"
g --restart --sqcq
g --restart --packed
stage "guest: live migration under fio to a second QEMU and sqcqd on a shared file (blk: --poll auto, --poll kick; the SQCQ_POLL virtio_blk guest; packed rings), on the project's QEMU, the two RAMs compared"
g --migrate
g --migrate --daemon-extra "--poll kick"
g --migrate --sqcq
g --migrate --packed

stage "guest: on Ceph RBD images of the test cluster: vhost-user-blk (every check; resized with rbd resize in the cluster), vhost-user-scsi (run1), the blk guest restarted three times after kill -9 (lock take-over) and migrated between two sqcqd on one image (lock hand-over)"
after_host
SQCQ_REQUIRE_PEERS=1 g --blk --rbd
SQCQ_REQUIRE_PEERS=1 g --rbd --only-run1
SQCQ_REQUIRE_PEERS=1 g --restart --rbd
SQCQ_REQUIRE_PEERS=1 g --migrate --rbd

stage "guest: the series on Debian 12's 6.12 kernel line (patches/linux/6.12; the guest's kernel built from Debian's linux-source-6.12, the series also compiled with Debian's 6.12 configuration): the blk guest with bit 42 (the other 6.12 runs: docs/guest-tests.md)"
g --blk --sqcq --kernel 6.12 --measure --label blk-sqcq-6.12 --only-run1
stage "guest: QEMU 10.0 (bookworm-backports' source, patches/qemu/10.0): sqcqd killed and restarted under fio behind vhost-user-scsi's reconnect (QEMU 8.2 and later), bit 42 negotiated (the other 10.0 runs: docs/guest-tests.md)"
g --restart --sqcq --scsi --qemu-version 10.0

stage "guest lane done"
scripts/guest-report.sh target/guest/measure.txt
[ -z "${SQCQ_GUEST_AFTER:-}" ] ||
    echo "(these ran beside scripts/test.sh's host tests: the counts hold, the CPU column is the busier machine's)"
