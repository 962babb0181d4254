#!/usr/bin/env bash
# The project's test command (README, `.ci/run`): formatting, lints, the
# proofs (loom with each fence removed, spin on the Promela model), every
# unit and integration test, and a Linux guest under QEMU against sqcqd.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
# The interoperability peer the driver tests run against (rust-vmm's
# vhost-device-scsi), built once into target/tools.
scripts/install-peers.sh

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== sqcq-protocol builds without std"
cargo build --quiet -p sqcq-protocol --no-default-features
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo clippy -p sqcq-target --features fuzzing --quiet -- -D warnings
echo "== loom: each fence of the handshake removed in turn must lose a wakeup"
scripts/check-fences.sh
echo "== spin: the Promela model of NEED_WAKEUP and its fence-less variants"
scripts/check-models.sh
echo "== cargo test"
cargo test --workspace
echo "== fuzz: every target of fuzz/ for 15 s (ASan)"
scripts/fuzz.sh 15
echo "== guest: an unmodified Linux guest under QEMU (TCG) against sqcqd"
cargo build --quiet -p sqcq-target --bin sqcqd
SQCQD=target/debug/sqcqd scripts/guest-test.sh
