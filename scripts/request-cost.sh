#!/usr/bin/env bash
# Instructions per request on the request path, counted by callgrind
# without a clock, threads or wakeups: `examples/request_cost.rs` feeds
# batches of 4 KiB reads to the fuzzing harness's request queue (a RAM
# disk, one thread). The count of a build varies by up to about 10 from
# run to run, so two builds compare closely (docs/benchmarks.md,
# "Instructions per request, in process").
#
#   scripts/request-cost.sh [EXAMPLE...]
#
# Each EXAMPLE is a request_cost binary (default: this tree's, built
# with `cargo build --release -p sqcq-target --features fuzzing
# --example request_cost`). Prints one line per binary and cell: device,
# requests per batch, instructions per request (the run's total minus
# that of a run writing the same but making nothing available, over the
# requests). About a minute per binary.
#
# FUNCTIONS=N adds, under each line, the N functions whose own
# instructions per request (inlined code included, as callgrind_annotate
# --inclusive=no attributes it) differ most between the two runs.
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

total() { # OUT BIN ARGS...: runs under callgrind into OUT, prints the total
    local cg=$1
    shift
    valgrind --tool=callgrind --callgrind-out-file="$cg" "$@" >"$work/out" 2>"$work/err" ||
        { cat "$work/err" "$work/out" >&2; return 1; }
    awk '/^totals:/ { print $2; exit }' "$cg"
}

# Instructions by function in a callgrind output, "count<TAB>function",
# the file part of each entry dropped (inlined code is annotated with the
# file it came from) and the entries of a function added up.
by_function() {
    callgrind_annotate --inclusive=no --auto=no --threshold=100 "$1" 2>/dev/null |
        awk '/^ *[0-9][0-9,]* \(/ {
            n = $1; gsub(/,/, "", n)
            f = $0; sub(/^ *[0-9,]+ \([^)]*\) +/, "", f); sub(/ \[[^]]*\]$/, "", f)
            if (f ~ /PROGRAM TOTALS/) next
            i = index(f, ":"); if (i > 0) f = substr(f, i + 1)
            sum[f] += n
        } END { for (f in sum) printf "%s\t%s\n", sum[f], f }'
}

# The N functions whose per-request cost differs most between RUN and BASE.
top_functions() { # N RUN BASE REQUESTS
    by_function "$3" > "$work/base.fn"
    by_function "$2" | awk -F '\t' -v req="$4" '
        NR == FNR { base[$2] = $1; next }
        { seen[$2] = 1; d = ($1 - base[$2]) / req; printf "%.1f\t%.1f\t%s\n", d < 0 ? -d : d, d, $2 }
        END { for (f in base) if (!(f in seen)) printf "%.1f\t%.1f\t%s\n", base[f] / req, -base[f] / req, f }
        ' "$work/base.fn" - | sort -t "$(printf '\t')" -k1,1gr |
        # Reads all its input: `head` would close the pipe early, and
        # sort's SIGPIPE end the script (pipefail).
        awk -F '\t' -v n="$1" 'NR <= n { printf "    %10s  %s\n", $2, $3 }'
}

printf '%-48s %-5s %6s %10s\n' binary dev batch instr/req
for bin in "$@"; do
    [ -x "$bin" ] || { echo "request-cost: no $bin" >&2; exit 1; }
    for dev in blk scsi; do
        for batch in 1 21; do
            iters=$((REQUESTS / batch))
            base=$(total "$work/base.cg" "$bin" "$dev" "$iters" "$batch" empty)
            run=$(total "$work/run.cg" "$bin" "$dev" "$iters" "$batch")
            printf '%-48s %-5s %6s %10s\n' "$bin" "$dev" "$batch" \
                "$(( (run - base) / (iters * batch) ))"
            if [ "${FUNCTIONS:-0}" -gt 0 ]; then
                top_functions "$FUNCTIONS" "$work/run.cg" "$work/base.cg" $((iters * batch))
            fi
        done
    done
done
