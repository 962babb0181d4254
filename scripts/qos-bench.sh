#!/usr/bin/env bash
# QoS side by side: two blk devices (null disks) of one sqcqd on ONE
# worker, each loaded by its own sqcq-bench at the same time. Rounds
# alternate: both unlimited, then device A limited to LIMIT IOPS
# (`device_set_qos`, at run time). Prints the medians: A's IOPS against
# its limit, and B's IOPS with A limited against B's with neither limited
# (B unharmed: at least as fast, since A takes less of the worker).
#
#   scripts/qos-bench.sh [BIN_DIR] [ROUNDS]
#
# BIN_DIR holds sqcqd and sqcq-bench (default target/release). Knobs
# (environment): LIMIT (IOPS, default 20000), RUNTIME (s per run,
# default 4), QD (default 16), RW (default randread), BS (default 4k),
# CPUS ("target,a,b": CPUs for the worker and the two initiators;
# default none: the 2-CPU machine shares them).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release}
ROUNDS=${2:-3}
LIMIT=${LIMIT:-20000}
RUNTIME=${RUNTIME:-4}
QD=${QD:-16}
RW=${RW:-randread}
BS=${BS:-4k}

for b in sqcqd sqcq-bench; do
    [ -x "$BIN/$b" ] || { echo "qos-bench: no $BIN/$b (cargo build --release)" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "qos-bench: needs python3" >&2; exit 1; }

work=$(mktemp -d /tmp/sqcq-qos.XXXXXX)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/sqcqd.toml" <<EOF
workers = 1
admin-socket = "$work/admin.sock"
[[device]]
type = "blk"
socket-path = "$work/a.sock"
[[device.lun]]
kind = "null"
size = "16G"
[[device]]
type = "blk"
socket-path = "$work/b.sock"
[[device.lun]]
kind = "null"
size = "16G"
EOF
"$BIN/sqcqd" --config "$work/sqcqd.toml" --log-level warn 2>"$work/sqcqd.log" &
pid=$!
for _ in $(seq 100); do
    "$BIN/sqcqd" rpc --admin-socket "$work/admin.sock" daemon_info >/dev/null 2>&1 && break
    sleep 0.1
done
rpc() { "$BIN/sqcqd" rpc --admin-socket "$work/admin.sock" "$@" >/dev/null; }

# IOPS of one sqcq-bench run's JSON.
iops() {
    python3 -c 'import json,sys
j=json.load(open(sys.argv[1]))["jobs"][0]
print(round(j["read"]["iops"]+j["write"]["iops"]))' "$1"
}

# Both devices loaded at once; prints "A B".
pair() {
    local out=$work/run
    "$BIN/sqcq-bench" --socket "$work/a.sock" --device-type blk --rw "$RW" --bs "$BS" \
        --iodepth "$QD" --runtime "$RUNTIME" --output-format json >"$out.a" 2>"$out.a.err" &
    local a=$!
    "$BIN/sqcq-bench" --socket "$work/b.sock" --device-type blk --rw "$RW" --bs "$BS" \
        --iodepth "$QD" --runtime "$RUNTIME" --output-format json >"$out.b" 2>"$out.b.err"
    wait "$a"
    echo "$(iops "$out.a") $(iops "$out.b")"
}

median() { sort -n | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

: >"$work/free"
: >"$work/limited"
for r in $(seq "$ROUNDS"); do
    rpc device_set_qos device=0
    pair >>"$work/free"
    rpc device_set_qos device=0 iops="$LIMIT" burst_ms=10
    pair >>"$work/limited"
    echo "round $r: free $(tail -n1 "$work/free"), A limited $(tail -n1 "$work/limited")" >&2
done

a_free=$(cut -d' ' -f1 "$work/free" | median)
b_free=$(cut -d' ' -f2 "$work/free" | median)
a_lim=$(cut -d' ' -f1 "$work/limited" | median)
b_lim=$(cut -d' ' -f2 "$work/limited" | median)
echo "QoS on one worker: $RW $BS QD$QD, ${RUNTIME}s runs, $ROUNDS rounds (medians)"
printf '%-34s %10s %10s\n' "" "A IOPS" "B IOPS"
printf '%-34s %10d %10d\n' "neither limited" "$a_free" "$b_free"
printf '%-34s %10d %10d\n' "A limited to $LIMIT IOPS" "$a_lim" "$b_lim"
awk -v a="$a_lim" -v l="$LIMIT" -v bl="$b_lim" -v bf="$b_free" 'BEGIN {
    printf "A at %.3fx its limit; B at %.2fx of its IOPS with neither limited\n", a / l, bl / bf }'
