#!/usr/bin/env bash
# The project's test command (README, `.ci/run`): formatting, lints, the
# proofs (loom with each fence removed, spin on the Promela models), every
# unit and integration test, QEMU's own vhost-user-blk tests (qos-test)
# against sqcqd, the unsafe-heavy crates' tests under AddressSanitizer, a
# 3-minute soak (scripts/soak.sh), every fuzz target for a while, and Linux
# guests under QEMU against sqcqd: unmodified, and with VIRTIO_F_SQCQ_POLL
# (patches/linux, patches/qemu); sqcqd killed and restarted, and the guest
# migrated, under a verified fio load.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
# The interoperability peer the driver tests run against (rust-vmm's
# vhost-device-scsi), built once into target/tools.
scripts/install-peers.sh
# The Ceph cluster the RBD tests run against (one monitor, manager and
# OSD on 127.0.0.1), its client settings exported for them; torn down on
# exit.
echo "== ceph: a single-host cluster for the RBD backstore's tests"
ceph_env="$(scripts/ceph-cluster.sh start)"
trap 'scripts/ceph-cluster.sh stop' EXIT
while IFS='=' read -r key value; do
    export "$key=$value"
done <<<"$ceph_env"

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== sqcq-protocol builds without std"
cargo build --quiet -p sqcq-protocol --no-default-features
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo clippy -p sqcq-target --features fuzzing --quiet -- -D warnings
echo "== loom: each fence of the handshake removed in turn must lose a wakeup"
scripts/check-fences.sh
echo "== spin: the Promela models (NEED_WAKEUP; stop, crash and restart) and their failing variants"
scripts/check-models.sh
echo "== cargo test (every peer installed above: none may be skipped)"
SQCQ_REQUIRE_PEERS=1 cargo test --workspace
echo "== qtest: QEMU 7.2's own vhost-user-blk tests (qos-test) against sqcqd"
cargo build --quiet -p sqcq-target --bin sqcqd
SQCQD=target/debug/sqcqd scripts/qtest.sh
echo "== asan: sqcq-backstore, sqcq-target and sqcq-driver tests under AddressSanitizer (target/asan)"
SQCQ_REQUIRE_PEERS=1 scripts/asan.sh
echo "== soak: 3 minutes of kill -9, dropped frontends, moved queues, grown LUNs, reloads and hot-plug under verified load (target/soak/)"
cargo build --quiet -p sqcq-target -p sqcq-bench
scripts/soak.sh --minutes 3
echo "== fuzz: every target of fuzz/ for 15 s (ASan)"
scripts/fuzz.sh 15
echo "== guest: an unmodified Linux guest under QEMU (TCG) against sqcqd"
cargo build --quiet -p sqcq-target --bin sqcqd
rm -f target/guest/measure.txt
SQCQD=target/debug/sqcqd scripts/guest-test.sh --measure --label classic
echo "== guest: VIRTIO_F_SQCQ_POLL in Linux (patches/linux) through QEMU (patches/qemu)"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --sqcq --measure --label sqcq
echo "== guest: the same guest and QEMU against sqcqd --no-sqcq: classic virtio"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --sqcq --daemon-extra --no-sqcq --only-run1
echo "== guest: vhost-user-blk (sqcqd --device-type blk) with Linux's virtio_blk"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --blk
echo "== libvirt: the blk guest as a libvirt domain with two <disk type='vhostuser'>"
SQCQD=target/debug/sqcqd scripts/libvirt-test.sh
echo "== guest: restart without lost I/O: sqcqd killed (-9) and restarted 3 times under fio (vhost-user-blk, reconnect=1)"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --restart
SQCQD=target/debug/sqcqd scripts/guest-test.sh --restart --daemon-extra "--poll ring"
echo "== guest: live migration under fio to a second QEMU and sqcqd on a shared file (blk: classic, ring-poll; the SQCQ_POLL guest over scsi), on the project's QEMU, the two RAMs compared"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --migrate
SQCQD=target/debug/sqcqd scripts/guest-test.sh --migrate --daemon-extra "--poll ring"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --migrate --sqcq
echo "== guest: an unmodified guest against device-side ring polling"
SQCQD=target/debug/sqcqd scripts/guest-test.sh --daemon-extra "--poll ring" \
    --spin-max-us 5000 --measure --label ring-poll --only-run1
scripts/guest-report.sh target/guest/measure.txt
