#!/usr/bin/env bash
# The project's main job on its embedded default: sets up, builds, runs.
# Today: sqcq-bench starts sqcqd with a null LUN on a fresh socket and
# runs a 4 KiB random-read load through the userspace virtio-scsi driver
# (5 s, queue depth 1, then queue depth 32). Extra arguments go to
# sqcq-bench and replace the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --quiet --release -p sqcq-target -p sqcq-bench
bench=target/release/sqcq-bench
if [ "$#" -gt 0 ]; then
    exec "$bench" "$@"
fi
for qd in 1 32; do
    "$bench" --rw randread --bs 4k --iodepth "$qd" --runtime 5 --time_based --ramp_time 1
done
