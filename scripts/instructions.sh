#!/usr/bin/env bash
# Instructions `sqcqd` executes per I/O, counted by callgrind: the
# difference between a run of LONG and one of SHORT 4 KiB random reads of
# a null LUN by `sqcq-bench` (one queue), divided by LONG - SHORT, so
# that start-up, connection and shutdown cancel out. Independent of the
# machine's load and clock, so a change's cost can be compared with the
# build before it (docs/benchmarks.md, "Instructions per I/O").
#
#   scripts/instructions.sh [BIN_DIR] [REPEATS]
#
# BIN_DIR holds release builds of sqcqd and sqcq-bench (default
# target/release; `cargo build --release` first). Cells: scsi and blk,
# QD1 and QD32, the driver in notify mode (kicks and calls) and the
# daemon in `--poll kick`: a polling daemon's count (the default, `--poll
# auto`, polls a busy ring) would include its spinning, which depends on
# timing.
# Prints one line per cell with the median of REPEATS (default 3) and the
# spread.
set -euo pipefail

cd "$(dirname "$0")/.."
BIN=${1:-target/release}
REPEATS=${2:-3}
SHORT=${SHORT:-2000}
LONG=${LONG:-22000}

command -v valgrind >/dev/null || { echo "instructions.sh: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
for b in sqcqd sqcq-bench; do
    [ -x "$BIN/$b" ] || { echo "instructions.sh: no $BIN/$b (cargo build --release)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/sqcq-instructions.XXXXXX)
trap 'rm -rf "$work"' EXIT

# Total instructions of one sqcqd run serving IOS reads.
count() {
    local dev=$1 qd=$2 ios=$3 out=$work/cg.out sock=$work/vhost.sock
    rm -f "$out" "$sock"
    valgrind --tool=callgrind --callgrind-out-file="$out" \
        "$BIN/sqcqd" --socket-path "$sock" --device-type "$dev" --poll kick \
        --lun kind=null,size=1G >"$work/sqcqd.log" 2>&1 &
    local pid=$!
    # Listening once it says so (the socket file exists a moment before).
    for _ in $(seq 600); do grep -q "listening on" "$work/sqcqd.log" && break; sleep 0.1; done
    "$BIN/sqcq-bench" --socket "$sock" --device-type "$dev" --rw randread --bs 4k \
        --iodepth "$qd" --mode notify --size $((ios * 4096)) \
        --output-format json >"$work/bench.json" 2>"$work/bench.log" ||
        { cat "$work/bench.log" >&2; kill "$pid"; return 1; }
    kill -TERM "$pid"
    wait "$pid" || true
    # callgrind's last line: "totals: <Ir>" (or "summary:").
    awk '/^(totals|summary):/ {print $2}' "$out" | tail -1
}

median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

printf '%-6s %-4s %10s %16s\n' device qd "instr/IO" "runs (min-max)"
for dev in scsi blk; do
    for qd in 1 32; do
        per=()
        for _ in $(seq "$REPEATS"); do
            s=$(count "$dev" "$qd" "$SHORT")
            l=$(count "$dev" "$qd" "$LONG")
            per+=($(( (l - s) / (LONG - SHORT) )))
        done
        med=$(printf '%s\n' "${per[@]}" | median)
        range=$(printf '%s\n' "${per[@]}" | sort -n | awk 'NR==1{a=$1} {b=$1} END{print a "-" b}')
        printf '%-6s %-4s %10s %16s\n' "$dev" "$qd" "$med" "$range"
    done
done
