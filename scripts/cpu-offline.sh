#!/usr/bin/env bash
# A CPU really taken offline, and back, under a verified load (issue 30,
# item 3; docs/target.md, "CPU hotplug and cpuset changes").
#
# sqcqd runs two workers bound to CPUs A and B (--poll-cpus A,B), one
# request queue each, and sqcq-bench writes and verifies (crc32c) through
# both queues in doorbell mode. Midway, CPU B goes offline
# (/sys/devices/system/cpu/cpuB/online): worker 1 must keep serving on A,
# say so (log, worker_list's cpu_displaced), and once B is back online be
# bound to B alone again. The load must verify. CPU B is brought back
# online on any exit.
#
# The test suite shows the same with a cpuset change
# (crates/sqcq-target/tests/cpu_hotplug.rs), which every machine allows;
# this script needs root and a machine that lets CPU B go offline, and
# takes that CPU away from everything else for a few seconds.
#
# Usage: scripts/cpu-offline.sh   (env: CPUS=A,B, default the first two
# CPUs of this process; RUNTIME=20; SQCQD, SQCQ_BENCH: binaries, default
# built here in debug)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "cpu-offline: $*"; }
mine=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
first_two=$(python3 -c 'import os, sys; c = sorted(os.sched_getaffinity(0)); print(",".join(map(str, c[:2])))')
cpus=${CPUS:-$first_two}
a=${cpus%,*} b=${cpus#*,}
[ "$a" != "$b" ] || { say "needs two CPUs (this process may use $mine)"; exit 2; }
online=/sys/devices/system/cpu/cpu$b/online
[ -w "$online" ] || { say "cpu$b cannot be taken offline here ($online not writable)"; exit 2; }
runtime=${RUNTIME:-20}

if [ -z "${SQCQD:-}" ] || [ -z "${SQCQ_BENCH:-}" ]; then
    cargo build --quiet -p sqcq-target --bin sqcqd -p sqcq-bench --bin sqcq-bench
fi
sqcqd=${SQCQD:-target/debug/sqcqd}
bench=${SQCQ_BENCH:-target/debug/sqcq-bench}

work=$(mktemp -d "${TMPDIR:-/tmp}/sqcq-cpu-offline.XXXXXX")
daemon="" load=""
cleanup() {
    [ "$(cat "$online")" = 1 ] || { echo 1 > "$online" && say "cpu$b back online (cleanup)"; }
    [ -z "$load" ] || kill "$load" 2>/dev/null || true
    [ -z "$daemon" ] || { kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true; }
    rm -rf "$work"
}
trap cleanup EXIT

"$sqcqd" --socket-path "$work/sock" --admin-socket "$work/admin.sock" --num-queues 2 \
    --workers 2 --poll-cpus "$a,$b" --lun kind=ram,size=64M > "$work/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$work/admin.sock" ] && break; sleep 0.1; done
rpc() { "$sqcqd" rpc --admin-socket "$work/admin.sock" "$@"; }
# worker1 FIELD: a field of worker 1 in worker_list
worker1() {
    rpc worker_list | python3 -c "import json, sys; print(json.dumps(next(w for w in json.load(sys.stdin) if w['id'] == 1)['$1']))"
}
tid=$(grep -l '^sqcq-worker1$' /proc/"$daemon"/task/*/comm | cut -d/ -f5)
allowed() { sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "/proc/$daemon/task/$tid/status"; }
say "sqcqd $daemon, worker 1 (thread $tid) bound to cpu$b: allowed $(allowed)"
[ "$(allowed)" = "$b" ] || { say "FAIL: worker 1 is not bound to cpu$b"; exit 1; }

"$bench" --socket "$work/sock" --mode sqcq --numjobs 2 --rw randwrite --bs 4k --iodepth 8 \
    --size 16M --runtime "$runtime" --time_based --verify crc32c --output-format json \
    > "$work/bench.json" 2> "$work/bench.log" &
load=$!
sleep 3

fail() { say "FAIL: $*"; cat "$work/daemon.log"; exit 1; }
# wait_for WHAT EXPR: up to 10 s for EXPR (a shell test) to hold
wait_for() {
    local i
    for i in $(seq 100); do eval "$2" && return 0; sleep 0.1; done
    fail "not within 10 s: $1"
}
echo 0 > "$online"
say "cpu$b offline; worker 1 allowed on $(allowed)"
wait_for "worker 1 reported off its CPU" '[ "$(worker1 cpu_displaced)" = true ]'
grep -q "moved off cpu$b" "$work/daemon.log" || fail "no log line for the move"
sleep 3
echo 1 > "$online"
say "cpu$b online again"
wait_for "worker 1 back on cpu$b" '[ "$(worker1 cpu_displaced)" = false ]'
[ "$(allowed)" = "$b" ] || fail "worker 1 allowed on $(allowed) after cpu$b came back"
grep -q "back on cpu$b" "$work/daemon.log" || fail "no log line for the return"
moves=$(worker1 cpu_displacements)
wait "$load" || { load=""; cat "$work/bench.log"; fail "the verified load failed"; }
load=""
iops=$(python3 -c "import json, sys; j = json.load(open(sys.argv[1])); print(round(sum(x['write']['iops'] for x in j['jobs'])))" "$work/bench.json")
grep -E "moved off|back on" "$work/daemon.log" | sed 's/^/  /'
say "PASS: worker 1 moved off cpu$b while it was offline ($moves move), served on, and is bound to cpu$b again; ${runtime} s of crc32c-verified random writes through both queues ($iops IOPS) verified"
