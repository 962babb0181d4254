#!/usr/bin/env bash
# Shows that each of the four fence(SeqCst) points of the NEED_WAKEUP
# handshake is needed: for each one, build the loom test with that single
# fence removed (--cfg sqcq_omit_fence=...) and expect loom to find the
# lost wakeup (a deadlock) in the direction that fence protects.
#
# Each variant has its own target directory, so repeated runs rebuild only
# what changed.
set -uo pipefail
cd "$(dirname "$0")/.."

passed=0
failed=0
for fence in sq_producer sq_consumer cq_producer cq_consumer; do
    direction=${fence%%_*}
    log=$(mktemp)
    RUSTFLAGS="--cfg sqcq_omit_fence=\"$fence\"" \
        CARGO_TARGET_DIR="target/fences/$fence" \
        cargo test --quiet -p sqcq-protocol --test loom -- "${direction}_handshake" >"$log" 2>&1
    status=$?
    if [ "$status" -ne 0 ] && grep -q "deadlock" "$log"; then
        echo "fence $fence removed: loom finds the lost wakeup (expected): $(grep -m1 -o 'deadlock.*' "$log")"
        passed=$((passed + 1))
    else
        echo "fence $fence removed: loom did NOT find a lost wakeup (exit $status); log follows"
        cat "$log"
        failed=$((failed + 1))
    fi
    rm -f "$log"
done
echo "fence checks: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
