#!/usr/bin/env bash
# Instructions per request on the request path, counted by callgrind
# without a clock, threads or wakeups: `examples/request_cost.rs` feeds
# batches of 4 KiB reads to the fuzzing harness's request queue (a RAM
# disk, one thread). The count of a build is the same from run to run,
# so two builds compare exactly (docs/benchmarks.md, "Instructions per
# request, in process").
#
#   scripts/request-cost.sh [EXAMPLE...]
#
# Each EXAMPLE is a request_cost binary (default: this tree's, built
# with `cargo build --release -p sqcq-target --features fuzzing
# --example request_cost`). Prints one line per binary and cell: device,
# requests per batch, instructions per request (the run's total minus
# that of a run writing the same but making nothing available, over the
# requests). About a minute per binary.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "request-cost: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
if [ $# -eq 0 ]; then
    cargo build --release -q -p sqcq-target --features fuzzing --example request_cost
    set -- target/release/examples/request_cost
fi
REQUESTS=${REQUESTS:-21000}
work=$(mktemp -d /tmp/sqcq-request-cost.XXXXXX)
trap 'rm -rf "$work"' EXIT

total() {
    valgrind --tool=callgrind --callgrind-out-file="$work/cg" "$@" >"$work/out" 2>"$work/err" ||
        { cat "$work/err" "$work/out" >&2; return 1; }
    awk '/^totals:/ { print $2; exit }' "$work/cg"
}

printf '%-48s %-5s %6s %10s\n' binary dev batch instr/req
for bin in "$@"; do
    [ -x "$bin" ] || { echo "request-cost: no $bin" >&2; exit 1; }
    for dev in blk scsi; do
        for batch in 1 21; do
            iters=$((REQUESTS / batch))
            base=$(total "$bin" "$dev" "$iters" "$batch" empty)
            run=$(total "$bin" "$dev" "$iters" "$batch")
            printf '%-48s %-5s %6s %10s\n' "$bin" "$dev" "$batch" \
                "$(( (run - base) / (iters * batch) ))"
        done
    done
done
