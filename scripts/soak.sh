#!/usr/bin/env bash
# The soak: one sqcqd serving a vhost-user-scsi and a vhost-user-blk
# device (file LUNs), each driven by verified sqcq-bench sessions in every
# driver mode, on split and packed rings (each session picks one), while
# the daemon is killed (-9) and restarted (alternating
# --poll kick, ring and auto), frontends are killed and come back, the memory
# table is sent again mid-run, queues move between workers, LUNs grow,
# the configuration is reloaded (SIGHUP or config_reload), a spare LUN
# comes and goes, and devices are deleted and created again. At the end
# every region of both disks is read back and checked against the seed of
# the session that last wrote it whole, after one more kill -9; the daemon
# must have crashed only when killed, never panicked, and kept its
# resident memory and descriptors flat. Everything lands in target/soak/.
#
#   scripts/soak.sh [--minutes N] [--seed S] [--hog]
#
# --minutes: how long the disorder lasts (default 30; fractions allowed).
# --seed: the seed of the script's choices (default: from the clock; the
#   summary prints it, so a run can be repeated).
# --hog: stress-ng --cpu 2 beside the soak.
# SQCQD, SQCQ_BENCH: the binaries (default target/debug/, built with
#   `cargo build -p sqcq-target -p sqcq-bench` if missing).
# SOAK_RSS_PCT (default 50), SOAK_RSS_SLACK_KB (default 16384): the median
#   resident memory of the last third of the samples at rest (every 10
#   cycles, no frontend connected) may exceed the first third's by this
#   much; SOAK_FD_SLACK (default 0): a sample at rest may have this many
#   descriptors more than the fewest of any sample at rest with the same
#   workers and LUNs (a fresh daemon's).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

MINUTES=30
SEED=$(( $(date +%s) % 32768 ))
HOG=0
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) MINUTES="$2"; shift 2 ;;
        --seed) SEED="$2"; shift 2 ;;
        --hog) HOG=1; shift ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "soak: unknown argument $1" >&2; exit 2 ;;
    esac
done
RANDOM=$SEED
RSS_PCT=${SOAK_RSS_PCT:-50}
RSS_SLACK_KB=${SOAK_RSS_SLACK_KB:-16384}
FD_SLACK=${SOAK_FD_SLACK:-0}

SQCQD=${SQCQD:-target/debug/sqcqd}
BENCH=${SQCQ_BENCH:-target/debug/sqcq-bench}
if [ ! -x "$SQCQD" ] || [ ! -x "$BENCH" ]; then
    cargo build --quiet -p sqcq-target -p sqcq-bench || exit 1
fi
if [ "$HOG" = 1 ]; then
    # shellcheck source=scripts/lib/packages.sh
    source scripts/lib/packages.sh
    ensure_packages soak stress-ng || exit 1
fi

OUT=$ROOT/target/soak
rm -rf "$OUT"
mkdir -p "$OUT/bench" "$OUT/daemon"
CONF=$OUT/sqcqd.toml
ADMIN=$OUT/admin.sock
LOG=$OUT/soak.log
SAMPLES=$OUT/samples.txt
REST=$OUT/rest-samples.txt
: >"$SAMPLES"
: >"$REST"

say() { echo "$(date +%H:%M:%S) $*" | tee -a "$LOG"; }

# The devices: index 0 scsi, 1 blk; each disk a file of SIZE_MB MiB whose
# first REGIONS x REGION_MB MiB the sessions write.
TYPES=(scsi blk)
SOCK=("$OUT/scsi.sock" "$OUT/blk.sock")
IMG=("$OUT/scsi.img" "$OUT/blk.img")
SIZE_MB=(64 64)
MAX_MB=256
REGIONS=4
REGION_MB=16
MODES=(notify poll-queue ring-poll sqcq sqcq-inline)
POLLS=(kick ring auto)
WORKERS=2
QMAP=("0:0,1:1" "0:1,1:0")

declare -A COUNT=()
count() { COUNT[$1]=$(( ${COUNT[$1]:-0} + ${2:-1} )); }
FAILURES=()
fail() { FAILURES+=("$*"); say "FAILURE: $*"; }

# ---- processes, and the trap that ends them all ----------------------------
DPID=
INCARNATION=0
DAEMON_POLL=
BPID=("" "")
HOGPID=
cleanup() {
    local p
    for p in "${BPID[@]}"; do
        [ -n "$p" ] && kill -9 "$p" 2>/dev/null
    done
    # stress-ng ends its workers on SIGTERM (not on SIGKILL).
    [ -n "$HOGPID" ] && kill -TERM "$HOGPID" 2>/dev/null
    [ -n "$DPID" ] && kill -9 "$DPID" 2>/dev/null
    wait 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

write_config() {
    local d
    {
        echo "workers = $WORKERS"
        # packed rings offered: each session picks its layout
        printf '[poll]\npacked = true\n'
        for d in 0 1; do
            cat <<EOF
[[device]]
type = "${TYPES[$d]}"
socket-path = "${SOCK[$d]}"
num-queues = 2
queue-size = 256
queue-map = "${QMAP[$d]}"
[[device.lun]]
kind = "file"
path = "${IMG[$d]}"
size = "${SIZE_MB[$d]}M"
create = true
EOF
        done
    } >"$CONF.tmp"
    mv "$CONF.tmp" "$CONF"
}

rpc() { timeout 30 "$SQCQD" rpc --admin-socket "$ADMIN" "$@"; }

# The daemon's device number of device index $1 (numbers change when a
# device is deleted and created again).
dev_id() {
    rpc device_list 2>/dev/null | python3 -c '
import json, sys
for d in json.load(sys.stdin):
    if d["socket_path"] == sys.argv[1]:
        print(d["id"])' "${SOCK[$1]}"
}

start_daemon() {
    INCARNATION=$((INCARNATION + 1))
    DAEMON_POLL=${POLLS[$((INCARNATION % ${#POLLS[@]}))]}
    "$SQCQD" --config "$CONF" --admin-socket "$ADMIN" --poll "$DAEMON_POLL" \
        --stats-interval 0 >"$OUT/daemon/$INCARNATION.log" 2>&1 &
    DPID=$!
    local i
    for i in $(seq 100); do
        if rpc daemon_info 2>/dev/null | grep -q "\"pid\": $DPID"; then
            say "daemon $INCARNATION up (pid $DPID, --poll $DAEMON_POLL)"
            return 0
        fi
        kill -0 "$DPID" 2>/dev/null || break
        sleep 0.1
    done
    fail "daemon $INCARNATION did not come up (daemon/$INCARNATION.log)"
    return 1
}

# Reaps the daemon if it died on its own: a crash.
check_daemon() {
    kill -0 "$DPID" 2>/dev/null && return 0
    local st=0
    { wait "$DPID"; } 2>/dev/null || st=$?
    count crashes
    fail "daemon $INCARNATION (pid $DPID) died by itself, status $st (daemon/$INCARNATION.log)"
    start_daemon
}

kill_daemon() {
    local st=0
    kill -9 "$DPID"
    { wait "$DPID"; } 2>/dev/null || st=$?
    [ "$st" = 137 ] || fail "daemon $INCARNATION ended with status $st before the kill landed"
    count kill9
    write_config
    start_daemon
}

# ---- frontend sessions -----------------------------------------------------
# LEDGER[d,r]: the seed of the last session that wrote region r of device
# d whole and read it back; "dirty" while one writes it or after one was
# killed.
declare -A LEDGER=()
SESSION=0
BSESSION=("" "")
BREGION=("" "")
BKILLED=(0 0)
MODE_NEXT=(0 2)

bench_args() { # device region seed mode
    local d=$1 r=$2
    printf '%s\n' --socket "${SOCK[$d]}" --device-type "${TYPES[$d]}" --mode "$4" \
        --rw randwrite --bs 4k --numjobs 2 \
        --offset $((r * REGION_MB))M --size $((REGION_MB / 2))M \
        --verify crc32c --randseed "$3" --io-timeout 60 --eta never \
        --output-format json --stats-interval 0
}

start_session() { # device [region]
    local d=$1 r=${2:-$((RANDOM % REGIONS))}
    SESSION=$((SESSION + 1))
    local mode=${MODES[$((MODE_NEXT[d] % ${#MODES[@]}))]}
    MODE_NEXT[d]=$((MODE_NEXT[d] + 1))
    local extra=(--iodepth "$(( (RANDOM % 4) * 10 + 1 ))" --reconnect 60)
    if [ $((RANDOM % 2)) = 0 ]; then
        extra+=(--mem-table-interval "$((200 + RANDOM % 800))ms")
        count memtable_sessions
    fi
    [ "${TYPES[$d]}" = scsi ] && [ $((RANDOM % 2)) = 0 ] && extra+=(--fua)
    if [ $((RANDOM % 2)) = 0 ]; then
        extra+=(--ring packed)
        count packed_sessions
    fi
    mapfile -t args < <(bench_args "$d" "$r" "$SESSION" "$mode")
    echo "$BENCH ${args[*]} ${extra[*]}" >"$OUT/bench/$SESSION.cmd"
    "$BENCH" "${args[@]}" "${extra[@]}" >"$OUT/bench/$SESSION.json" 2>"$OUT/bench/$SESSION.log" &
    BPID[d]=$!
    BSESSION[d]=$SESSION
    BREGION[d]=$r
    BKILLED[d]=0
    LEDGER[$d,$r]=dirty
    count "sessions_${mode}"
}

# Accounts for the finished session of device $1.
session_done() {
    local d=$1 st=$2
    # (a second `local`: the words of one are expanded before d is set)
    local s=${BSESSION[$d]} r=${BREGION[$d]}
    BPID[d]=
    local ios
    ios=$(python3 - "$OUT/bench/$s.json" <<'EOF' 2>/dev/null
import json, sys
try:
    j = json.load(open(sys.argv[1]))
    print(sum(job[k]["total_ios"] for job in j["jobs"] for k in ("read", "write")))
except Exception:
    print(0)
EOF
)
    count ios "${ios:-0}"
    local sent
    sent=$(sed -n 's/.*memory table sent again \([0-9]*\) times.*/\1/p' "$OUT/bench/$s.log")
    count memtable_sent "${sent:-0}"
    if grep -q "memory table sent again [0-9]* times, [1-9]" "$OUT/bench/$s.log"; then
        count memtable_failed
    fi
    if [ "${BKILLED[$d]}" = 1 ]; then
        return 0
    fi
    if [ "$st" = 0 ]; then
        LEDGER[$d,$r]=$s
        count sessions_ok
        return 0
    fi
    if grep -q "verify:" "$OUT/bench/$s.log" "$OUT/bench/$s.json"; then
        count verify_errors
        fail "session $s (${TYPES[$d]}, region $r): verify error (bench/$s.log)"
    else
        count session_errors
        fail "session $s (${TYPES[$d]}, region $r) failed, status $st (bench/$s.log)"
    fi
}

reap_sessions() {
    local d st
    for d in 0 1; do
        [ -n "${BPID[$d]}" ] || continue
        kill -0 "${BPID[$d]}" 2>/dev/null && continue
        st=0
        { wait "${BPID[$d]}"; } 2>/dev/null || st=$?
        session_done "$d" "$st"
    done
}

# ---- the disorder ------------------------------------------------------------
act_disconnect() {
    local d=$((RANDOM % 2)) st=0
    [ -n "${BPID[$d]}" ] || return 0
    BKILLED[d]=1
    kill -9 "${BPID[$d]}" 2>/dev/null
    { wait "${BPID[$d]}"; } 2>/dev/null || st=$?
    session_done "$d" "$st"
    count disconnect
    start_session "$d"
}

# An RPC that may be refused (a conflict is an answer, not a failure);
# fails the soak when the daemon does not answer at all.
try_rpc() {
    local what=$1 out
    shift
    if out=$(rpc "$@" 2>&1); then
        RPC_OUT=$out
        echo "$* -> $out" >>"$OUT/rpc.log"
        count "$what"
        return 0
    fi
    echo "$* -> $out" >>"$OUT/rpc.log"
    if ! kill -0 "$DPID" 2>/dev/null; then
        return 1
    fi
    case "$out" in
        *"code"*|*"-320"*) count "${what}_refused" ;;
        *) fail "$what: $* -> $out" ;;
    esac
    return 1
}

act_move() {
    local d=$((RANDOM % 2)) id w
    id=$(dev_id "$d") || return 0
    [ -n "$id" ] || return 0
    w=$((RANDOM % (WORKERS + 1)))
    [ "$w" = "$WORKERS" ] && w=null
    try_rpc move queue_attach_worker device="$id" rq=$((RANDOM % 2)) worker="$w"
}

act_resize() {
    local d=$((RANDOM % 2)) id mb
    mb=$((SIZE_MB[d] + 4 * (1 + RANDOM % 4)))
    [ "$mb" -le "$MAX_MB" ] || return 0
    id=$(dev_id "$d")
    [ -n "$id" ] || return 0
    if try_rpc resize lun_resize device="$id" lun=0 size="${mb}M"; then
        SIZE_MB[d]=$mb
        write_config
    fi
}

act_reload() {
    WORKERS=$((2 + RANDOM % 2))
    local d a b
    for d in 0 1; do
        a=$((RANDOM % WORKERS))
        b=$((RANDOM % WORKERS))
        QMAP[d]="0:$a,1:$b"
    done
    write_config
    if [ $((RANDOM % 2)) = 0 ]; then
        kill -HUP "$DPID"
        count reload_sighup
    elif try_rpc reload_rpc config_reload; then
        # What could not be applied (fewer workers while queues use
        # them, say) is reported, not an error of the daemon.
        grep -q '"errors": \[\]' <<<"$RPC_OUT" || count reload_rpc_partial
    fi
}

# LUN 1 comes and goes under the load on LUN 0 (every nexus gets REPORTED
# LUNS DATA HAS CHANGED each time; the removal drains the device).
act_hotplug() {
    local id
    id=$(dev_id 0)
    [ -n "$id" ] || return 0
    if ! rpc device_list | grep -q '"lun": 1,'; then
        try_rpc lun_add lun_add device="$id" lun=1 kind=ram size=16M || return 0
        sleep "0.$((1 + RANDOM % 5))"
    fi
    try_rpc lun_remove lun_remove device="$id" lun=1 force=true
}

act_recreate() {
    local d=$((RANDOM % 2)) id
    id=$(dev_id "$d")
    [ -n "$id" ] || return 0
    try_rpc device_delete device_delete device="$id" force=true || return 0
    try_rpc device_create device_create type="${TYPES[$d]}" socket-path="${SOCK[$d]}" \
        num-queues=2 queue-size=256 queue-map="${QMAP[$d]}" \
        "lun:=[{\"kind\":\"file\",\"path\":\"${IMG[$d]}\",\"size\":\"${SIZE_MB[$d]}M\",\"create\":true}]"
}

# Resident memory (kB) and open descriptors of the daemon: "rss fds".
measure() {
    local rss fds
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$DPID/status" 2>/dev/null)
    fds=$(find "/proc/$DPID/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    [ -n "$rss" ] && echo "$rss $fds"
}

# One line per cycle, whatever the daemon is doing: cycle incarnation
# rss fds.
sample() {
    local m
    m=$(measure) && echo "$1 $INCARNATION $m" >>"$SAMPLES"
}

# Waits (bounded) for the session of device $1 to end and accounts for
# it.
finish_session() {
    local d=$1 st=0
    [ -n "${BPID[$d]}" ] || return 0
    for _ in $(seq 1200); do
        kill -0 "${BPID[$d]}" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "${BPID[$d]}" 2>/dev/null; then
        fail "session ${BSESSION[$d]} still running after 120 s: hung (bench/${BSESSION[$d]}.log)"
        BKILLED[d]=1
        kill -9 "${BPID[$d]}"
    fi
    { wait "${BPID[$d]}"; } 2>/dev/null || st=$?
    session_done "$d" "$st"
}

# The daemon at rest: no frontend connected (the sessions ended), so that
# its descriptors and memory compare across the run; one line: cycle
# incarnation workers luns rss fds (a worker and a LUN have descriptors of
# their own, so only samples with the same workers and LUNs compare).
rest_sample() {
    local d state m
    for d in 0 1; do
        finish_session "$d"
    done
    for _ in $(seq 50); do
        state=$(rpc device_list 2>/dev/null | python3 -c '
import json, sys
devs = json.load(sys.stdin)
print(any(d["connected"] for d in devs), sum(len(d["luns"]) for d in devs))' 2>/dev/null)
        [ "${state%% *}" = False ] && break
        sleep 0.1
    done
    [ "${state%% *}" = False ] || return 0
    sleep 0.3
    m=$(measure) || return 0
    echo "$1 $INCARNATION $(rpc worker_list | grep -c '"id"') ${state##* } $m" >>"$REST"
    count rest_samples
}

ACTIONS=(kill disconnect disconnect move move move resize resize reload reload hotplug recreate)

# ---- the run -----------------------------------------------------------------
say "soak: seed $SEED, $MINUTES minutes, $SQCQD, $BENCH; logs in $OUT"
if [ "$HOG" = 1 ]; then
    stress-ng --cpu 2 --timeout "$(python3 -c "print(int($MINUTES * 60) + 600)")s" >"$OUT/stress-ng.log" 2>&1 &
    HOGPID=$!
fi
for d in 0 1; do
    rm -f "${IMG[$d]}"
done
write_config
start_daemon || exit 1

# Every region written whole once, so that the final pass finds data of a
# known seed everywhere.
say "filling every region of both disks"
for r in $(seq 0 $((REGIONS - 1))); do
    for d in 0 1; do
        start_session "$d" "$r"
    done
    for d in 0 1; do
        st=0
        { wait "${BPID[$d]}"; } 2>/dev/null || st=$?
        session_done "$d" "$st"
    done
done

END=$(( $(date +%s) + $(python3 -c "print(int($MINUTES * 60))") ))
CYCLE=0
say "the disorder starts"
while [ "$(date +%s)" -lt "$END" ] && [ "$CYCLE" -lt 100000 ]; do
    CYCLE=$((CYCLE + 1))
    check_daemon
    reap_sessions
    for d in 0 1; do
        [ -n "${BPID[$d]}" ] || start_session "$d"
    done
    sample "$CYCLE"
    if [ $((CYCLE % 10)) = 0 ]; then
        rest_sample "$CYCLE"
        continue
    fi
    action=${ACTIONS[$((RANDOM % ${#ACTIONS[@]}))]}
    echo "cycle $CYCLE: $action" >>"$LOG"
    case "$action" in
        kill) kill_daemon ;;
        disconnect) act_disconnect ;;
        move) act_move ;;
        resize) act_resize ;;
        reload) act_reload ;;
        hotplug) act_hotplug ;;
        recreate) act_recreate ;;
    esac
    sleep "0.$((2 + RANDOM % 8))"
done
count cycles "$CYCLE"

say "the disorder ends: waiting for the sessions"
rest_sample "$CYCLE"
check_daemon

say "rewriting the regions a killed session left behind"
for d in 0 1; do
    for r in $(seq 0 $((REGIONS - 1))); do
        [ "${LEDGER[$d,$r]}" = dirty ] || continue
        start_session "$d" "$r"
        st=0
        { wait "${BPID[$d]}"; } 2>/dev/null || st=$?
        session_done "$d" "$st"
    done
done

say "one more kill -9, then every region read back"
kill_daemon
for d in 0 1; do
    for r in $(seq 0 $((REGIONS - 1))); do
        s=${LEDGER[$d,$r]}
        if [ "$s" = dirty ]; then
            fail "${TYPES[$d]} region $r: no session wrote it whole"
            continue
        fi
        mapfile -t args < <(bench_args "$d" "$r" "$s" notify)
        log=$OUT/bench/final-${TYPES[$d]}-$r
        if "$BENCH" "${args[@]}" --iodepth 16 --verify_only >"$log.json" 2>"$log.log"; then
            count final_verified_mb "$REGION_MB"
        elif grep -q "verify:" "$log.log" "$log.json"; then
            count verify_errors
            fail "final check of ${TYPES[$d]} region $r (seed $s): $(grep -h -m1 -o 'verify:.*' "$log.json" "$log.log" | head -1)"
        else
            fail "final check of ${TYPES[$d]} region $r failed (bench/final-${TYPES[$d]}-$r.log)"
        fi
    done
done

say "stopping the daemon (SIGTERM)"
st=0
kill -TERM "$DPID"
for _ in $(seq 200); do
    kill -0 "$DPID" 2>/dev/null || break
    sleep 0.1
done
{ wait "$DPID"; } 2>/dev/null || st=$?
DPID=
[ "$st" = 0 ] || fail "the daemon's SIGTERM exit status was $st, not 0"
if grep -l -E "panicked|RUST_BACKTRACE|stack backtrace" "$OUT"/daemon/*.log >"$OUT/panics.txt"; then
    count panics "$(wc -l <"$OUT/panics.txt")"
    fail "panics in $(tr '\n' ' ' <"$OUT/panics.txt")"
fi
if grep -l "panicked" "$OUT"/bench/*.log >"$OUT/bench-panics.txt"; then
    fail "sqcq-bench panicked: $(tr '\n' ' ' <"$OUT/bench-panics.txt")"
fi
if [ -n "$HOGPID" ]; then
    kill "$HOGPID" 2>/dev/null
    wait "$HOGPID" 2>/dev/null
    HOGPID=
fi

# ---- memory, descriptors, summary --------------------------------------------
MEM_VERDICT=$(python3 - "$SAMPLES" "$REST" "$RSS_PCT" "$RSS_SLACK_KB" "$FD_SLACK" <<'EOF'
import statistics, sys
samples, rest = sys.argv[1], sys.argv[2]
pct, slack, fd_slack = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
every = [tuple(map(int, l.split())) for l in open(samples) if l.strip()]
# cycle incarnation workers luns rss fds
rows = [tuple(map(int, l.split())) for l in open(rest) if l.strip()]
bad = []
def thirds(rows):
    third = len(rows) // 3
    return rows[:third], rows[-third:]
def rss_grew(rows, what):
    if len(rows) < 6:
        return
    first, last = thirds(rows)
    rss0, rss1 = statistics.median(r[4] for r in first), statistics.median(r[4] for r in last)
    if rss1 > rss0 * (100 + pct) / 100 + slack:
        bad.append(f"{what}: resident memory at rest grew: median {rss0:.0f} kB in the first third, {rss1:.0f} kB in the last")
rss_grew(rows, "the run")
for inc in sorted({r[1] for r in rows}):
    rss_grew([r for r in rows if r[1] == inc], f"daemon {inc}")
# At rest a daemon has as many descriptors as a fresh one with the same
# workers and LUNs: any more were left behind by what happened before.
for key in sorted({(r[2], r[3]) for r in rows}):
    group = [r for r in rows if (r[2], r[3]) == key]
    least = min(r[5] for r in group)
    for r in group:
        if r[5] > least + fd_slack:
            bad.append(f"daemon {r[1]} at rest (cycle {r[0]}, {key[0]} workers, {key[1]} LUNs) has {r[5]} descriptors, {r[5] - least} more than the fewest seen so ({least})")
if every:
    print(f"STAT rss_kb {min(r[2] for r in every)}..{max(r[2] for r in every)} fds {min(r[3] for r in every)}..{max(r[3] for r in every)}"
          f" ({len(every)} samples); at rest {len(rows)} samples, fds {min((r[5] for r in rows), default=0)}..{max((r[5] for r in rows), default=0)}")
for b in bad:
    print("BAD " + b)
EOF
)
MEM_STAT=$(sed -n 's/^STAT //p' <<<"$MEM_VERDICT")
while IFS= read -r line; do
    [ -n "$line" ] && fail "$line"
done < <(sed -n 's/^BAD //p' <<<"$MEM_VERDICT")

{
    echo
    echo "== soak summary (seed $SEED, $MINUTES min, logs in target/soak/)"
    printf '%-26s %s\n' "cycles" "${COUNT[cycles]:-0}"
    printf '%-26s %s\n' "daemon incarnations" "$INCARNATION"
    for k in kill9 disconnect move move_refused resize resize_refused reload_sighup reload_rpc \
        reload_rpc_refused reload_rpc_partial lun_add lun_add_refused lun_remove lun_remove_refused \
        device_delete device_delete_refused device_create device_create_refused \
        memtable_sessions memtable_sent memtable_failed packed_sessions; do
        printf '%-26s %s\n' "$k" "${COUNT[$k]:-0}"
    done
    for m in "${MODES[@]}"; do
        printf '%-26s %s\n' "sessions $m" "${COUNT[sessions_$m]:-0}"
    done
    printf '%-26s %s\n' "sessions ok" "${COUNT[sessions_ok]:-0}"
    printf '%-26s %s\n' "I/Os" "${COUNT[ios]:-0}"
    printf '%-26s %s\n' "final MiB verified" "${COUNT[final_verified_mb]:-0} of $((2 * REGIONS * REGION_MB))"
    printf '%-26s %s\n' "verify errors" "${COUNT[verify_errors]:-0}"
    printf '%-26s %s\n' "session errors" "${COUNT[session_errors]:-0}"
    printf '%-26s %s\n' "crashes (not ours)" "${COUNT[crashes]:-0}"
    printf '%-26s %s\n' "panics" "${COUNT[panics]:-0}"
    printf '%-26s %s\n' "daemon rss/fds" "${MEM_STAT:-no samples}"
    if [ "${#FAILURES[@]}" -gt 0 ]; then
        echo "FAILED (${#FAILURES[@]}):"
        printf '  %s\n' "${FAILURES[@]}"
    else
        echo "PASSED"
    fi
} | tee -a "$LOG" "$OUT/summary.txt"
[ "${#FAILURES[@]}" = 0 ]
