#!/usr/bin/env bash
# The project's test command (README, `.ci/run`): formatting, no new
# import cycle between a crate's modules, the spec's LaTeX rendition in
# sync with its Markdown, lints, the proofs (loom with
# each fence removed, spin on the Promela models), every unit and
# integration test, QEMU's own vhost-user-blk tests (qos-test)
# against sqcqd, the unsafe-heavy crates' tests under AddressSanitizer, a
# 3-minute soak (scripts/soak.sh), every fuzz target for a while, the
# Debian package installed and its service run, and Linux
# guests under QEMU against sqcqd: unmodified, and with VIRTIO_F_SQCQ_POLL
# over virtio-scsi and virtio-blk (patches/linux, patches/qemu), on Debian
# 12's 6.1 and 6.12 kernels and on QEMU 7.2 and 10.0; sqcqd killed and
# restarted, and the guest migrated, under a verified fio load; the guest
# on Ceph RBD disks, and migrated between two sqcqd on one RBD image.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage is announced with the time since the start, and the
# durations are listed at the end (and on failure), so that a slow CI run
# shows where its time went.
stages=()
stage() {
    stages+=("$(printf '%5d s  %s' "$SECONDS" "$1")")
    echo "== [$(printf '%d:%02d' $((SECONDS / 60)) $((SECONDS % 60)))] $1"
}
stage_report() {
    echo "== stages (start time since the beginning; total $SECONDS s)"
    printf '%s\n' "${stages[@]}"
}

stage "setup: packages, peers"
scripts/setup.sh
# The interoperability peer the driver tests run against (rust-vmm's
# vhost-device-scsi), built once into target/tools.
scripts/install-peers.sh
# The Ceph cluster the RBD tests run against (one monitor, manager and
# OSD on 127.0.0.1), its client settings exported for them; torn down on
# exit.
stage "ceph: a single-host cluster for the RBD backstore's tests"
ceph_env="$(scripts/ceph-cluster.sh start)"
trap 'scripts/ceph-cluster.sh stop; stage_report' EXIT
while IFS='=' read -r key value; do
    export "$key=$value"
done <<<"$ceph_env"

stage "cargo fmt --check"
cargo fmt --all --check
stage "module cycles: no import cycle between the modules of a crate beyond scripts/module-cycles.allow"
scripts/module-cycles.py --self-test
scripts/module-cycles.py --check scripts/module-cycles.allow
stage "spec: the LaTeX rendition (docs/spec/tex) in the same words as docs/spec/virtio-sqcq.md"
scripts/spec-sync.py --self-test
scripts/spec-sync.py
stage "sqcq-protocol builds without std"
cargo build --quiet -p sqcq-protocol --no-default-features
stage "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo clippy -p sqcq-target --features fuzzing --lib --examples --quiet -- -D warnings
stage "loom: each fence of the handshake removed in turn must lose a wakeup"
scripts/check-fences.sh
stage "spin: the Promela models (NEED_WAKEUP; backpressure; stop, crash and restart; packed rings) and their failing variants"
scripts/check-models.sh
stage "cargo test (every peer installed above: none may be skipped)"
SQCQ_REQUIRE_PEERS=1 cargo test --workspace
# The fuzz entry points' own tests (behind the `fuzzing` feature).
cargo test --quiet -p sqcq-target --features fuzzing --lib fuzzing::
stage "cpu-offline: a bound worker's CPU really taken offline and back under a verified load"
# The cpuset variant is a cargo test; this one needs a machine that lets
# a CPU go offline (exit 2 otherwise, reported and not a failure).
rc=0
RUNTIME=12 SQCQD=target/debug/sqcqd SQCQ_BENCH=target/debug/sqcq-bench scripts/cpu-offline.sh || rc=$?
case $rc in
    0) ;;
    2) echo "cpu-offline: SKIPPED, this machine lets no CPU go offline (tests/cpu_hotplug.rs covered the cpuset case)" ;;
    *) exit "$rc" ;;
esac
stage "qtest: QEMU 7.2's own vhost-user-blk tests (qos-test) against sqcqd"
cargo build --quiet -p sqcq-target --bin sqcqd --features fault-injection
SQCQD=target/debug/sqcqd scripts/qtest.sh
stage "asan: sqcq-backstore, sqcq-target and sqcq-driver tests under AddressSanitizer (target/asan)"
SQCQ_REQUIRE_PEERS=1 scripts/asan.sh
stage "soak: 3 minutes of kill -9, dropped frontends, moved queues, grown LUNs, reloads and hot-plug under verified load (target/soak/)"
cargo build --quiet -p sqcq-target -p sqcq-bench --features sqcq-target/fault-injection
scripts/soak.sh --minutes 3
stage "fuzz: every target of fuzz/ for 15 s (ASan)"
scripts/fuzz.sh 15
stage "deb: the Debian package (release build, scripts/build-deb.sh) installed, checked by lintian, run from its unit as systemd would, removed and purged (scripts/deb-test.sh)"
deb=$(scripts/build-deb.sh)
scripts/deb-test.sh "$deb"
stage "guest: an unmodified Linux guest under QEMU (TCG) against sqcqd"
cargo build --quiet -p sqcq-target --bin sqcqd --features fault-injection
rm -f target/guest/measure.txt
SQCQD=target/debug/sqcqd scripts/guest-test.sh --daemon-extra "--poll kick" --measure --label classic
stage "guest: VIRTIO_F_SQCQ_POLL in Linux (patches/linux/6.1) through QEMU (patches/qemu/7.2)"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --sqcq --measure --label sqcq
stage "guest: VIRTIO_F_SQCQ_POLL on packed rings (QEMU packed=on, sqcqd --packed, patch 8)"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --sqcq --packed --measure --label sqcq-packed --only-run1
stage "guest: backpressure: the SQCQ_POLL guest on file disks while the host limits the daemon's I/O (sqcqd --max-inflight 4, THROTTLE held back by virtio_scsi)"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --sqcq --backpressure --only-run1
stage "guest: the same guest and QEMU against sqcqd --no-sqcq: classic virtio"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --sqcq --daemon-extra --no-sqcq --only-run1
stage "guest: vhost-user-blk (sqcqd --device-type blk) with Linux's virtio_blk: Debian's (the default --poll auto), and the patched one with VIRTIO_F_SQCQ_POLL (patches 9-10, QEMU patch 4)"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --blk
SQCQD=target/debug/sqcqd scripts/guest-test.sh --blk --sqcq --measure --label blk-sqcq
stage "libvirt: the blk guest as a libvirt domain with two <disk type='vhostuser'>"
SQCQD=target/debug/sqcqd scripts/libvirt-test.sh
stage "guest: restart without lost I/O: sqcqd killed (-9) and restarted 3 times under fio (vhost-user-blk, reconnect=1; the default --poll auto, --poll kick, and the SQCQ_POLL virtio_blk)"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --restart
SQCQD=target/debug/sqcqd scripts/guest-test.sh --restart --daemon-extra "--poll kick"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --restart --sqcq
stage "guest: packed rings (QEMU packed=on, sqcqd --packed): restart under fio (the packed in-flight record) and live migration"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --restart --packed
SQCQD=target/debug/sqcqd scripts/guest-test.sh --migrate --packed
stage "guest: live migration under fio to a second QEMU and sqcqd on a shared file (blk: --poll auto, --poll kick; the SQCQ_POLL guest over blk and over scsi), on the project's QEMU, the two RAMs compared"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --migrate
SQCQD=target/debug/sqcqd scripts/guest-test.sh --migrate --daemon-extra "--poll kick"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --migrate --sqcq
stage "guest: the series on Debian 12's 6.12 kernel line (patches/linux/6.12; the guest's kernel built from Debian's linux-source-6.12, the series also compiled with Debian's 6.12 configuration): the blk guest with bit 42 (the other 6.12 runs: docs/guest-tests.md)"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --blk --sqcq --kernel 6.12 --measure --label blk-sqcq-6.12 --only-run1
stage "guest: QEMU 10.0 (bookworm-backports' source, patches/qemu/10.0): sqcqd killed and restarted under fio behind vhost-user-scsi's reconnect (QEMU 8.2 and later), bit 42 negotiated (the other 10.0 runs: docs/guest-tests.md)"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --restart --sqcq --scsi --qemu-version 10.0
stage "guest: on Ceph RBD images of the test cluster: vhost-user-blk (every check; resized with rbd resize in the cluster), vhost-user-scsi (run1), the blk guest migrated between two sqcqd on one image (lock hand-over) and restarted three times after kill -9 (lock take-over)"
SQCQ_REQUIRE_PEERS=1 SQCQD=target/debug/sqcqd scripts/guest-test.sh --blk --rbd
SQCQ_REQUIRE_PEERS=1 SQCQD=target/debug/sqcqd scripts/guest-test.sh --rbd --only-run1
SQCQ_REQUIRE_PEERS=1 SQCQD=target/debug/sqcqd scripts/guest-test.sh --migrate --rbd
SQCQ_REQUIRE_PEERS=1 SQCQD=target/debug/sqcqd scripts/guest-test.sh --restart --rbd
stage "guest: an unmodified guest against device-side ring polling, and against the default (--poll auto)"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --daemon-extra "--poll ring" \
    --spin-max-us 5000 --measure --label ring-poll --only-run1
SQCQD=target/debug/sqcqd scripts/guest-test.sh --measure --label auto --only-run1
scripts/guest-report.sh target/guest/measure.txt
