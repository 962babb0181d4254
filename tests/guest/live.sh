#!/usr/bin/env bash
# Restart and live migration under guest I/O (issue 12), with the guest of
# the QEMU suite: docs/guest-tests.md#restart-and-live-migration.
# Entry point: scripts/guest-test.sh --restart | --migrate.
#
#   --restart  one QEMU with vhost-user-blk-pci on a chardev with
#              reconnect=1; while fio verifies in the guest, the host
#              kill -9s sqcqd and starts it again on the same socket and
#              file (--restarts times). QEMU reconnects, the daemon
#              resubmits what was in flight (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD).
#   --migrate  two QEMUs, each with its own sqcqd on one shared file; while
#              fio verifies in the guest, the host migrates it from the
#              first to the second (QMP migrate over a unix socket); the
#              guest finishes on the destination (VHOST_F_LOG_ALL,
#              VHOST_USER_PROTOCOL_F_LOG_SHMFD).
# The last line is "live: N passed, M failed, K skipped"; exit status 1
# when anything failed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"
source tests/guest/lib.sh

usage() {
    cat <<'EOF'
usage: scripts/guest-test.sh --restart|--migrate [options]
  --restart             kill -9 and restart sqcqd under fio (vhost-user-blk,
                        chardev reconnect=1)
  --migrate             migrate the guest to a second QEMU under fio
  --restarts N          daemon restarts during fio (default 3; --restart)
  --mib M               MiB fio writes and verifies (default 64: what fio
                        writes while the guest waits out one restart must
                        leave room for the next restart point)
  --scsi                vhost-user-scsi-pci instead of vhost-user-blk-pci
                        (--restart needs QEMU 8.2 or later, which
                        reconnects vhost-user-scsi: --qemu-version 10.0)
  --sqcq                the VIRTIO_F_SQCQ_POLL guest and QEMU (as for the
                        suite: patches/linux, patches/qemu), on
                        vhost-user-blk (virtio_blk's poll threads) or with
                        --scsi on vhost-user-scsi (virtio_scsi's)
  --packed              packed rings: QEMU's packed=on, sqcqd --packed (the
                        daemon's in-flight record of a packed ring)
  --daemon-extra ARGS   more sqcqd options (e.g. '--poll ring')
  --spin-max-us N       longest spin window of both sides' pollers, µs
                        (default with --sqcq: 5000)
  --qemu PATH           the QEMU binary (default qemu-system-x86_64; the
                        patched one with --sqcq or --migrate)
  --rbd                 the disk is a fresh image (--mib + 8 MiB) of the Ceph test
                        cluster (as for the suite's --rbd), served by every
                        daemon; a migration hands its exclusive lock over
  --keep                keep the scratch directory (logs, image)
Env: SQCQD (path of sqcqd), SQCQ_GUEST_TIMEOUT_BOOT/_CHECKS/_SHUTDOWN
     (seconds: 90/180/30), SQCQ_GUEST_APPEND (as for the suite)
EOF
}

kind="" restarts=3 mib=64 dev=blk sqcq=0 packed=0 daemon_extra="" spin_max_us="" qemu="" keep=0 rbd=0
while [ $# -gt 0 ]; do
    case "$1" in
    --restart) kind=restart ;;
    --migrate) kind=migrate ;;
    --restarts) restarts="$2"; shift ;;
    --mib) mib="$2"; shift ;;
    --scsi) dev=scsi ;;
    --sqcq) sqcq=1 ;;
    --packed) packed=1 ;;
    --daemon-extra) daemon_extra="$2"; shift ;;
    --spin-max-us) spin_max_us="$2"; shift ;;
    --qemu) qemu="$2"; shift ;;
    --rbd) rbd=1 ;;
    --keep) keep=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "live: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
say() { echo "live: $*"; }
[ -n "$kind" ] || { usage >&2; exit 2; }
t_boot="${SQCQ_GUEST_TIMEOUT_BOOT:-90}"
t_checks="${SQCQ_GUEST_TIMEOUT_CHECKS:-180}"
t_shutdown="${SQCQ_GUEST_TIMEOUT_SHUTDOWN:-30}"
t0=$(date +%s)
# the guest's per-command timeout (fio's: twice that)
t_guest=60
# How long a new sqcqd may take to listen. A restarted one on RBD
# connects to the cluster and takes the killed one's exclusive lock over
# (docs/rbd.md, "Fencing") before it listens, about a second here; the
# margin is for a loaded machine.
t_listen=10
if [ "$rbd" = 1 ]; then
    if ! rbd_setup; then
        if [ -n "${SQCQ_REQUIRE_PEERS:-}" ]; then
            say "FAIL: $rbd_why; SQCQ_REQUIRE_PEERS is set, so nothing may be skipped"; exit 1
        fi
        say "SKIP: $rbd_why, nothing to test"; exit 0
    fi
    if [ "$kind" = restart ]; then
        t_listen=30
    fi
fi

bin="${SQCQD:-}"
# shellcheck disable=SC2012 # two fixed paths
[ -n "$bin" ] || bin="$(ls -t target/release/sqcqd target/debug/sqcqd 2>/dev/null | head -n 1 || true)"
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    say "SKIP: sqcqd is not built (cargo build -p sqcq-target), nothing to test"
    exit 0
fi

# What the queues must run as, and the guest's side of bit 42.
expect_sqcq=off queue_mode=kick dev_opts="" modules_dir="" guest_spin=""
# sqcqd's default, --poll auto, ring-polls within a window bounded by
# the wakeup cost it measured (under TCG gaps outlast it: kicks serve).
case " $daemon_extra " in *" --poll kick "*|*" --poll=kick "*) ;; *) queue_mode=ring-poll ;; esac
if [ "$sqcq" = 1 ]; then
    [ -n "$qemu" ] || qemu="$(scripts/build-qemu.sh ${SQCQ_GUEST_QEMU:-})" || { say "building the patched QEMU failed"; exit 1; }
    modules_dir="$(scripts/build-guest-modules.sh)" || { say "building the guest modules failed"; exit 1; }
    dev_opts=",sqcq_poll=on"
    : "${spin_max_us:=5000}"
    case " $daemon_extra " in *" --no-sqcq "*) ;; *) expect_sqcq=on queue_mode=sqcq ;; esac
fi
if [ "$packed" = 1 ]; then
    dev_opts="$dev_opts,packed=on"
    daemon_extra="$daemon_extra --packed"
fi
# A migration runs on the project's QEMU too, whatever the guest: Debian
# 12's 7.2 loses vCPU writes under TCG when an idle vCPU keeps a TLB entry
# across a dirty-bitmap sync (patches/qemu/7.2/0003, docs/guest-tests.md).
# SQCQ_GUEST_QEMU (scripts/guest-test.sh --qemu-version): that series'
# QEMU for every run.
if [ -z "$qemu" ] && { [ "$kind" = migrate ] || [ -n "${SQCQ_GUEST_QEMU:-}" ]; }; then
    qemu="$(scripts/build-qemu.sh ${SQCQ_GUEST_QEMU:-})" || { say "building the patched QEMU failed"; exit 1; }
fi
[ -n "$qemu" ] || qemu="qemu-system-x86_64"
# vhost-user-scsi reconnects to a restarted back-end from QEMU 8.2 on
qemu_version=$("$qemu" --version | sed -n 's/.*version \([0-9][0-9.]*\).*/\1/p' | head -n 1)
if [ "$kind" = restart ] && [ "$dev" = scsi ] &&
   [ "$(printf '%s\n8.2\n' "${qemu_version:-0}" | sort -V | head -n 1)" != 8.2 ]; then
    say "--restart --scsi needs a QEMU that reconnects vhost-user-scsi (8.2 on: --qemu-version 10.0); this one is $("$qemu" --version | head -n 1)"; exit 2
fi
daemon_spin=""
if [ -n "$spin_max_us" ]; then
    daemon_spin="--spin-us 1,$spin_max_us"
    [ "$sqcq" = 0 ] || guest_spin="virtio_$dev.sqcq_spin_max_ns=$((spin_max_us * 1000))"
fi

# ------------------------------------------------- scratch, lock, cleanup
mkdir -p target/guest
# one guest harness (hence one QEMU) at a time (the suite's lock)
exec 9> target/guest/qemu.lock
if ! flock -w 900 9; then say "another guest test held target/guest/qemu.lock for 900 s"; exit 1; fi
work="$(mktemp -d /tmp/sqcq-live.XXXXXX)"
declare -A daemon_pid=()   # name -> pid (the leader of its process group)
vm_pids=() cg="" can_throttle=0
cleanup() {
    local rc=$?
    local p
    for p in "${vm_pids[@]}"; do kill_group "$p"; done
    for p in "${daemon_pid[@]}"; do kill_group "$p"; done
    [ -z "$cg" ] || rmdir "$cg" 2>/dev/null || true
    [ "$rbd" = 0 ] || rbd_remove_all
    keep_logs "$rc" "$work"
    if [ "$keep" = 1 ]; then say "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM HUP

# the guest's RAM (MiB), one memfd shared with the daemon
ram_mib=512

# ------------------------------------------------------------- the guest
build_guest "$modules_dir"
if [ -z "$kernel" ] || [ -z "$initrd" ]; then say "building the guest failed"; exit 1; fi

results="$work/results"   # "name STATUS reason" lines
: > "$results"
check() { echo "$1 $2 ${*:3}" >> "$results"; }

# ------------------------------------------------------------ slow disk
# The TCG guest is far slower than the device: left alone, the daemon
# seldom holds a request at a given moment. So the host limits the
# daemons' I/O on the disk under the image file (their own blkio cgroup:
# v1 blkio.throttle, or v2 io.max) when it matters. For a restart, writes
# to one a second for a second before the kill -9: the writes the guest
# submits meanwhile are in the daemon's hands, while reads taken after
# them complete (completions out of the order the requests were taken in,
# which a restart that only rewinds to the used index gets wrong); the
# killed process exits once its io_uring requests completed, and the limit
# is lifted right after the kill. For a migration, reads and writes to 50
# a second while it runs, so that the source holds requests when QEMU
# stops it. Without a cgroup (no blkio controller, an image on tmpfs) this
# is left to chance. An RBD disk's I/O goes to the OSD over the network,
# out of a cgroup's reach: there the limit is librbd's own (QoS,
# rbd_qos_read/write_iops_limit, set on the image with `rbd config image
# set`, which every client that has it open applies at once), holding
# the requests in the daemon alike.
throttle_setup() {
    if [ "$rbd" = 1 ]; then can_throttle=1; return 0; fi
    if blkio_setup "sqcq-live-$$" "$work"; then can_throttle=1; fi
}
# throttle N|off [writes]: the daemons' writes, and reads unless "writes",
# limited to N a second; or no limit
throttle() {
    if [ "$rbd" = 1 ]; then
        local key
        for key in rbd_qos_write_iops_limit rbd_qos_read_iops_limit; do
            if [ "$1" = off ]; then
                rbd_cli config image remove "$rbd_img" "$key" > /dev/null 2>&1 || true
            elif [ "$key" = rbd_qos_write_iops_limit ] || [ "${2:-}" != writes ]; then
                rbd_cli config image set "$rbd_img" "$key" "$1" > /dev/null
            fi
        done
        return
    fi
    blkio_limit "$@"
}

# ------------------------------------------------------------- daemons
# One file (or RBD image) is the disk of every daemon, every instance:
# what fio writes (from offset 4 MiB), and room to spare.
disk_mib=$((mib + 8))
if [ "$rbd" = 1 ]; then
    rbd_create disk "${disk_mib}M" || { say "rbd create $rbd_prefix-disk failed"; exit 1; }
    rbd_img="$SQCQ_CEPH_POOL/$rbd_prefix-disk"
    lun="$(rbd_lun disk)"
else
    truncate -s "${disk_mib}M" "$work/disk.img"
    lun="kind=file,path=$work/disk.img"
fi
disk_what=file; [ "$rbd" = 0 ] || disk_what="RBD image"
# start_daemon NAME [LOG]: sqcqd on NAME.sock (log LOG, default NAME.log;
# statistics NAME.stats.json), in a process group of its own
start_daemon() {
    local name="$1" log="$work/${2:-$1}.log" args
    args=(--socket-path "$work/$name.sock" --num-queues 2
        --stats-file "$work/$name.stats.json" --stats-interval 1 --admin-socket "$work/$name.admin")
    if [ "$dev" = blk ]; then
        args+=(--device-type blk --lun "$lun,serial=sqcq-vda")
    else
        args+=(--lun "$lun")
    fi
    # The migration's destination takes the image's locks when QEMU
    # starts its device, after the source's device stopped and released
    # them (docs/target.md, "Image locks").
    [ "$name" != dst ] || args+=(--incoming)
    # shellcheck disable=SC2206 # options, split on purpose
    args+=($daemon_extra $daemon_spin)
    rm -f "$work/$name.sock" "$work/$name.admin"
    echo "== live: $(date +%T.%N | cut -c1-12) $bin ${args[*]}" >> "$log"
    if [ -n "$cg" ]; then
        # shellcheck disable=SC2016 # $$ of that shell
        NO_COLOR=1 setsid sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$bin" "${args[@]}" \
            >> "$log" 2>&1 < /dev/null &
    else
        NO_COLOR=1 setsid "$bin" "${args[@]}" >> "$log" 2>&1 < /dev/null &
    fi
    daemon_pid[$name]=$!
    for _ in $(seq $((t_listen * 10))); do
        [ -S "$work/$name.sock" ] && return 0
        kill -0 "${daemon_pid[$name]}" 2>/dev/null || break
        sleep 0.1
    done
    say "sqcqd ($name) did not create its socket within $t_listen s:"
    tail -n 20 "$log" | sed 's/^/    /'
    return 1
}
daemon_alive() { kill -0 "${daemon_pid[$1]}" 2>/dev/null; }

# -------------------------------------------------------------- QEMU
append="console=ttyS0 panic=-1"
case "${SQCQ_GUEST_APPEND:-}" in
    *verbose*) append="$append loglevel=7 ${SQCQ_GUEST_APPEND/verbose/}" ;;
    *) append="$append quiet loglevel=3 ${SQCQ_GUEST_APPEND:-}" ;;
esac
nonce=$(od -An -tx4 -N4 /dev/urandom | tr -d ' ')
append="$append sqcq_mode=live sqcq_live=$kind sqcq_live_mib=$mib sqcq_disks=1 sqcq_bs=512"
append="$append sqcq_expect=$expect_sqcq sqcq_dev=$dev sqcq_mq=2 sqcq_nonce=$nonce sqcq_timeout=$t_guest $guest_spin"
n_live=1; [ "$kind" = restart ] && n_live="$restarts"
append="$append sqcq_live_n=$n_live"
hard=$(( t_boot + t_checks + t_shutdown + 60 ))
# start_vm NAME DAEMON [ARGS...]: a QEMU (console NAME.console.log, QMP
# NAME.qmp, stderr NAME.qemu.log) on DAEMON's socket
start_vm() {
    local name="$1" daemon="$2"; shift 2
    # shellcheck disable=SC2054 # commas inside QEMU options
    local args=("$qemu" -accel tcg -cpu max -m "${ram_mib}M" -smp 2
        -object "memory-backend-memfd,id=mem,size=${ram_mib}M,share=on" -numa node,memdev=mem
        -nodefaults -no-user-config -display none -nic none -monitor none
        -qmp "unix:$work/$name.qmp,server=on,wait=off"
        -serial "file:$work/$name.console.log"
        -kernel "$kernel" -initrd "$initrd" -append "$append" -no-reboot)
    [ -r /usr/share/qemu/qboot.rom ] && args+=(-bios /usr/share/qemu/qboot.rom)
    if [ "$dev" = blk ]; then
        args+=(-chardev "socket,id=vu0,path=$work/$daemon.sock${reconnect:-}"
            -device "vhost-user-blk-pci,chardev=vu0,num-queues=2$dev_opts")
    else
        args+=(-chardev "socket,id=vu0,path=$work/$daemon.sock${reconnect:-}"
            -device "vhost-user-scsi-pci,chardev=vu0,num_queues=2$dev_opts")
    fi
    args+=("$@")
    : > "$work/$name.console.log"
    echo "${args[*]}" > "$work/$name.cmdline"
    setsid timeout -k 5 "$hard" "${args[@]}" > "$work/$name.qemu.log" 2>&1 < /dev/null &
    vm_pids+=($!)
    vm_pid=$!
}
qmp() { python3 "$here/qmp.py" "$work/$1.qmp" "${@:2}"; }

# the guest's console so far, across QEMUs (the destination's continues
# the source's)
console() { cat "$work"/vm*.console.log 2>/dev/null | tr -d '\r'; }

# ---------------------------------------------------------- disturbances
restarted=0 reconnected=0 absent=""
declare -A held_at_kill=()
# in_flight NAME: the requests daemon NAME holds (taken from its queues,
# not completed), by its management API; "?" if it does not answer
in_flight() {
    "$bin" rpc --admin-socket "$work/$1.admin" stats_get 2>/dev/null | python3 -c 'import json, sys
print(sum(q["in_flight"] for q in json.load(sys.stdin)["queues"]))' 2>/dev/null || echo "?"
}
# held_by NAME: waits (up to 15 s) until daemon NAME holds requests in two
# samples 0.2 s apart (so writes held back by the throttle, not reads that
# complete at once), and prints how many; 0 if it never did (the guest
# wrote nothing meanwhile, e.g. while fio verified)
held_by() {
    local n prev=0
    for _ in $(seq 75); do
        n=$(in_flight "$1")
        case "$n" in ''|*[!0-9]*) n=0 ;; esac
        if [ "$n" -gt 0 ] && [ "$prev" -gt 0 ]; then echo "$n"; return; fi
        prev=$n
        sleep 0.2
    done
    echo 0
}
# restart K: kill -9 the daemon with requests in its hands (see throttle),
# start it again on the same socket and file (log d.K.log), wait until
# QEMU has reconnected (its memory table is set: the device runs again)
host_restart() {
    local p="${daemon_pid[d]}" t held="not timed" t_kill
    if [ "$can_throttle" = 1 ]; then
        throttle 1 writes
        sleep 0.5
        held=$(held_by d)
    fi
    kill -KILL -- "-$p" 2>/dev/null || true
    t_kill=$(date +%s)
    # An RBD image's limit is lifted once the new daemon has taken the
    # lock over (and so blocklisted the killed one): `rbd config image`
    # notifies every watcher of the image and would wait out the dead
    # client's watch (30 s) before that.
    [ "$can_throttle" = 0 ] || [ "$rbd" = 1 ] || throttle off
    wait "$p" 2>/dev/null || true
    held_at_kill[$1]=$held
    echo "== live: $(date +%T.%N | cut -c1-12) kill -9 (restart $1, requests held: $held)" >> "$work/d.$(( $1 - 1 )).log"
    # QEMU sees the socket close and tries again every second (reconnect=1)
    sleep 0.5
    if ! start_daemon d "d.$1"; then
        # the rest of the run must not go on at one write a second
        [ "$can_throttle" = 0 ] || [ "$rbd" = 0 ] || throttle off
        return 0
    fi
    [ "$can_throttle" = 0 ] || [ "$rbd" = 0 ] || throttle off
    restarted=$((restarted + 1))
    t=$(date +%s)
    absent="${absent:+$absent, }$((t - t_kill)) s"
    while [ $(( $(date +%s) - t )) -lt 15 ]; do
        if grep -q "memory table set" "$work/d.$1.log"; then
            reconnected=$((reconnected + 1))
            say "restart $1: QEMU reconnected after $(( $(date +%s) - t )) s"
            return 0
        fi
        sleep 0.2
    done
    say "restart $1: QEMU did not reconnect within 15 s"
}
# rbd_watchers: the clients watching the image (every sqcqd that has it
# open), as "client.N" lines
rbd_watchers() {
    rbd_cli status --format json "$rbd_img" 2>/dev/null |
        python3 -c 'import json, sys
for w in json.load(sys.stdin).get("watchers", []): print("client.%s" % w["client"])' 2>/dev/null || true
}
# rbd_locker: who holds the image's exclusive lock ("client.N"), or
# nothing
rbd_locker() {
    rbd_cli lock ls --format json "$rbd_img" 2>/dev/null |
        python3 -c 'import json, sys
print(" ".join(l["locker"] for l in json.load(sys.stdin)))' 2>/dev/null || true
}
migrated="" locker_before=""
# migrate: vm1 -> vm2 over a unix socket, then vm1 quits
host_migrate() {
    local out
    [ "$rbd" = 0 ] || locker_before="$(rbd_locker)"
    [ "$can_throttle" = 0 ] || throttle 50
    out=$(qmp vm1 --migrate "unix:$work/migrate.sock" 180 2>&1) || true
    [ "$can_throttle" = 0 ] || throttle off
    echo "$out" > "$work/migrate.json"
    if ! echo "$out" | grep -q '"status": "completed"'; then
        check migrate/completed FAIL "$(echo "$out" | head -c 400)"
        return
    fi
    check migrate/completed PASS "$(echo "$out" | python3 -c 'import json, sys
m = json.load(sys.stdin); r = m.get("ram", {})
print("total %s ms, downtime %s ms, setup %s ms, RAM %d MiB in %s pass(es)" % (m.get("total-time"),
      m.get("downtime"), m.get("setup-time"), r.get("transferred", 0) >> 20, r.get("dirty-sync-count")))')"
    migrated=1
    ram_compare
    qmp vm2 cont > /dev/null 2>&1 || say "vm2 did not take 'cont'"
    qmp vm1 quit > /dev/null 2>&1 || true
    for _ in $(seq 50); do kill -0 "$vm1_pid" 2>/dev/null || break; sleep 0.2; done
    kill_group "$vm1_pid"
    current=vm2 current_pid="$vm2_pid" current_daemon=dst
}
# ram_compare: the source's RAM once the migration completed against the
# destination's before it runs (started with -S), page by page: what the
# migration did not carry, whoever wrote it (a vCPU, whose writes QEMU's
# dirty tracking follows, or the device, whose writes the dirty log must
# mark). Images on /dev/shm when it is there, removed at once.
ram_compare() {
    local dir="$work" out
    [ -d /dev/shm ] && [ -w /dev/shm ] && dir="$(mktemp -d /dev/shm/sqcq-ram.XXXXXX)"
    # "inmigrate" until the destination has loaded all it was sent (the
    # source's "completed" says it was sent), then "paused" (-S)
    local loaded=0
    for _ in $(seq 100); do
        qmp vm2 query-status 2>/dev/null | grep -q '"status": "paused"' && { loaded=1; break; }
        sleep 0.1
    done
    if [ "$loaded" = 0 ]; then
        check migrate/ram FAIL "the destination was not paused with its RAM loaded within 10 s"
    elif qmp vm1 pmemsave "{\"val\": 0, \"size\": $((ram_mib << 20)), \"filename\": \"$dir/src.ram\"}" > /dev/null &&
        qmp vm2 pmemsave "{\"val\": 0, \"size\": $((ram_mib << 20)), \"filename\": \"$dir/dst.ram\"}" > /dev/null; then
        if out=$(python3 "$here/ramdiff.py" "$dir/src.ram" "$dir/dst.ram"); then
            check migrate/ram PASS "before it ran, the destination's RAM equals the source's: $out"
        else
            check migrate/ram FAIL "the migration did not carry the source's RAM: $out"
        fi
    else
        check migrate/ram FAIL "QMP pmemsave of the source or the destination failed"
    fi
    rm -f "$dir/src.ram" "$dir/dst.ram"
    [ "$dir" = "$work" ] || rmdir "$dir"
}
host_action() { # the guest's SQCQ-HOST line
    say "guest: $*"
    case "$1" in
        live-restart) host_restart "$2" ;;
        live-migrate) host_migrate ;;
        *) say "the guest asked for '$1'" ;;
    esac
}

# supervise: the guest's stages, each with a deadline, until the current
# QEMU exits; the guest's SQCQ-HOST requests
supervise() {
    local start now stage limit changed state last="" inits dones asks seen=0 line
    start=$(date +%s); changed=$start
    verdict=""
    while kill -0 "$current_pid" 2>/dev/null; do
        sleep 0.5
        now=$(date +%s)
        asks=$(console | grep -c "^SQCQ-HOST " || true)
        while [ "$seen" -lt "$asks" ]; do
            seen=$((seen + 1))
            line=$(console | grep "^SQCQ-HOST " | sed -n "${seen}p" | cut -d' ' -f2-)
            # shellcheck disable=SC2086 # words of the request
            host_action $line
        done
        inits=$(console | grep -c SQCQ-INIT || true)
        dones=$(console | grep -c SQCQ-DONE || true)
        state="$inits/$dones"
        [ "$state" != "$last" ] && { last="$state"; changed=$now; }
        if [ "$inits" -gt 1 ]; then verdict="FAIL unexpected boot $inits"; break; fi
        if [ "$inits" -eq 0 ]; then stage=boot limit=$t_boot
        elif [ "$dones" -eq 0 ]; then stage=checks limit=$t_checks
        else stage=shutdown limit=$t_shutdown; fi
        if [ "$stage" != shutdown ] && ! daemon_alive "$current_daemon"; then
            verdict="FAIL sqcqd ($current_daemon) died during stage $stage"; break
        fi
        if [ $((now - changed)) -gt "$limit" ]; then verdict="FAIL stage $stage exceeded $limit s"; break; fi
    done
    now=$(date +%s)
    if [ -n "$verdict" ]; then
        kill_group "$current_pid"
    else
        local rc=0; wait "$current_pid" || rc=$?
        if [ "$rc" != 0 ]; then verdict="FAIL $current exited with status $rc: $(tail -n 3 "$work/$current.qemu.log" | tr '\n' ' ')"
        elif [ "$(console | grep -c SQCQ-DONE || true)" -lt 1 ]; then verdict="FAIL $current exited before the guest finished"
        else verdict="PASS booted, fio under $kind, powered off in $((now - start)) s"; fi
    fi
    say "$current: $verdict"
    # shellcheck disable=SC2086 # "STATUS reason..."
    check "$kind/qemu" $verdict
}

# queue_modes NAME: the modes sqcqd NAME served its request queues in, and
# what they completed
queue_modes() {
    python3 -c 'import json, sys
try:
    q = json.load(open(sys.argv[1]))["queues"]  # request queues only
    print(",".join(sorted({e["mode"] for e in q})) or "none", sum(e["completions"] for e in q))
except (OSError, ValueError, KeyError):
    print("none 0")' "$work/$1.stats.json"
}

# ------------------------------------------------------------------ run
throttle_setup
say "$kind, vhost-user-$dev, QEMU $($qemu --version | head -n 1 | sed 's/.*version //'), sqcqd $bin $daemon_extra"
say "guest: $kernel + $initrd"
if [ "$rbd" = 1 ]; then
    say "disk: RBD image $rbd_img ($CEPH_CONF); the daemons' I/O throttled when it matters by librbd's QoS"
else
    say "the daemons' I/O throttled when it matters: ${cg:-no (no blkio cgroup for $work)}${cg:+ ($cg_kind, disk $cg_disk)}"
fi
if [ "$kind" = restart ]; then
    reconnect=",reconnect=1"
    if start_daemon d d.0; then
        start_vm vm1 d
        current=vm1 current_pid=$vm_pid current_daemon=d
        supervise
        if [ "$restarted" = "$restarts" ] && [ "$reconnected" = "$restarts" ]; then
            check restart/reconnect PASS "$restarts times kill -9, a new sqcqd on the same socket and $disk_what, QEMU reconnected (memory table set); from each kill to the new sqcqd listening: $absent"
        else
            check restart/reconnect FAIL "$restarted of $restarts restarts, $reconnected reconnections of QEMU"
        fi
        if [ "$rbd" = 1 ]; then
            # each restarted daemon took the image's lock over from the
            # killed one at once, not after librbd's 30 s wait
            took=0
            for k in $(seq "$restarts"); do
                grep -q "took the exclusive lock over from the dead sqcqd" "$work/d.$k.log" 2>/dev/null &&
                    took=$((took + 1))
            done
            if [ "$took" = "$restarts" ]; then
                check restart/rbd_takeover PASS "each of $restarts restarted sqcqd took the exclusive lock over from the killed one (blocklisted it) at once"
            else
                check restart/rbd_takeover FAIL "$took of $restarts restarted sqcqd took the lock over from the killed one at once"
            fi
        fi
        # what each restarted instance resubmitted: the in_flight= of its
        # "resubmitting" lines
        # Each killed daemon that held requests (asked just before the
        # kill, writes throttled) must have them resubmitted by the next.
        r="" all=1 any=0 timed=0
        for i in $(seq "$restarts"); do
            n=$( { grep -i resubmit "$work/d.$i.log" 2>/dev/null || true; } |
                sed -n 's/.*in_flight=\([0-9]*\).*/\1/p' | awk '{ s += $1 } END { print s + 0 }')
            h=${held_at_kill[$i]:-?}
            r="$r${r:+, }#$i: $n (killed holding $h)"
            if [ "$n" -gt 0 ]; then any=1; fi
            case "$h" in
                ''|*[!0-9]*|0) ;;
                *) timed=$((timed + 1)); [ "$n" -gt 0 ] || all=0 ;;
            esac
        done
        if [ "$can_throttle" = 1 ] && [ "$all" = 1 ] && [ "$timed" -gt 0 ]; then
            check restart/resubmit PASS "requests resubmitted by each restarted sqcqd (its in-flight record): $r"
        elif [ "$can_throttle" = 1 ] && [ "$all" = 1 ]; then
            check restart/resubmit FAIL "no kill found the daemon holding a request (I/O throttled, 15 s waited each): $r"
        elif [ "$can_throttle" = 1 ]; then
            check restart/resubmit FAIL "requests resubmitted per restarted sqcqd: $r; a daemon killed holding requests had none resubmitted"
        elif [ "$any" = 1 ]; then
            check restart/resubmit PASS "requests resubmitted per restarted sqcqd: $r (kills not timed: no blkio cgroup)"
        else
            check restart/resubmit SKIP "no request resubmitted ($r); kills not timed (no blkio cgroup for the image's disk), the daemon may have held none"
        fi
        if [ "$packed" = 1 ]; then
            # A packed ring's record gives the positions it continues at
            # (avail= used=); a split ring's its next avail index.
            p=$(cat "$work"/d.*.log 2>/dev/null | grep -c "resubmitting.* used=" || true)
            if [ "$p" -gt 0 ]; then
                check restart/packed PASS "$p queue starts continued from a packed ring's in-flight record"
            else
                check restart/packed FAIL "no queue start read a packed ring's in-flight record"
            fi
        fi
        read -r m c < <(queue_modes d)
        if [ "$m" = "$queue_mode" ] && [ "$c" -gt 0 ]; then
            check restart/queue_mode PASS "the last sqcqd served the request queues in $m ($c requests completed)"
        else
            check restart/queue_mode FAIL "the last sqcqd: modes '$m', $c requests completed; expected $queue_mode"
        fi
    else
        check daemon/start FAIL "sqcqd did not start: $(tail -n 1 "$work/d.0.log")"
    fi
else
    # On RBD: which Ceph client each daemon is, from the image's watchers
    # as each one opened it (the source first)
    src_client="" dst_client=""
    if start_daemon src && { [ "$rbd" = 0 ] || src_client="$(rbd_watchers)"; } &&
       start_daemon dst && { [ "$rbd" = 0 ] || dst_client="$(rbd_watchers | grep -vxF "${src_client:-none}" || true)"; }; then
        start_vm vm2 dst -incoming "unix:$work/migrate.sock" -S
        vm2_pid=$vm_pid
        start_vm vm1 src
        vm1_pid=$vm_pid
        current=vm1 current_pid=$vm1_pid current_daemon=src
        supervise
        if [ "$migrated" = 1 ]; then
            # what the guest printed after the migration
            if tr -d '\r' < "$work/vm2.console.log" | grep -c "^CHECK disk0/live_fio " > /dev/null; then
                check migrate/destination PASS "the guest finished fio on the destination ($(tr -d '\r' < "$work/vm2.console.log" | grep -c '^CHECK ') check lines there)"
            else
                check migrate/destination FAIL "the destination's console has no fio result"
            fi
            # what the source said about the log QEMU gave it (SET_LOG_BASE,
            # VHOST_F_LOG_ALL); loosely: any line about a dirty log
            dl=$({ grep -i "dirty log\|logging=true" "$work/src.log" || true; } |
                sed 's/^[^ ]* *[A-Z]* *[a-z_:]*: //; s/ device=[^ ]*//' | awk 'NR <= 2' | tr '\n' ';')
            if [ -n "$dl" ]; then
                check migrate/dirty_log PASS "source sqcqd: ${dl%;}"
            else
                check migrate/dirty_log FAIL "the source sqcqd logged nothing about a dirty log"
            fi
            # Fencing: the exclusive lock went from the source to the
            # destination, which still holds it now that the guest is done
            if [ "$rbd" = 1 ]; then
                after="$(rbd_locker)"
                who="source $src_client, destination $dst_client"
                if [ -z "$src_client" ] || [ -z "$dst_client" ] || [ "$src_client" = "$dst_client" ]; then
                    check migrate/rbd_lock FAIL "cannot tell the daemons' Ceph clients apart from the image's watchers ($who)"
                elif [ "$locker_before" != "$src_client" ]; then
                    check migrate/rbd_lock FAIL "before the migration the lock was held by '${locker_before:-nobody}', not the source ($who)"
                elif [ "$after" != "$dst_client" ]; then
                    check migrate/rbd_lock FAIL "after the migration the lock is held by '${after:-nobody}', not (only) the destination ($who)"
                else
                    check migrate/rbd_lock PASS "exclusive lock of $rbd_img: held by the source ($src_client) before the migration, by the destination ($dst_client) after it, the source (still running) no longer holds it (rbd lock ls)"
                fi
            fi
            read -r m c < <(queue_modes dst)
            read -r ms cs < <(queue_modes src)
            if [ "$m" = "$queue_mode" ] && [ "$c" -gt 0 ]; then
                check migrate/queue_mode PASS "destination sqcqd: request queues in $m, $c requests completed (source: $ms, $cs)"
            else
                check migrate/queue_mode FAIL "destination sqcqd: modes '$m', $c requests completed; expected $queue_mode (source: $ms, $cs)"
            fi
        elif ! grep -q "^migrate/completed" "$results"; then
            check migrate/completed FAIL "the guest never asked for the migration"
        fi
    else
        check daemon/start FAIL "sqcqd did not start: $(tail -n 1 "$work/src.log" "$work/dst.log" 2>/dev/null)"
    fi
fi

# the device counters of the daemons still running (errors, refused
# requests), for the record
for name in "${!daemon_pid[@]}"; do
    daemon_alive "$name" || continue
    "$bin" rpc --admin-socket "$work/$name.admin" stats_get > "$work/$name.stats-get.json" 2>&1 || true
done

# the guest's checks, from every console
console | sed -n 's/^CHECK //p' > "$work/got"
while read -r ck; do
    line="$(awk -v n="$ck" '$1 == n { print; exit }' "$work/got")"
    if [ -n "$line" ]; then echo "guest/$line" >> "$results"
    else check "guest/$ck" FAIL "not reported (the guest stopped before it)"; fi
done < <(awk '/^#/ || NF < 3 || $1 != "live" { next }
              $2 == "global" { print $3 } $2 == "disk0" { print "disk0/" $3 }' "$here/checks.list")

# ---------------------------------------------------------------- report
echo
print_results "$results" 24
if [ "$nfail" -gt 0 ]; then
    echo; echo "---- tail of the console ----"; console | tail -n 60
    for f in "$work"/vm*.qemu.log "$work"/*.log; do
        [ -s "$f" ] || continue
        echo; echo "---- tail of $(basename "$f") ----"; tail -n 30 "$f"
    done
    keep=1
fi
echo
say "total $(( $(date +%s) - t0 )) s"
echo "live: $npass passed, $nfail failed, $nskip skipped"
[ "$nfail" -eq 0 ]
