#!/usr/bin/env bash
# The project's main job on its embedded default: sets up, builds, and
# runs the RFC's comparison (sqcq-compare): randread and randwrite x QD1
# and QD32 x 1, 2 and 4 jobs x every notification mode (notify: classic
# virtio on both sides, the baseline; auto: the same unmodified driver
# against sqcqd's default, --poll auto), each run against a fresh sqcqd
# with a null LUN. Short runs (2 s) by default; pass --long
# for 10 s runs with 3 repeats, --scaling for the multi-worker scaling
# benchmark (sqcqd workers 1 to the CPUs over two devices). Other
# arguments go to sqcq-compare (e.g. --modes notify,sqcq --qd 1 --jobs 1).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --quiet --release -p sqcq-target -p sqcq-bench -p sqcq-compare
exec target/release/sqcq-compare "$@"
