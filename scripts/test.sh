#!/usr/bin/env bash
# The project's test command (README, `.ci/run`): formatting, no new
# import cycle between a crate's modules, the spec's LaTeX rendition in
# sync with its Markdown, lints, the proofs (loom with
# each fence removed, spin on the Promela models), every unit and
# integration test, QEMU's own vhost-user-blk tests (qos-test)
# against sqcqd, the unsafe-heavy crates' tests under AddressSanitizer, a
# 3-minute soak (scripts/soak.sh), every fuzz target for a while, the
# Debian package installed and its service run, and every Linux guest run
# (scripts/test-guests.sh): unmodified guests, and VIRTIO_F_SQCQ_POLL
# over virtio-scsi and virtio-blk (patches/linux, patches/qemu), on Debian
# 12's 6.1 and 6.12 kernels and on QEMU 7.2 and 10.0; sqcqd killed and
# restarted, and the guest migrated, under a verified fio load; the guest
# on Ceph RBD disks, and migrated between two sqcqd on one RBD image.
#
# Two lanes, as soon as the guests' daemon is built (after the quick
# source checks and cpu-offline, which takes a CPU away): the guest runs
# (scripts/test-guests.sh, its output in target/ci/guests.log, printed
# when it ends) beside the host tests. A TCG guest keeps about one of the
# two CPUs busy and the host tests, which wait on daemons, timers and the
# Ceph cluster much of the time, about the other, so the run takes about
# the longer lane's time (figures: docs/guest-tests.md, "CI's time").
# What the guests need from source (the patched QEMUs, the guest kernels;
# each locked and cached per entry) is built beside both at a low
# priority (scripts/build-from-source.sh), in the CPU time they leave
# idle, while the guest lane runs first the guests that need none of it.
set -euo pipefail
cd "$(dirname "$0")/.."


ci=target/ci
mkdir -p "$ci"
rm -f "$ci"/stages.txt "$ci"/guests.log "$ci"/builds.log "$ci"/host-ceph-tests.done
export SQCQ_STAGES_FILE="$PWD/$ci/stages.txt" SQCQ_STAGES_LANE=host
# shellcheck source=scripts/lib/stages.sh
source scripts/lib/stages.sh

# On exit, whatever ended it: the guest lane and the background builds
# stopped if they still run (each its whole process group: QEMUs, daemons
# and compilers included) and the tail of their logs shown, the Ceph
# cluster torn down, every stage's start listed.
guest_lane=""
builds=""
stop_group() { # PID LOG
    kill -0 "$1" 2>/dev/null || return 0
    echo "== still running, stopped: $2; its end:"
    # the harnesses stop their QEMUs and daemons on TERM
    kill -TERM -- "-$1" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$1" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    tail -n 60 "$2" || true
}
finish() {
    local rc=$?
    [ -z "$guest_lane" ] || stop_group "$guest_lane" "$ci/guests.log"
    [ -z "$builds" ] || stop_group "$builds" "$ci/builds.log"
    scripts/ceph-cluster.sh stop || true
    stage_report
    exit "$rc"
}
trap finish EXIT

stage "setup: packages"
scripts/setup.sh
# The Ceph cluster the RBD tests run against (one monitor, manager and
# OSD on 127.0.0.1), its client settings exported for them and for the
# guests; torn down on exit.
stage "ceph: a single-host cluster for the RBD backstore's tests"
ceph_env="$(scripts/ceph-cluster.sh start)"
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
stage "build: sqcqd with fault injection (the guests' and the qtests' daemon), sqcq-bench"
# sqcqd with its fault injection (the qtests' and the guests' daemon),
# kept as a copy that cargo test cannot rebuild without the feature; then
# sqcq-bench. (Not `-p sqcq-target --features sqcq-target/fault-injection`:
# sqcq-target names itself as a dev-dependency, so that syntax enables the
# feature on the dev-dependency, which a binary build leaves out.)
cargo build --quiet -p sqcq-target --bin sqcqd --features fault-injection
cp target/debug/sqcqd "$ci/sqcqd"
cargo build --quiet -p sqcq-bench
stage "cpu-offline: a bound worker's CPU really taken offline and back under a verified load"
# The cpuset variant is a cargo test; this one needs a machine that lets a
# CPU go offline (exit 2 otherwise, reported and not a failure).
rc=0
RUNTIME=12 SQCQD=target/debug/sqcqd SQCQ_BENCH=target/debug/sqcq-bench scripts/cpu-offline.sh || rc=$?
case $rc in
    0) ;;
    2) echo "cpu-offline: SKIPPED, this machine lets no CPU go offline (tests/cpu_hotplug.rs covered the cpuset case)" ;;
    *) exit "$rc" ;;
esac

stage "guest lane: every guest run (scripts/test-guests.sh) from now on beside the host tests, its output in $ci/guests.log"
# each in its own process group (setsid), so that finish() can stop all
# of it
SQCQD="$ci/sqcqd" SQCQ_GUEST_AFTER="$ci/host-ceph-tests.done" \
    setsid scripts/test-guests.sh > "$ci/guests.log" 2>&1 &
guest_lane=$!
stage "builds from source in the background at nice 10 (scripts/build-from-source.sh: QEMU 7.2 and 10.0 with their patches, the 6.1 modules, the 6.12 kernel), its output in $ci/builds.log"
setsid nice -n 10 scripts/build-from-source.sh > "$ci/builds.log" 2>&1 &
builds=$!

stage "peers: rust-vmm's vhost-device-scsi, the interoperability peer of the driver tests (built once into target/tools)"
scripts/install-peers.sh
stage "sqcq-protocol builds without std"
cargo build --quiet -p sqcq-protocol --no-default-features
stage "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo clippy -p sqcq-target --features fuzzing --lib --examples --quiet -- -D warnings
cargo clippy -p sqcq-target --features stage-clock --lib --bins --quiet -- -D warnings
stage "loom: each fence of the handshake removed in turn must lose a wakeup"
scripts/check-fences.sh
stage "spin: the Promela models (NEED_WAKEUP; backpressure; stop, crash and restart; packed rings) and their failing variants"
scripts/check-models.sh

stage "cargo test (every peer installed above: none may be skipped)"
SQCQ_REQUIRE_PEERS=1 cargo test --workspace
# The fuzz entry points' own tests (behind the `fuzzing` feature).
cargo test --quiet -p sqcq-target --features fuzzing --lib fuzzing::
# the Ceph failure tests are over: the guest lane's RBD runs may start
touch "$ci/host-ceph-tests.done"
stage "qtest: QEMU 7.2's own vhost-user-blk tests (qos-test) against sqcqd"
SQCQD="$ci/sqcqd" scripts/qtest.sh
stage "asan: sqcq-backstore, sqcq-target and sqcq-driver tests under AddressSanitizer (target/asan)"
SQCQ_REQUIRE_PEERS=1 scripts/asan.sh
stage "soak: 3 minutes of kill -9, dropped frontends, moved queues, grown LUNs, reloads and hot-plug under verified load (target/soak/)"
cargo build --quiet -p sqcq-target --bin sqcqd --features fault-injection
cargo build --quiet -p sqcq-bench
scripts/soak.sh --minutes 3
stage "fuzz: every target of fuzz/ for 15 s (ASan)"
scripts/fuzz.sh 15
stage "deb: the Debian package (release build, scripts/build-deb.sh) installed, checked by lintian, run from its unit as systemd would, removed and purged (scripts/deb-test.sh)"
deb=$(scripts/build-deb.sh)
# dpkg -i fails rather than waits while the guest lane installs a package
source scripts/lib/packages.sh
package_lock scripts/deb-test.sh "$deb"

stage "host lane done: waiting for the background builds and the guest lane"
rc=0
wait "$builds" || rc=$?
builds=""
[ "$rc" = 0 ] || { echo "== the builds failed (exit $rc):"; cat "$ci/builds.log"; exit "$rc"; }
wait "$guest_lane" || rc=$?
guest_lane=""
echo "== the guest lane ($ci/guests.log):"
cat "$ci/guests.log"
[ "$rc" = 0 ] || { echo "== the guest lane failed (exit $rc)"; exit "$rc"; }
