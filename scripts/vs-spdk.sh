#!/usr/bin/env bash
# sqcq side by side with SPDK on this machine: SPDK's vhost-scsi target
# and its initiator (bdevperf, virtio-user SCSI bdev) against sqcqd and
# sqcq-bench, each cell in one invocation, interleaved, repeated.
#
#   SPDK_DIR=<an SPDK tree you built> scripts/vs-spdk.sh [options]
#
# SPDK is optional and never part of the project: this script only runs a
# build you made aside from SPDK's public source (build/bin/vhost,
# build/examples/bdevperf, scripts/rpc.py); it never fetches or builds
# SPDK. Neither the README's main job nor CI need it.
#
# Cells (null device, 4 KiB, one request queue, one target thread on
# TARGET_CPU, one initiator thread on INIT_CPU; SPDK's target polls, the
# others as named):
#   bdevperf   -> spdk          SPDK vhost, null bdev
#   sqcq-bench -> spdk          ring-poll (what SPDK's target offers)
#   bdevperf   -> sqcqd-ring    sqcqd --poll ring
#   bdevperf   -> sqcqd-kick    sqcqd --poll kick (kicks and calls)
#   bdevperf   -> sqcqd-auto    sqcqd's default, --poll auto (ring polling
#                               within its measured wakeup bound)
#   sqcq-bench -> sqcqd         sqcq-inline, sqcq and ring-poll (bit 42 or
#                               not: the project's best doorbell modes)
# With --scaling the same with 2 request queues on 2 target threads (SPDK:
# 2 reactors), 2 initiator jobs (bdevperf: 2 reactors).
# With --device blk every target serves a virtio-blk disk (SPDK's vhost-blk
# controller, sqcqd --device-type blk) and one more cell joins:
#   sqcq-bench -> qsd           ring-poll against QEMU's qemu-storage-daemon,
#                               vhost-user-blk export in an iothread (which
#                               polls adaptively, poll-max-ns 32 us)
# (bdevperf cannot drive qemu-storage-daemon: its virtio-user initiator
# reads 256 bytes of configuration space, which qsd refuses; sqcq-bench's
# ring-poll, which polls with notifications off like bdevperf, is the
# same driver for SPDK, sqcqd and qsd.)
# With --disk the disk is a real one instead of a null device: a 1 GiB
# file in /dev/shm written full first (shm), a loop device with direct I/O
# over such a file (loop), or an existing file or block device (a path,
# used whole and overwritten by the write runs). SPDK serves it with its
# uring bdev (--spdk-bdev aio: its aio bdev), sqcqd with its file
# backstore (io_uring, O_DIRECT), qemu-storage-daemon with its file driver
# (host_device for a block device; aio=io_uring, cache.direct=on).
#
# A repeat runs each rw/QD's cells back to back, SPDK's first in odd
# repeats and sqcqd's first in even ones. Before and after each run, sqcq-c2c measures how long a
# cache line takes between the two CPUs and back: on a VM the host moves
# the vCPUs between cores that share a cache and cores that do not every
# few seconds, and every polling program's rate follows (the figures are
# in docs/benchmarks.md, "Cache-line round trip between the two vCPUs").
# A run is "near" or "far" when both probes agree (C2C_FAR_NS is the line
# between), "mixed" otherwise; a cell's ratio is its median IOPS over the
# baseline's median among the runs of the same placement, one table per
# placement, after a table of all runs (where the host keeps the vCPUs on
# one kind of pair, the placement split only drops runs).
# For each run: IOPS, mean and median (p50) latency, and CPU ns per I/O of
# each side (the target's process, and the rest of the machine, i.e. the
# initiator). The summary sets QD1's p50 against the cache line round trip
# measured in the same runs: the physical floor of a polled request, which
# needs at least one line to go from the initiator to the target and one
# to come back. Its last table pairs each run with bdevperf -> SPDK's run
# of the same repeat when both ran with the vCPUs placed alike (both near
# or both far), and gives the median and range of those ratios: on a host
# that moves the vCPUs every few seconds, runs seconds apart compare
# better than medians of runs minutes apart (--target-half keeps a pair
# seconds apart).
# After each repeat's last cells, sqcqd's CPU over IDLE_SECS with no load.
# SPDK's target is started for each of its runs (its reactor never sleeps
# and would hold a probe's CPU).
# With a stage-clock build of sqcqd in SQCQ_BIN (cargo's --features
# sqcq-target/stage-clock), each sqcqd run's reports go to
# stage-clock.tsv and the summary ends with them: sqcqd's nanoseconds per
# request by stage (docs/benchmarks.md, "The target's time per request,
# in place").
#
# Options:
#   --reps N        repeats (default 3)
#   --secs S        seconds per run (default 5)
#   --qd "1 32"     queue depths
#   --rw "randread randwrite"
#   --scaling       2 queues / 2 target threads / 2 jobs instead of 1
#   --target-half   only bdevperf -> spdk and bdevperf -> sqcqd-ring (the
#                   target half: the same driver against each target), for
#                   many short repeats (e.g. --reps 15 --secs 2)
#   --device T      scsi (default) or blk (adds qemu-storage-daemon)
#   --disk D        null (default), shm, loop, or a file or block device
#   --spdk-bdev B   uring (default) or aio: SPDK's bdev for --disk
#   --out DIR       results (default target/vs-spdk/<stamp>)
# sqcq-bench runs like bdevperf's virtio-user driver, which has no indirect
# descriptors (SPDK's include/spdk_internal/virtio.h): BENCH_OPTS defaults
# to --no-indirect. With them (Linux's choice) SPDK's target took 15-25%
# fewer of sqcq-bench's requests at QD32; sqcqd 3-6% fewer.
# Environment: SPDK_DIR (required), SQCQ_BIN (default target/release, built
# here if missing), TARGET_CPU (0), INIT_CPU (1), IDLE_SECS (10),
# C2C_FAR_NS (300), BENCH_OPTS (--no-indirect), PYTHON, QSD_BIN
# (qemu-storage-daemon in PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

reps=3 secs=5 qds="1 32" rws="randread randwrite" scaling=0 half=0 out="" device=scsi disk=null spdk_bdev=uring
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) reps=$2; shift ;;
        --secs) secs=$2; shift ;;
        --qd) qds=$2; shift ;;
        --rw) rws=$2; shift ;;
        --scaling) scaling=1 ;;
        --target-half) half=1 ;;
        --device) device=$2; shift ;;
        --disk) disk=$2; shift ;;
        --spdk-bdev) spdk_bdev=$2; shift ;;
        --out) out=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "vs-spdk: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
case "$device" in scsi|blk) ;; *) echo "vs-spdk: --device scsi or blk, not $device" >&2; exit 2 ;; esac
case "$spdk_bdev" in uring|aio) ;; *) echo "vs-spdk: --spdk-bdev uring or aio, not $spdk_bdev" >&2; exit 2 ;; esac

: "${SPDK_DIR:?SPDK_DIR: an SPDK tree built aside (build/bin/vhost, build/examples/bdevperf)}"
for f in build/bin/vhost build/examples/bdevperf scripts/rpc.py; do
    [ -e "$SPDK_DIR/$f" ] || { echo "vs-spdk: $SPDK_DIR/$f missing: build SPDK first (aside)" >&2; exit 2; }
done
py=${PYTHON:-/usr/bin/python3}
tcpu=${TARGET_CPU:-0} icpu=${INIT_CPU:-1} idle_secs=${IDLE_SECS:-10}
bin=${SQCQ_BIN:-$root/target/release}
if [ -z "${SQCQ_BIN:-}" ]; then
    cargo build --quiet --release -p sqcq-target -p sqcq-bench
fi
far_ns=${C2C_FAR_NS:-300}
read -r -a bench_opts <<< "${BENCH_OPTS---no-indirect}"
out=${out:-$root/target/vs-spdk/$(date +%Y%m%d-%H%M%S)}
run=$out/run
mkdir -p "$run"
tsv=$out/results.tsv
export LD_LIBRARY_PATH="$SPDK_DIR/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec > >(tee -a "$out/log.txt") 2>&1
qsd_bin=${QSD_BIN:-$(command -v qemu-storage-daemon || true)}
if [ "$device" = blk ] && [ -z "$qsd_bin" ]; then
    echo "vs-spdk: --device blk compares with qemu-storage-daemon: install it (scripts/setup.sh) or set QSD_BIN" >&2
    exit 2
fi

# ------------------------------------------------------------ the disk
# $path: the file or block device every target serves ("" for null).
path="" shm_file="" loop_dev=""
cleanup_disk() {
    [ -z "$loop_dev" ] || losetup -d "$loop_dev" 2>/dev/null || true
    [ -z "$shm_file" ] || rm -f "$shm_file"
}
case "$disk" in
    null) ;;
    shm|loop)
        shm_file=/dev/shm/sqcq-vs-spdk-$$.img
        dd if=/dev/zero of="$shm_file" bs=1M count=1024 status=none
        path=$shm_file
        if [ "$disk" = loop ]; then
            loop_dev=$(losetup --direct-io=on --show -f "$shm_file")
            path=$loop_dev
        fi ;;
    *)
        [ -e "$disk" ] || { echo "vs-spdk: --disk $disk: no such file or device" >&2; exit 2; }
        path=$disk ;;
esac

# ------------------------------------------------------------ machine
hz=$(getconf CLK_TCK)
mask() { local m=0 c; for c in "$@"; do m=$((m | (1 << c))); done; printf '0x%x' "$m"; }
if [ "$scaling" = 1 ]; then
    # Both SPDK apps on both CPUs: each would lock its cores.
    nq=2 tmask=$(mask 0 1) imask=$(mask 0 1) poll_cpus=0,1 workers=2 pin=(env)
    # bdevperf: a job on each reactor (-C), each its own queue.
    spdk_opts=(--disable-cpumask-locks) bdevperf_opts=(-C)
else
    nq=1 tmask=$(mask "$tcpu") imask=$(mask "$icpu") poll_cpus=$tcpu workers=1 pin=(taskset -c "$icpu")
    spdk_opts=() bdevperf_opts=()
fi
mkdir -p /dev/hugepages
mountpoint -q /dev/hugepages || mount -t hugetlbfs nodev /dev/hugepages
[ "$(cat /proc/sys/vm/nr_hugepages)" -ge 1024 ] || echo 1024 > /proc/sys/vm/nr_hugepages
ticks() { awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
busy() { awk '/^cpu /{ print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }

echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs, kernel $(uname -r)"
echo "# sqcq $("$bin/sqcqd" --version) $(git -C "$root" rev-parse --short HEAD 2>/dev/null || true); SPDK $(cat "$SPDK_DIR/VERSION" 2>/dev/null || git -C "$SPDK_DIR" describe --tags 2>/dev/null || echo '?')"
echo "# reps=$reps secs=$secs qd=[$qds] rw=[$rws] queues=$nq target CPUs $tmask, initiator CPUs $imask; sqcq-bench ${bench_opts[*]}"
echo "# device $device, disk $disk${path:+ ($path; SPDK $spdk_bdev bdev)}${qsd_bin:+; $("$qsd_bin" --version | head -1)}"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'rep\tinitiator\ttarget\tmode\trw\tqd\tiops\tlat_us\tp50_us\ttarget_ns_io\tinitiator_ns_io\tc2c_before_ns\tc2c_after_ns\n' > "$tsv"

# ------------------------------------------------------------ targets
tpid=""
spdk_rpc() { "$py" "$SPDK_DIR/scripts/rpc.py" -s "$run/vhost.rpc" "$@" > /dev/null; }
start_spdk() {
    rm -f "$run/vhost.0" "$run/vhost.rpc"
    setsid "$SPDK_DIR/build/bin/vhost" -m "$tmask" "${spdk_opts[@]}" -u -s 256 -S "$run" -r "$run/vhost.rpc" \
        > "$run/vhost.log" 2>&1 < /dev/null &
    tpid=$!
    for _ in $(seq 100); do [ -S "$run/vhost.rpc" ] && break; sleep 0.1; done
    if [ -n "$path" ]; then
        spdk_rpc "bdev_${spdk_bdev}_create" "$path" Disk0 512
    else
        spdk_rpc bdev_null_create Disk0 1024 512
    fi
    if [ "$device" = blk ]; then
        spdk_rpc vhost_create_blk_controller --cpumask "$tmask" vhost.0 Disk0
    else
        spdk_rpc vhost_create_scsi_controller --cpumask "$tmask" vhost.0
        spdk_rpc vhost_scsi_controller_add_target vhost.0 0 Disk0
    fi
    [ -S "$run/vhost.0" ] || { cat "$run/vhost.log"; exit 1; }
    sock=$run/vhost.0
}
start_sqcqd() { # POLL
    rm -f "$run/sqcqd.sock"
    local lun=kind=null,size=1G
    [ -z "$path" ] || lun=kind=file,path=$path
    setsid "$bin/sqcqd" --socket-path "$run/sqcqd.sock" --device-type "$device" --lun "$lun" --num-queues "$nq" \
        --workers "$workers" --poll "$1" --poll-cpus "$poll_cpus" >> "$run/sqcqd.log" 2>&1 < /dev/null &
    tpid=$!
    for _ in $(seq 100); do [ -S "$run/sqcqd.sock" ] && break; sleep 0.05; done
    [ -S "$run/sqcqd.sock" ] || { cat "$run/sqcqd.log"; exit 1; }
    sock=$run/sqcqd.sock
}
start_qsd() {
    rm -f "$run/qsd.sock"
    local node="driver=null-co,node-name=disk0,size=1G,read-zeroes=off"
    if [ -n "$path" ]; then
        # QEMU's file driver for regular files, host_device for block devices.
        local drv=file
        [ ! -b "$path" ] || drv=host_device
        node="driver=$drv,node-name=disk0,filename=$path,aio=io_uring,cache.direct=on"
    fi
    setsid taskset -c "$poll_cpus" "$qsd_bin" --object iothread,id=iot0 --blockdev "$node" \
        --export "type=vhost-user-blk,id=e0,node-name=disk0,iothread=iot0,addr.type=unix,addr.path=$run/qsd.sock,writable=on,num-queues=$nq" \
        > "$run/qsd.log" 2>&1 < /dev/null &
    tpid=$!
    for _ in $(seq 100); do [ -S "$run/qsd.sock" ] && break; sleep 0.05; done
    [ -S "$run/qsd.sock" ] || { cat "$run/qsd.log"; exit 1; }
    sock=$run/qsd.sock
}
stop_target() {
    [ -n "$tpid" ] || return 0
    kill -INT "$tpid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$tpid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$tpid" 2>/dev/null || true
    wait "$tpid" 2>/dev/null || true
    tpid=""
}
trap 'stop_target; cleanup_disk' EXIT

# ---------------------------------------------------------- initiators
# Each prints "iops lat_us p50_us".
bdevperf() { # RW QD
    local conf=$run/bdevperf.json o
    printf '{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_virtio_attach_controller","params":{"name":"V0","trtype":"user","traddr":"%s","dev_type":"%s","vq_count":%d,"vq_size":128}},{"method":"bdev_wait_for_examine"}]}]}\n' \
        "$sock" "$device" "$nq" > "$conf"
    o=$(timeout $((secs + 60)) "$SPDK_DIR/build/examples/bdevperf" -m "$imask" "${spdk_opts[@]}" -u -g -s 512 \
        -r "$run/bdevperf.rpc" --json "$conf" "${bdevperf_opts[@]}" -q "$2" -o 4096 -w "$1" -t "$secs" -l 2>&1) || { echo "$o" >&2; return 1; }
    # -l: the latency summary, whose 50% line follows each job (the first
    # job's when there are several).
    echo "$o" | tr -d '\r' | awk '/^ *Total *:/ { t = $3 " " $7 } / 50\.00000% :/ && !p { p = $3; sub(/us$/, "", p) }
        END { print t, (p == "" ? 0 : p) }'
}
bench() { # MODE RW QD
    local o
    o=$(timeout $((secs + 60)) "${pin[@]}" "$bin/sqcq-bench" "${bench_opts[@]}" --device-type "$device" --socket "$sock" --mode "$1" --rw "$2" \
        --iodepth "$3" --numjobs "$nq" --bs 4k --runtime "$secs" --time_based --eta never \
        --stats-interval 0 --output-format json 2> "$run/bench.err") || { cat "$run/bench.err" >&2; return 1; }
    echo "$o" | "$py" -c 'import json, sys
d = json.load(sys.stdin); io = sum(j[k]["total_ios"] for j in d["jobs"] for k in ("read", "write"))
iops = sum(j[k]["iops"] for j in d["jobs"] for k in ("read", "write"))
lat = sum(j[k]["lat_ns"]["mean"] * j[k]["total_ios"] for j in d["jobs"] for k in ("read", "write")) / max(io, 1)
# The median of the side (read or write) and job with the most I/Os.
top = max(((j[k]["total_ios"], j[k]["lat_ns"]) for j in d["jobs"] for k in ("read", "write")), key=lambda t: t[0])[1]
p50 = float(top.get("percentile", {}).get("50.000000", 0))
print(iops, lat / 1000, p50 / 1000)'
}
# The cache line round trip between the target's and the initiator's CPU
# (ns), with nothing polling them.
c2c() { "$bin/sqcq-c2c" --cpus "$tcpu,$icpu" --terse 2>/dev/null || echo 0; }
cell() { # REP INITIATOR TARGET MODE RW QD -- command
    local rep=$1 ini=$2 tgt=$3 mode=$4 rw=$5 qd=$6 t0 t1 b0 b1 r iops lat p50 tns ins c0 c1 l0=0
    shift 7
    [ "$tgt" = spdk ] && { start_spdk; sleep 0.5; }
    [ -f "$run/sqcqd.log" ] && l0=$(wc -l < "$run/sqcqd.log")
    c0=$pre_c2c
    t0=$(ticks "$tpid") b0=$(busy)
    r=$("$@") || r="0 0 0"
    t1=$(ticks "$tpid") b1=$(busy)
    [ "$tgt" = spdk ] && stop_target
    sleep 0.2
    c1=$(c2c)
    pre_c2c=$c1
    read -r iops lat p50 <<< "$r"
    read -r tns ins < <(awk -v i="$iops" -v s="$secs" -v t=$((t1 - t0)) -v b=$((b1 - b0)) -v hz="$hz" \
        'BEGIN { n = i * s; if (n < 1) n = 1; printf "%.0f %.0f\n", t * 1e9 / hz / n, (b - t) * 1e9 / hz / n }')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%.2f\t%.3f\t%s\t%s\t%s\t%s\n' "$rep" "$ini" "$tgt" "$mode" "$rw" "$qd" \
        "$iops" "$lat" "$p50" "$tns" "$ins" "$c0" "$c1" | tee -a "$tsv"
    # A stage-clock build of sqcqd logs where its time goes per request
    # (runtime/stage_clock.rs): the reports of this run, with its keys.
    case $tgt in sqcqd*)
        tail -n +$((l0 + 1)) "$run/sqcqd.log" | sed -n 's/.*stage clock: //p' |
            while read -r report; do
                printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$rep" "$ini" "$tgt" "$mode" "$rw" "$qd" "$c0" "$c1" "$report"
            done >> "$out/stage-clock.tsv" ;;
    esac
}

# ---------------------------------------------------------------- run
idle_ticks=() auto_idle_ticks=()
last_rw=${rws##* } last_qd=${qds##* }
spdk_cells() { # REP RW QD
    cell "$1" bdevperf spdk poll "$2" "$3" -- bdevperf "$2" "$3"
    [ "$half" = 0 ] || return 0
    cell "$1" sqcq-bench spdk ring-poll "$2" "$3" -- bench ring-poll "$2" "$3"
}
sqcqd_cells() { # REP RW QD
    start_sqcqd ring
    cell "$1" bdevperf sqcqd-ring ring "$2" "$3" -- bdevperf "$2" "$3"
    if [ "$half" = 1 ]; then
        last_load_idle idle_ticks "$2" "$3"
        stop_target
        return 0
    fi
    cell "$1" sqcq-bench sqcqd-ring ring-poll "$2" "$3" -- bench ring-poll "$2" "$3"
    stop_target
    start_sqcqd kick
    cell "$1" bdevperf sqcqd-kick kick "$2" "$3" -- bdevperf "$2" "$3"
    for m in sqcq-inline sqcq; do
        cell "$1" sqcq-bench sqcqd-kick "$m" "$2" "$3" -- bench "$m" "$2" "$3"
    done
    last_load_idle idle_ticks "$2" "$3"
    stop_target
    start_sqcqd auto
    cell "$1" bdevperf sqcqd-auto auto "$2" "$3" -- bdevperf "$2" "$3"
    last_load_idle auto_idle_ticks "$2" "$3"
    stop_target
}
qsd_cells() { # REP RW QD
    [ "$device" = blk ] && [ "$half" = 0 ] || return 0
    start_qsd
    cell "$1" sqcq-bench qsd ring-poll "$2" "$3" -- bench ring-poll "$2" "$3"
    stop_target
}
last_load_idle() { # ARRAY RW QD: after the repeat's last load, sqcqd's CPU ticks idle
    if [ "$2" = "$last_rw" ] && [ "$3" = "$last_qd" ]; then
        sleep 1
        local t0 t1
        t0=$(ticks "$tpid"); sleep "$idle_secs"; t1=$(ticks "$tpid")
        eval "$1+=($((t1 - t0)))"
    fi
}
for rep in $(seq "$reps"); do
    for rw in $rws; do for qd in $qds; do
        # One rw/QD's cells back to back, so that cells compared ran
        # seconds apart, not minutes. The first run after a pause came out
        # faster than the same program run second (5-7% in A/A pairs), so
        # odd repeats run SPDK's cells first and even ones sqcqd's.
        pre_c2c=$(c2c)
        if [ $((rep % 2)) = 1 ]; then
            spdk_cells "$rep" "$rw" "$qd"
            sqcqd_cells "$rep" "$rw" "$qd"
            qsd_cells "$rep" "$rw" "$qd"
        else
            qsd_cells "$rep" "$rw" "$qd"
            sqcqd_cells "$rep" "$rw" "$qd"
            spdk_cells "$rep" "$rw" "$qd"
        fi
    done; done
done
echo "# sqcqd idle after load: ${idle_ticks[*]} ticks of 1/$hz s in $idle_secs s (per repeat)"
[ "$half" = 1 ] || echo "# sqcqd --poll auto idle after load: ${auto_idle_ticks[*]} ticks of 1/$hz s in $idle_secs s (per repeat)"
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"

"$py" - "$tsv" "$far_ns" "$out/stage-clock.tsv" > "$out/summary.md" << 'EOF'
import csv, os, re, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
far = float(sys.argv[2])
def placement(r):
    a, b = float(r["c2c_before_ns"]), float(r["c2c_after_ns"])
    if a <= 0 or b <= 0:
        return "mixed"
    if a < far and b < far:
        return "near"
    if a >= far and b >= far:
        return "far"
    return "mixed"
for r in rows:
    r["placement"] = placement(r)
def med(rs, k):
    return statistics.median(float(r[k]) for r in rs)
order = []
for r in rows:
    k = (r["rw"], int(r["qd"]), r["initiator"], r["target"], r["mode"])
    if k not in order:
        order.append(k)
order.sort(key=lambda k: (k[0], k[1]))
mixed = sum(r["placement"] == "mixed" for r in rows)
print("Runs: %d; near %d, far %d, mixed %d (placement changed during the run, left out)." % (
    len(rows), sum(r["placement"] == "near" for r in rows),
    sum(r["placement"] == "far" for r in rows), mixed))
for pl in ("all", "near", "far"):
    rs_pl = [r for r in rows if (pl == "all" or r["placement"] == pl) and float(r["iops"]) > 0]
    if not rs_pl:
        continue
    c2c = statistics.median(float(r[k]) for r in rs_pl for k in ("c2c_before_ns", "c2c_after_ns"))
    print()
    if pl == "all":
        print("### all runs, whatever the placement (cache line round trip median %.0f ns)" % c2c)
    else:
        print("### %s: CPUs %s a cache (cache line round trip %s %.0f ns; median %.0f ns); cells without a run of this placement left out" % (
            pl, "sharing" if pl == "near" else "not sharing", "<" if pl == "near" else ">=", far, c2c))
    print()
    print("| rw | QD | initiator -> target (mode) | runs | IOPS (median) | vs bdevperf -> SPDK | mean lat us | p50 us | p50 / c2c | target ns/IO | initiator ns/IO |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for key in order:
        rw, qd, ini, tgt, mode = key
        rs = [r for r in rs_pl if (r["rw"], int(r["qd"]), r["initiator"], r["target"], r["mode"]) == key]
        if not rs:
            continue
        base = [r for r in rs_pl if r["rw"] == rw and int(r["qd"]) == qd
                and r["initiator"] == "bdevperf" and r["target"] == "spdk"]
        iops = med(rs, "iops")
        ratio = "%.2fx" % (iops / med(base, "iops")) if base else "-"
        p50 = med(rs, "p50_us")
        # QD1's median latency in cache line round trips (those of its runs).
        rt = statistics.median(float(r[k]) for r in rs for k in ("c2c_before_ns", "c2c_after_ns"))
        floor = "%.1fx" % (p50 * 1000 / rt) if qd == 1 and rt > 0 and p50 > 0 else "-"
        print("| %s | %d | %s -> %s (%s) | %d | %s | %s | %.2f | %.3f | %s | %.0f | %.0f |" % (
            rw, qd, ini, tgt, mode, len(rs), f"{iops:,.0f}", ratio, med(rs, "lat_us"), p50, floor,
            med(rs, "target_ns_io"), med(rs, "initiator_ns_io")))
# Paired: each run over the baseline's run of the same repeat (the cells of
# a repeat's rw/QD ran back to back, seconds apart), when both ran with
# the vCPUs placed alike; the median of those ratios, with its spread.
print()
print("### paired: each run / bdevperf -> SPDK's run of the same repeat, both near or both far")
print()
print("| rw | QD | initiator -> target (mode) | pairs (near + far) | ratio (median) | lowest | highest |")
print("|---|---|---|---|---|---|---|")
for key in order:
    rw, qd, ini, tgt, mode = key
    if ini == "bdevperf" and tgt == "spdk":
        continue
    ratios, pls = [], []
    for r in rows:
        if (r["rw"], int(r["qd"]), r["initiator"], r["target"], r["mode"]) != key or r["placement"] == "mixed":
            continue
        b = [x for x in rows if x["rep"] == r["rep"] and x["rw"] == rw and int(x["qd"]) == qd
             and x["initiator"] == "bdevperf" and x["target"] == "spdk" and x["placement"] == r["placement"]]
        if b and float(b[0]["iops"]) > 0 and float(r["iops"]) > 0:
            ratios.append(float(r["iops"]) / float(b[0]["iops"]))
            pls.append(r["placement"])
    if ratios:
        print("| %s | %d | %s -> %s (%s) | %d (%d + %d) | %.2fx | %.2fx | %.2fx |" % (
            rw, qd, ini, tgt, mode, len(ratios), pls.count("near"), pls.count("far"),
            statistics.median(ratios), min(ratios), max(ratios)))
# Where a stage-clock build of sqcqd spent its time per request
# (runtime/stage_clock.rs): the median of each stage over the reports of
# a cell's near runs (each report: one worker's REPORT_PASSES passes).
# Every stage includes one read of the clock (clock read).
if os.path.exists(sys.argv[3]) and os.path.getsize(sys.argv[3]) > 0:
    cells, names = {}, []
    for line in open(sys.argv[3]):
        rep, ini, tgt, mode, rw, qd, c0, c1, report = line.rstrip("\n").split("\t", 8)
        if placement({"c2c_before_ns": c0, "c2c_after_ns": c1}) != "near":
            continue
        per = report.split("ns per request:", 1)[-1]
        figures = dict((k, float(v)) for k, v in re.findall(r"(\w+)[ =]([0-9.]+)", per) if k != "worker")
        names = names or [k for k in figures if k != "clock_read_ns"]
        cells.setdefault((rw, int(qd), ini, tgt, mode), []).append(figures)
    print()
    print("### stage clock: sqcqd's ns per request by stage (medians of the reports of near runs; each stage includes one clock read)")
    print()
    print("| rw | QD | initiator -> target (mode) | reports | " + " | ".join(names) + " | clock read |")
    print("|---|---|---|---|" + "---|" * (len(names) + 1))
    for key in sorted(cells):
        rw, qd, ini, tgt, mode = key
        fs = cells[key]
        col = lambda k: statistics.median(f.get(k, 0) for f in fs)
        print("| %s | %d | %s -> %s (%s) | %d | " % (rw, qd, ini, tgt, mode, len(fs))
              + " | ".join("%.1f" % col(k) for k in names) + " | %.1f |" % col("clock_read_ns"))
failed = [r for r in rows if float(r["iops"]) <= 0]
if failed:
    print()
    print("Failed runs: " + ", ".join("%s %s %s -> %s (%s)" % (r["rw"], r["qd"], r["initiator"], r["target"], r["mode"]) for r in failed))
EOF
cat "$out/summary.md"
echo "# results: $tsv, $out/summary.md"
