#!/usr/bin/env bash
# Shows that each of the four fence(SeqCst) points of the NEED_WAKEUP
# handshake is needed: for each one, build the loom test with that single
# fence removed (--cfg sqcq_omit_fence=...) and expect loom to find the
# lost wakeup (a deadlock) in the direction that fence protects.
#
# The loom test compiles handshake.rs itself (#[path]), so the cfg is
# given to that one test crate (cargo rustc), not to every crate through
# RUSTFLAGS: the dependencies are built once, in the target directory
# `cargo test` uses, and only the test is rebuilt for each variant.
set -uo pipefail
cd "$(dirname "$0")/.."

passed=0
failed=0
for fence in sq_producer sq_consumer cq_producer cq_consumer; do
    direction=${fence%%_*}
    log=$(mktemp)
    bin=$(cargo rustc --quiet -p sqcq-protocol --test loom --profile test \
        --message-format=json -- --cfg "sqcq_omit_fence=\"$fence\"" 2>"$log" |
        grep -o '"executable":"[^"]*"' | tail -n 1 | cut -d'"' -f4)
    if [ -n "$bin" ]; then
        "$bin" --quiet "${direction}_handshake" >>"$log" 2>&1
    else
        false
    fi
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
