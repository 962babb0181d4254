#!/usr/bin/env bash
# Backpressure side by side (spec section "Backpressure"; issue 30, item 1):
# a deliberately slow backstore under a load far beyond it, the same daemon
# and driver with and without the THROTTLE signal, in one invocation.
#
# The backstore is a file LUN on this machine's disk, served by sqcqd
# (O_DIRECT, io_uring) from a blkio cgroup of its own that limits its reads
# and writes on that disk to $IOPS a second (v1 blkio.throttle, or v2
# io.max). sqcq-bench drives one vhost-user-blk queue with VIRTIO_F_SQCQ_POLL
# (sqcq-inline), 4 KiB random writes at --iodepth $QD, verified afterwards
# (--verify: every block written is read back and checked).
#
# Three cells, interleaved over $REPEAT rounds, medians:
#   no-limit   the daemon takes whatever the ring holds (no --max-inflight)
#   ignored    --max-inflight $MAX, the driver ignores THROTTLE
#              (sqcq-bench --throttle ignore): the rest waits on the ring
#   honoured   --max-inflight $MAX, the driver honours THROTTLE
#              (--throttle honour): the rest waits in the driver
# Per cell: IOPS; the driver's dispatch-to-completion latency (p50, p99,
# max, after a ramp of $RAMP s: what a guest's request time-out measures,
# the clock starting when the request is handed to the device); the most
# requests the driver had on the ring at once (whole run, ramp included:
# the first burst goes out before the device can say anything); the times it held requests back; the times the
# daemon reached its limit and set THROTTLE.
#
# Usage: scripts/backpressure.sh   (env: IOPS=200 QD=128 MAX=8 RUNTIME=10
# RAMP=2 REPEAT=3; TARGET_CPU/DRIVER_CPU to pin). Needs root (the cgroup) and a
# disk-backed /var/tmp (tmpfs takes no O_DIRECT and no blkio limit).
set -euo pipefail
cd "$(dirname "$0")/.."

iops=${IOPS:-200} qd=${QD:-128} max=${MAX:-8} runtime=${RUNTIME:-10} repeat=${REPEAT:-3}
# The first QD requests go out before the device has seen any (nothing
# can hold them back yet): latency is measured after this ramp.
ramp=${RAMP:-2}
tcpu=${TARGET_CPU:-0} dcpu=${DRIVER_CPU:-1}
work=$(mktemp -d /var/tmp/sqcq-backpressure.XXXXXX)
out=${OUT:-target/backpressure}
mkdir -p "$out"

cargo build --release --quiet -p sqcq-target --bin sqcqd -p sqcq-bench --bin sqcq-bench
bin=target/release

# --------------------------------------------------------------- the cgroup
mm=$(findmnt -no MAJ:MIN -T "$work" | tr -d ' ')
[ -e "/sys/dev/block/$mm" ] || { echo "backpressure: $work is not on a block device" >&2; exit 2; }
[ ! -e "/sys/dev/block/$mm/partition" ] || mm=$(cat "/sys/dev/block/$mm/../dev")
if [ -w /sys/fs/cgroup/blkio/blkio.throttle.write_iops_device ]; then
    cg=/sys/fs/cgroup/blkio/sqcq-backpressure-$$
    mkdir "$cg"
    echo "$mm $iops" > "$cg/blkio.throttle.read_iops_device"
    echo "$mm $iops" > "$cg/blkio.throttle.write_iops_device"
elif grep -qw io /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
    cg=/sys/fs/cgroup/sqcq-backpressure-$$
    mkdir "$cg"
    echo "$mm riops=$iops wiops=$iops" > "$cg/io.max"
else
    echo "backpressure: no blkio (v1) or io (v2) cgroup controller" >&2
    exit 2
fi
daemon=""
cleanup() {
    [ -z "$daemon" ] || { kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true; }
    rmdir "$cg" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# ------------------------------------------------------------------ one run
# run CELL ROUND: a fresh daemon in the cgroup, one bench run against it.
run() {
    local cell=$1 round=$2 extra=() throttle=honour
    case $cell in
        no-limit) ;;
        ignored) extra=(--max-inflight "$max"); throttle=ignore ;;
        honoured) extra=(--max-inflight "$max") ;;
    esac
    rm -f "$work/sock" "$work/stats.json"
    # The daemon joins the cgroup before it execs, so that every thread
    # it starts (workers, io_uring's io-wq) is in it.
    sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$cg" \
        taskset -c "$tcpu" "$bin/sqcqd" --device-type blk --socket-path "$work/sock" \
        --lun "kind=file,path=$work/disk,size=64M,create=on" \
        --stats-file "$work/stats.json" --stats-interval 1 "${extra[@]}" \
        > "$out/$cell-$round.daemon.log" 2>&1 &
    daemon=$!
    local i
    for i in $(seq 100); do [ -S "$work/sock" ] && break; sleep 0.1; done
    taskset -c "$dcpu" "$bin/sqcq-bench" --socket "$work/sock" --device-type blk \
        --mode sqcq-inline --rw randwrite --bs 4k --iodepth "$qd" --size 64M \
        --ramp_time "$ramp" --runtime "$runtime" --time_based --verify crc32c --throttle "$throttle" \
        --io-timeout 120 --output-format json > "$out/$cell-$round.json" 2> "$out/$cell-$round.bench.log"
    kill "$daemon"; wait "$daemon" 2>/dev/null || true; daemon=""
    cp "$work/stats.json" "$out/$cell-$round.stats.json"
}

echo "backpressure: $iops IOPS limit on disk $mm ($cg), QD $qd, limit $max, ${runtime}s x $repeat rounds"
for round in $(seq "$repeat"); do
    for cell in no-limit ignored honoured; do
        run "$cell" "$round"
        echo "backpressure: round $round $cell done"
    done
done

python3 - "$out" "$repeat" <<'PY'
import json, statistics, sys
out, repeat = sys.argv[1], int(sys.argv[2])
rows = []
for cell in ["no-limit", "ignored", "honoured"]:
    f = {k: [] for k in ["iops", "p50", "p99", "max", "ring", "holds", "limited", "throttled", "errors"]}
    for r in range(1, repeat + 1):
        j = json.load(open(f"{out}/{cell}-{r}.json"))
        job = j["jobs"][0]
        w = job["write"]
        lat = w["clat_ns"]
        f["iops"].append(w["iops"])
        f["p50"].append(lat["percentile"]["50.000000"] / 1e6)
        f["p99"].append(lat["percentile"]["99.000000"] / 1e6)
        f["max"].append(lat["max"] / 1e6)
        f["ring"].append(job["sqcq"]["max_in_flight"])
        f["holds"].append(job["sqcq"]["throttle_holds"])
        f["errors"].append(job.get("error", 0))
        s = json.load(open(f"{out}/{cell}-{r}.stats.json"))
        qs = s["queues"] if isinstance(s, dict) else s
        f["limited"].append(sum(q.get("limited", 0) for q in qs))
        f["throttled"].append(sum(q.get("throttled", 0) for q in qs))
    rows.append((cell, {k: statistics.median(v) for k, v in f.items()}))
print()
print("| cell | IOPS | p50 ms | p99 ms | max ms | most on the ring | driver holds | device limited | THROTTLE set | errors |")
print("|---|---|---|---|---|---|---|---|---|---|")
for cell, m in rows:
    print(f"| {cell} | {m['iops']:.0f} | {m['p50']:.1f} | {m['p99']:.1f} | {m['max']:.1f} | "
          f"{m['ring']:.0f} | {m['holds']:.0f} | {m['limited']:.0f} | {m['throttled']:.0f} | {m['errors']:.0f} |")
print(f"\nmedians of {repeat} interleaved rounds; raw results in {out}")
PY
