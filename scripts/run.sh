#!/usr/bin/env bash
# The project's main job on its embedded default: sets up, builds, runs.
# Today: the doorbell handshake against classic eventfd notification, two
# threads at queue depth 1 (the device and driver crates will grow this
# into the full mode comparison). Extra arguments go to the program.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo run --quiet --release -p sqcq-protocol --example pingpong -- "$@"
