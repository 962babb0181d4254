#!/usr/bin/env bash
# The QEMU (TCG) interop suite: a real Linux guest against a vhost-user SCSI
# daemon. See docs/guest-tests.md. Entry point: scripts/guest-test.sh.
#
# Runs, one QEMU at a time, against one daemon process:
#   run1  qboot (or --bios), -no-reboot, every check (sqcq_mode=full)
#   run2  SeaBIOS (or --bios2), a second QEMU after the first one exited,
#         against the same daemon when it keeps serving (else a fresh one,
#         --one-connection); the guest runs the quick checks, verifies
#         run1's data, reboots itself, runs them again, powers off
#         (with --no-reset: no reboot, qboot)
# and prints every check, then "guest: N passed, M failed, K skipped".
# Exit status 1 when any check failed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"
source tests/guest/lib.sh

usage() {
    cat <<'EOF'
usage: scripts/guest-test.sh [options]
  --daemon NAME         sqcqd (default) | vhost-device-scsi | custom
  --daemon-cmd CMD      daemon command line; {socket} and {dir} (a scratch
                        directory) are substituted. Implies --daemon custom
                        unless --daemon is given. Env: SQCQ_GUEST_DAEMON_CMD
  --num-queues N        virtio-scsi request queues (QEMU num_queues)
  --disks N             disks (LUNs) the guest must find
  --block-sizes A,B     logical block size of each disk, in HCTL order
  --device-opts OPTS    extra vhost-user-scsi-pci properties (comma-separated)
  --one-connection      the daemon serves one connection and exits: the
                        second QEMU gets a fresh daemon (reported as SKIP)
  --images A,B          create these 64 MiB sparse files in {dir} first
  --file-backed         the LUNs keep their data across a daemon restart
  --no-reset            the daemon is known not to survive a device reset
                        within one connection: run2 does not reboot and
                        both runs use qboot (both reported as SKIP);
                        --reset forces the reset runs on
  --bios qboot|seabios  firmware of run1 (default qboot when installed)
  --bios2 qboot|seabios firmware of run2 (default seabios)
  --only-run1           skip run2 (no reboot, no second QEMU)
  --sqcq                the VIRTIO_F_SQCQ_POLL guest: QEMU with patches/qemu
                        (scripts/build-qemu.sh, sqcq_poll=on) and the guest's
                        virtio modules with patches/linux
                        (scripts/build-guest-modules.sh); the guest expects
                        bit 42 unless the daemon withholds it (--no-sqcq)
  --packed              with --sqcq: packed virtqueues. QEMU's device gets
                        packed=on, sqcqd --packed (it offers
                        VIRTIO_F_RING_PACKED beside bit 42), and the guest
                        must negotiate both bit 34 (RING_PACKED) and bit 42
                        (the doorbells then follow the Device Area: spec
                        section 10); sqcqd only, virtio-scsi or (--blk)
                        virtio-blk
  --daemon-extra ARGS   more sqcqd options (e.g. --no-sqcq, '--poll ring')
  --measure             run1 counts interrupts, CPU time (guest) and kicks
                        (daemon) per I/O under fio at QD1 and QD32, and
                        appends them to target/guest/measure.txt
  --label NAME          the configuration's name in measure.txt (default:
                        the queue mode, e.g. sqcq; sqcq-packed with --packed)
  --spin-max-us N       longest spin window of both sides' pollers, µs
                        (default with --sqcq: 5000, TCG's time scale; see
                        docs/guest-tests.md)
  --blk                 vhost-user-blk instead of vhost-user-scsi: sqcqd
                        serves two blk devices from a configuration file
                        (64 MiB RAM disks: vda read-write with 512-byte
                        blocks, vdb read-only with 4096), QEMU attaches
                        them with vhost-user-blk-pci; with --sqcq the
                        patched virtio_blk negotiates bit 42 on both
  --rbd                 sqcqd's disks are fresh 64 MiB images of the Ceph
                        test cluster (scripts/ceph-cluster.sh: the
                        environment's, else started), removed at the end;
                        the resize check resizes the image in the cluster
                        (rbd resize), not through the daemon. SKIP without a
                        cluster (FAIL under SQCQ_REQUIRE_PEERS)
  --backpressure        with --sqcq: sqcqd serves the two disks from files
                        with --max-inflight 4, from a blkio cgroup of its
                        own, and the guest runs fio (QD 64, verify) on the
                        second disk (with --blk the first, before its other
                        checks: the second is read-only) while the host
                        limits the daemon's I/O to 200 a second (SQCQ-HOST
                        throttle-on/-off): the device sets THROTTLE, the
                        driver holds requests back (holds= in its statistics
                        line), nothing times out (spec section
                        "Backpressure")
  --keep                keep the scratch directory (logs, images)
Env: SQCQ_GUEST_DAEMON (= --daemon), SQCQD (path of sqcqd),
     SQCQ_GUEST_TIMEOUT_BOOT/_CHECKS/_STALL/_SHUTDOWN (seconds: 90/240/90/30;
       STALL: longest time without a new CHECK line), SQCQ_GUEST_APPEND
       (more kernel arguments; without "quiet" the kernel log stays on the
       console: SQCQ_GUEST_APPEND=verbose)
EOF
}

daemon="${SQCQ_GUEST_DAEMON:-}"
images=()
daemon_cmd="${SQCQ_GUEST_DAEMON_CMD:-}"
nq="" disks="" bss="" one_conn="" file_backed="" no_reset="" bios="" bios2="" only_run1=0 keep=0
sqcq=0 daemon_extra="" measure=0 label="" spin_max_us="" blk=0 rbd=0 bp=0 packed=0
no_reset_why="the daemon does not survive a device reset within a connection (--no-reset)"
dev_opts="${SQCQ_GUEST_DEVICE_OPTS-unset}"
while [ $# -gt 0 ]; do
    case "$1" in
    --daemon) daemon="$2"; shift ;;
    --daemon-cmd) daemon_cmd="$2"; shift ;;
    --num-queues) nq="$2"; shift ;;
    --disks) disks="$2"; shift ;;
    --block-sizes) bss="$2"; shift ;;
    --device-opts) dev_opts="$2"; shift ;;
    --one-connection) one_conn=1 ;;
    --file-backed) file_backed=1 ;;
    --images) IFS=, read -r -a images <<< "$2"; shift ;;
    --no-reset) no_reset=1 ;;
    --reset) no_reset=0 ;;
    --bios) bios="$2"; shift ;;
    --bios2) bios2="$2"; shift ;;
    --only-run1) only_run1=1 ;;
    --sqcq) sqcq=1 ;;
    --packed) packed=1 ;;
    --daemon-extra) daemon_extra="$2"; shift ;;
    --measure) measure=1 ;;
    --label) label="$2"; shift ;;
    --spin-max-us) spin_max_us="$2"; shift ;;
    --blk) blk=1 ;;
    --rbd) rbd=1 ;;
    --backpressure) bp=1 ;;
    --keep) keep=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "guest-test: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
[ -n "$daemon" ] || { [ -n "$daemon_cmd" ] && daemon=custom || daemon=sqcqd; }
if [ "$packed" = 1 ]; then
    [ "$sqcq" = 1 ] && [ "$daemon" = sqcqd ] ||
        { echo "guest-test: --packed needs --sqcq and sqcqd" >&2; exit 2; }
    # sqcqd offers VIRTIO_F_RING_PACKED only when asked
    daemon_extra="${daemon_extra:+$daemon_extra }--packed"
    # measure.txt's default label: sqcq-packed
    packed_label=-packed
fi

t_boot="${SQCQ_GUEST_TIMEOUT_BOOT:-90}"
t_checks="${SQCQ_GUEST_TIMEOUT_CHECKS:-600}"
t_stall="${SQCQ_GUEST_TIMEOUT_STALL:-90}"
t_shutdown="${SQCQ_GUEST_TIMEOUT_SHUTDOWN:-30}"
t0=$(date +%s)
say() { echo "guest-test: $*"; }

# ------------------------------------------------------------ RBD disks
if [ "$rbd" = 1 ]; then
    [ "$daemon" = sqcqd ] || { say "--rbd: the disks are sqcqd's (--daemon sqcqd)"; exit 2; }
    if ! rbd_setup; then
        if [ -n "${SQCQ_REQUIRE_PEERS:-}" ]; then
            say "FAIL: $rbd_why; SQCQ_REQUIRE_PEERS is set, so nothing may be skipped"; exit 1
        fi
        say "SKIP: $rbd_why, nothing to test"; exit 0
    fi
fi

# ------------------------------------------------------------ daemon profiles
case "$daemon" in
sqcqd)
    bin="${SQCQD:-}"
    if [ -z "$bin" ]; then
        bin="$(ls -t target/release/sqcqd target/debug/sqcqd 2>/dev/null | head -n 1 || true)"
    fi
    if [ -z "$bin" ] || [ ! -x "$bin" ]; then
        say "SKIP: sqcqd is not built (no target/release/sqcqd or target/debug/sqcqd;" \
            "cargo build --release -p sqcq-target), nothing to test"
        exit 0
    fi
    if [ "$rbd" = 1 ] && [ "$blk" = 0 ]; then
        : "${daemon_cmd:="$bin --socket-path {socket} --num-queues 2 --lun $(rbd_lun lun0) --lun $(rbd_lun lun1),block-size=4096 --stats-file {dir}/stats.json --stats-interval 1 --admin-socket {dir}/admin.sock $daemon_extra"}"
    elif [ "$bp" = 1 ] && [ "$blk" = 1 ]; then
        # the disks of blk.toml on files (blk_toml ... file)
        : "${daemon_cmd:="$bin --config {dir}/blk.toml --max-inflight 4 --stats-file {dir}/stats.json --stats-interval 1 --admin-socket {dir}/admin.sock $daemon_extra"}"
        [ "${#images[@]}" -gt 0 ] || images=(vda.img vdb.img)
        file_backed=1
    elif [ "$bp" = 1 ]; then
        : "${daemon_cmd:="$bin --socket-path {socket} --num-queues 2 --lun kind=file,path={dir}/lun0.img --lun kind=file,path={dir}/lun1.img,block-size=4096 --max-inflight 4 --stats-file {dir}/stats.json --stats-interval 1 --admin-socket {dir}/admin.sock $daemon_extra"}"
        [ "${#images[@]}" -gt 0 ] || images=(lun0.img lun1.img)
        file_backed=1
    elif [ "$blk" = 1 ]; then
        : "${daemon_cmd:="$bin --config {dir}/blk.toml --stats-file {dir}/stats.json --stats-interval 1 --admin-socket {dir}/admin.sock $daemon_extra"}"
    else
        : "${daemon_cmd:="$bin --socket-path {socket} --num-queues 2 --lun kind=ram,size=64M --lun kind=ram,size=64M,block-size=4096 --stats-file {dir}/stats.json --stats-interval 1 --admin-socket {dir}/admin.sock $daemon_extra"}"
    fi
    spin_daemon=1
    # the host resizes the first disk when the guest asks (SQCQ-HOST
    # resize-grow/-shrink): through the admin socket, or in the cluster
    if [[ "$daemon_cmd" == *"{dir}/admin.sock"* ]] || [ "$rbd" = 1 ]; then can_resize=1; fi
    # (a file LUN grows but does not shrink back: no resize check there)
    [ "$bp" = 0 ] || can_resize=0
    [ "$rbd" = 0 ] || file_backed=1
    : "${nq:=2}" "${disks:=2}" "${bss:=512,4096}" "${one_conn:=0}" "${file_backed:=0}" "${no_reset:=0}"
    ;;
vhost-device-scsi)
    bin="${SQCQ_TOOLS:-$repo/target/tools}/bin/vhost-device-scsi"
    [ -x "$bin" ] || scripts/install-peers.sh
    # one request queue, 512-byte blocks, one LUN per image file
    : "${daemon_cmd:="$bin --socket-path {socket} {dir}/lun0.img {dir}/lun1.img"}"
    [ "${#images[@]}" -gt 0 ] || images=(lun0.img lun1.img)
    : "${nq:=1}" "${disks:=2}" "${bss:=512,512}" "${one_conn:=1}" "${file_backed:=1}"
    # 0.1.0 keeps its used index across a device reset (its
    # vhost-user-backend 0.10 SET_VRING_BASE sets next_avail, not
    # next_used): after SeaBIOS or a guest reboot, Linux gets
    # "virtio_scsi: request:id 0 is not a head!" and finds no disk.
    if [ -z "$no_reset" ]; then
        no_reset=1
        no_reset_why="vhost-device-scsi 0.1.0 keeps a stale used index across a device reset (guest: 'request:id 0 is not a head!'); --reset runs it anyway"
    fi
    # it does not offer VIRTIO_SCSI_F_CHANGE, which QEMU 7.2 offers itself
    # and forwards in SET_FEATURES: vhost-user-backend then drops the
    # connection. param_change=off keeps the bit out.
    [ "$dev_opts" != unset ] || dev_opts="param_change=off"
    ;;
custom)
    [ -n "$daemon_cmd" ] || { say "--daemon custom needs --daemon-cmd"; exit 2; }
    : "${nq:=1}" "${disks:=1}" "${one_conn:=0}" "${file_backed:=0}" "${no_reset:=0}"
    ;;
*) say "unknown daemon '$daemon'"; exit 2 ;;
esac

[ "$dev_opts" != unset ] || dev_opts=""
# What the daemon's request queues must have run as, and whether the
# guest must negotiate bit 42.
expect_sqcq=off queue_mode=kick
# sqcqd's default, --poll auto, ring-polls within a window bounded by
# the wakeup cost it measured (under TCG gaps outlast it: kicks serve).
case " $daemon_extra " in *" --poll kick "*|*" --poll=kick "*) ;; *) queue_mode=ring-poll ;; esac
qemu=qemu-system-x86_64 modules_dir=""
# SQCQ_GUEST_QEMU (scripts/guest-test.sh --qemu-version): that series'
# patched QEMU for every run; otherwise the patched 7.2 for --sqcq
if [ -n "${SQCQ_GUEST_QEMU:-}" ]; then
    qemu="$(scripts/build-qemu.sh "$SQCQ_GUEST_QEMU")" || { say "building QEMU $SQCQ_GUEST_QEMU failed"; exit 1; }
fi
if [ "$sqcq" = 1 ]; then
    [ -n "${SQCQ_GUEST_QEMU:-}" ] || qemu="$(scripts/build-qemu.sh)" || { say "building the patched QEMU failed"; exit 1; }
    modules_dir="$(scripts/build-guest-modules.sh)" || { say "building the guest modules failed"; exit 1; }
    dev_opts="sqcq_poll=on${dev_opts:+,$dev_opts}"
    # --packed: QEMU offers VIRTIO_F_RING_PACKED (bit 34) to the guest
    [ "$packed" = 1 ] && dev_opts="$dev_opts,packed=on"
    # Under TCG the guest runs about a hundred times slower than under
    # KVM: gaps between requests and the cost of a wakeup grow alike, so
    # the pollers' longest window grows with them (both sides).
    : "${spin_max_us:=5000}"
    case " $daemon_extra " in
        *" --no-sqcq "*) ;;
        *) expect_sqcq=on queue_mode=sqcq ;;
    esac
fi
if [ -n "$spin_max_us" ]; then
    if [ "${spin_daemon:-0}" = 1 ]; then daemon_cmd="$daemon_cmd --spin-us 1,$spin_max_us"; fi
    # (only the patched virtio_scsi and virtio_blk know the parameter)
    if [ "$sqcq" = 1 ]; then
        guest_spin="virtio_$([ "$blk" = 1 ] && echo blk || echo scsi).sqcq_spin_max_ns=$((spin_max_us * 1000))"
    fi
fi
qboot=/usr/share/qemu/qboot.rom
if [ -z "$bios" ]; then [ -r "$qboot" ] && bios=qboot || bios=seabios; fi
if [ -z "$bios2" ]; then [ "$no_reset" = 1 ] && bios2=$bios || bios2=seabios; fi

# ------------------------------------------------- scratch, lock, cleanup
mkdir -p target/guest
# one harness (hence one QEMU) at a time on this machine
exec 9> target/guest/qemu.lock
if ! flock -w 900 9; then say "another guest test held target/guest/qemu.lock for 900 s"; exit 1; fi
work="$(mktemp -d /tmp/sqcq-guest.XXXXXX)"
sock="$work/vhost.sock"
cg=""
if [ "$bp" = 1 ]; then
    [ "$sqcq" = 1 ] && [ "$daemon" = sqcqd ] && [ "$rbd" = 0 ] ||
        { say "--backpressure needs --sqcq and sqcqd (file disks)"; exit 2; }
    blkio_setup "sqcq-guest-$$" "$work" ||
        { say "--backpressure needs a blkio (v1) or io (v2) cgroup controller for the disk under $work"; exit 1; }
fi
# check-set prefix: "" for virtio-scsi, "b" for virtio-blk
P=""
if [ "$blk" = 1 ]; then
    P=b
    # the last socket the daemon creates: QEMU starts once it is there
    sock="$work/blk1.sock"
    # shellcheck source=tests/guest/blk-toml.sh
    source "$here/blk-toml.sh"
    disk_kind=""
    [ "$rbd" = 1 ] && disk_kind="rbd"
    [ "$bp" = 1 ] && disk_kind="file"
    blk_toml "$work" "$nq" "$disk_kind" > "$work/blk.toml"
fi
qemu_pid="" daemon_pid=""
cleanup() {
    local rc=$?
    kill_group "$qemu_pid"; qemu_pid=""
    kill_group "$daemon_pid"; daemon_pid=""
    [ "$rbd" = 0 ] || rbd_remove_all
    [ -z "$cg" ] || rmdir "$cg" 2>/dev/null || true
    keep_logs "$rc" "$work"
    if [ "$keep" = 1 ]; then say "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM HUP

# ------------------------------------------------------------- the guest
build_guest "$modules_dir"
[ -n "$kernel" ] && [ -n "$initrd" ] || { say "building the guest failed"; exit 1; }
t_build=$(( $(date +%s) - t0 ))

# the disks: 64 MiB images, the first one resized by the resize check
resize_img=""
if [ "$rbd" = 1 ]; then
    if [ "$blk" = 1 ]; then rbd_names="vda vdb"; else rbd_names="lun0 lun1"; fi
    for n in $rbd_names; do
        rbd_create "$n" 64M || { say "rbd create $rbd_prefix-$n failed"; exit 1; }
    done
    resize_img="$SQCQ_CEPH_POOL/$rbd_prefix-${rbd_names%% *}"
    say "disks: RBD images $rbd_prefix-{${rbd_names// /,}} in pool $SQCQ_CEPH_POOL ($CEPH_CONF)"
fi

# ------------------------------------------------------------- results
results="$work/results"   # "name STATUS reason" lines
: > "$results"
host_check() { echo "$1 $2 ${*:3}" >> "$results"; }

start_daemon() {
    local cmd="${daemon_cmd//\{socket\}/$sock}"
    cmd="${cmd//\{dir\}/$work}"
    rm -f "$sock"
    for img in "${images[@]}"; do
        [ -e "$work/$img" ] || truncate -s 64M "$work/$img"
    done
    echo "== $(date +%T) $cmd" >> "$work/daemon.log"
    # --backpressure: the daemon (all its threads, io_uring's io-wq too)
    # in the cgroup whose I/O the host limits
    [ -z "$cg" ] || cmd="echo \$\$ > $cg/cgroup.procs && exec $cmd"
    # setsid: the daemon leads its own process group (killed as a group)
    setsid sh -c "$cmd" >> "$work/daemon.log" 2>&1 < /dev/null &
    daemon_pid=$!
    for _ in $(seq 100); do
        [ -S "$sock" ] && return 0
        kill -0 "$daemon_pid" 2>/dev/null || break
        sleep 0.1
    done
    say "the daemon did not create $sock within 10 s:"
    tail -n 20 "$work/daemon.log" | sed 's/^/    /'
    return 1
}
daemon_alive() { [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; }
daemon_status() { # after it exited
    local rc=0; wait "$daemon_pid" 2>/dev/null || rc=$?; echo "$rc"
}

# expected RUN BOOTSET... : expands checks.list for one boot
expected() {
    local sets=" ${*:1} " ndisk="$disks"
    awk -v sets="$sets" -v n="$ndisk" '
        /^#/ || NF < 3 { next }
        index(sets, " " $1 " ") == 0 { next }
        $2 == "global" { print $3 }
        $2 == "disk"   { for (i = 0; i < n; i++) print "disk" i "/" $3 }
        $2 == "disk0"  { print "disk0/" $3 }
        $2 == "disk1"  { print "disk1/" $3 }' "$here/checks.list"
}

# collect RUN LOG "BOOTSETS1" ["BOOTSETS2"]: guest checks of each boot
collect() {
    local run="$1" log="$2"; shift 2
    local boot=0 label
    local total=$#
    for sets in "$@"; do
        boot=$((boot + 1))
        label="$run"; [ "$total" -gt 1 ] && label="$run.boot$boot"
        # the CHECK lines between the boot-th SQCQ-INIT and the next one
        tr -d '\r' < "$log" | awk -v b="$boot" '
            /SQCQ-INIT/ { n++ } n == b && /^CHECK / { sub(/^CHECK /, ""); print }' \
            > "$work/got"
        while read -r name; do
            line="$(awk -v n="$name" '$1 == n { print; exit }' "$work/got")"
            if [ -n "$line" ]; then echo "$label/$line" >> "$results"
            else echo "$label/$name FAIL not reported (the guest stopped before it)" >> "$results"; fi
        done < <(expected $sets)
        # anything reported but not expected is shown too
        awk '{print $1}' "$work/got" | while read -r name; do
            grep -qxF "$name" <<< "$(expected $sets)" || grep "^$name " "$work/got" | head -n 1 | sed "s|^|$label/|" >> "$results"
        done
    done
}

# qemu RUN FIRMWARE MODE NONCE PREV BOOTS: one QEMU, supervised
qemu_run() {
    local run="$1" fw="$2" mode="$3" nonce="$4" prev="$5" boots="$6"
    local log="$work/$run.console.log"
    local append="console=ttyS0 panic=-1"
    case "${SQCQ_GUEST_APPEND:-}" in
        *verbose*) append="$append loglevel=7 ${SQCQ_GUEST_APPEND/verbose/}" ;;
        *) append="$append quiet loglevel=3 ${SQCQ_GUEST_APPEND:-}" ;;
    esac
    append="$append sqcq_mode=$mode sqcq_disks=$disks sqcq_expect=$expect_sqcq ${guest_spin:-}"
    [ "$packed" = 1 ] && append="$append sqcq_packed=on"
    [ "$blk" = 1 ] && append="$append sqcq_dev=blk"
    if [ -n "$resize_img" ]; then append="$append sqcq_resize=rbd"
    elif [ "${can_resize:-0}" = 1 ]; then append="$append sqcq_resize=admin"; fi
    [ "$measure" = 1 ] && [ "$mode" = full ] && append="$append sqcq_measure=1"
    [ "$bp" = 1 ] && [ "$mode" = full ] && append="$append sqcq_bp=1"
    append="$append sqcq_mq=$(( nq < 2 ? nq : 2 )) sqcq_nonce=$nonce sqcq_timeout=60"
    [ -n "$bss" ] && append="$append sqcq_bs=$bss"
    [ -n "$prev" ] && append="$append sqcq_prev=$prev"
    local args=("$qemu" -accel tcg -cpu max -m 512M -smp 2
        -object memory-backend-memfd,id=mem,size=512M,share=on -numa node,memdev=mem
        -nodefaults -no-user-config -display none -nic none -monitor none
        -serial "file:$log" -kernel "$kernel" -initrd "$initrd" -append "$append")
    if [ "$blk" = 1 ]; then
        args+=(-chardev "socket,id=vub0,path=$work/blk0.sock"
            -device "vhost-user-blk-pci,chardev=vub0,num-queues=$nq${dev_opts:+,$dev_opts}"
            -chardev "socket,id=vub1,path=$work/blk1.sock"
            -device "vhost-user-blk-pci,chardev=vub1,num-queues=$nq${dev_opts:+,$dev_opts}")
    else
        args+=(-chardev "socket,id=vus,path=$sock"
            -device "vhost-user-scsi-pci,chardev=vus,num_queues=$nq${dev_opts:+,$dev_opts}")
    fi
    [ "$fw" = qboot ] && args+=(-bios "$qboot")
    [ "$boots" = 1 ] && args+=(-no-reboot)
    : > "$log"
    echo "${args[*]}" > "$work/$run.cmdline"
    : > "$work/$run.snapshots"
    local hard=$(( (t_boot + t_checks) * boots + t_shutdown ))
    local start; start=$(date +%s)
    setsid timeout -k 5 "$hard" "${args[@]}" > "$work/$run.qemu.log" 2>&1 < /dev/null &
    qemu_pid=$!
    say "$run: $fw, $mode, $boots boot(s), num_queues=$nq"
    # the supervisor: stage deadlines, daemon watchdog, boot count
    local state="" last="" changed=$start now inits dones reboots limit stage verdict=""
    local checks progress=$start lastchecks=0 marks seen_marks=0 asks seen_asks=0
    while kill -0 "$qemu_pid" 2>/dev/null; do
        sleep 0.5
        now=$(date +%s)
        # the daemon's figures at each SQCQ-SNAPSHOT / MEASURE line (the
        # guest idles 2-3 s around them; the file is rewritten every second)
        # what the guest asks the host to do (SQCQ-HOST lines)
        asks=$(grep -c "^SQCQ-HOST " "$log" || true)
        while [ "$seen_asks" -lt "$asks" ]; do
            seen_asks=$((seen_asks + 1))
            host_action "$(grep "^SQCQ-HOST " "$log" | sed -n "${seen_asks}p" | tr -d '\r' | cut -d' ' -f2)"
        done
        marks=$(grep -cE "^(SQCQ-SNAPSHOT|MEASURE-)" "$log" || true)
        while [ "$seen_marks" -lt "$marks" ]; do
            seen_marks=$((seen_marks + 1))
            # a statistics file written after the line appeared (every
            # second; at most 2.5 s)
            local seen_at; seen_at=$(date +%s.%N)
            for _ in 1 2 3 4 5 6 7 8 9 10; do
                sleep 0.25
                [ "$(stat -c %.9Y "$work/stats.json" 2>/dev/null || echo 0)" \> "$seen_at" ] && break
            done
            printf '%s\t%s\n' "$(grep -E "^(SQCQ-SNAPSHOT|MEASURE-)" "$log" | sed -n "${seen_marks}p" | tr -d '\r')" \
                "$(tr -d '\n' < "$work/stats.json" 2>/dev/null)" >> "$work/$run.snapshots"
        done
        inits=$(grep -c SQCQ-INIT "$log" || true)
        dones=$(grep -c SQCQ-DONE "$log" || true)
        reboots=$(grep -c SQCQ-REBOOT "$log" || true)
        checks=$(grep -c "^CHECK " "$log" || true)
        [ "$checks" != "$lastchecks" ] && { lastchecks=$checks; progress=$now; }
        state="$inits/$dones/$reboots"
        [ "$state" != "$last" ] && { last="$state"; changed=$now; }
        if [ "$inits" -gt "$boots" ]; then
            verdict="FAIL unexpected boot $inits (expected $boots)"; break
        elif [ "$inits" -eq 0 ] || { [ "$reboots" -ge "$inits" ] && [ "$dones" -ge "$inits" ]; }; then
            stage=boot limit=$t_boot
        elif [ "$dones" -lt "$inits" ]; then
            stage=checks limit=$t_checks
        else
            stage=shutdown limit=$t_shutdown
        fi
        # watchdog: a daemon gone while the guest needs it stops the run;
        # once the guest is powering off, QEMU's disconnect may end it
        if [ "$stage" != shutdown ] && ! daemon_alive; then
            verdict="FAIL the daemon died (status $(daemon_status)) during stage $stage"; break
        fi
        if [ $((now - changed)) -gt "$limit" ]; then
            verdict="FAIL stage $stage exceeded $limit s"; break
        fi
        if [ "$stage" = checks ] && [ $((now - progress)) -gt "$t_stall" ] && [ $((now - changed)) -gt "$t_stall" ]; then
            # (no CHECK line yet is not an error of the pipeline: pipefail)
            verdict="FAIL no check finished for $t_stall s (after $checks checks; the last: $({ grep "^CHECK " "$log" || true; } | tail -n 1 | cut -d' ' -f2))"; break
        fi
    done
    if [ -n "$verdict" ]; then
        kill_group "$qemu_pid"
    else
        local rc=0; wait "$qemu_pid" || rc=$?
        if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then verdict="FAIL hard timeout $hard s"
        elif [ "$rc" != 0 ]; then verdict="FAIL qemu exited with status $rc: $(tail -n 3 "$work/$run.qemu.log" | tr '\n' ' ')"
        elif [ "$(grep -c SQCQ-DONE "$log" || true)" -lt "$boots" ]; then
            verdict="FAIL qemu exited after $(grep -c SQCQ-INIT "$log" || true) of $boots boots without finishing"
        else verdict="PASS $boots boot(s) and power-off in $(( $(date +%s) - start )) s"; fi
    fi
    qemu_pid=""
    host_check "$run/qemu" $verdict
    say "$run: $verdict ($(( $(date +%s) - start )) s)"
}

# host_action WHAT: what the guest asked for, a call of the daemon's
# management API (the resizes of an RBD disk: in the cluster, the daemon
# is not told); host-actions.log gets a line per call, "== TIME rpc
# METHOD PARAMS -> ok RESULT" or "-> error ERROR"
host_action() {
    local call
    case "$1" in
        lun-add) call=(lun_add device=0 lun=2 kind=ram size=16M) ;;
        lun-remove) call=(lun_remove device=0 lun=2 force=true) ;;
        # every running request queue stops at its next request, as for
        # a nonsense doorbell
        queue-break) call=(fault_break device=0) ;;
        # --backpressure: the daemon's I/O on its disk limited, or not
        throttle-on|throttle-off)
            if [ -z "$cg" ]; then say "the guest asked for '$1' without --backpressure"; return; fi
            if [ "$1" = throttle-on ]; then blkio_limit 200; else blkio_limit off; fi
            echo "== $(date +%T) $1 ($cg_kind $cg, disk $cg_disk)" >> "$work/host-actions.log"
            return ;;
        # the first disk (LUN 0 of the SCSI device, or the first blk
        # device), 64 MiB, grown and shrunk back
        resize-grow|resize-shrink)
            if [ -n "$resize_img" ]; then
                local args=(resize --no-progress --size 96M "$resize_img")
                [ "$1" = resize-grow ] || args=(resize --no-progress --size 64M --allow-shrink "$resize_img")
                echo "== $(date +%T) rbd ${args[*]}" >> "$work/host-actions.log"
                if rbd_cli "${args[@]}" >> "$work/host-actions.log" 2>&1; then
                    host_check "rbd/$1" PASS "rbd ${args[*]} in the cluster, no daemon command"
                else
                    host_check "rbd/$1" FAIL "rbd ${args[*]}: $(tail -n 1 "$work/host-actions.log")"
                fi
                return
            fi
            call=(lun_resize device=0 lun=0 size=96M)
            [ "$1" = resize-grow ] || call=(lun_resize device=0 lun=0 size=64M) ;;
        *) say "the guest asked for '$1'"; return ;;
    esac
    # the result (stdout) or the error object (stderr), on one line
    local out verdict=ok
    out=$("$bin" rpc --admin-socket "$work/admin.sock" "${call[@]}" 2>&1) || verdict=error
    out=$(echo "$out" | tr -s ' \n' ' ')
    echo "== $(date +%T) rpc ${call[*]} -> $verdict $out" >> "$work/host-actions.log"
    [ "$verdict" = ok ] || say "rpc '${call[*]}' failed: $out"
}
# figures RUN MARK: "kicks completions" summed over the request queues in
# the daemon's statistics at the snapshot of the guest's line MARK
figures() {
    awk -F '\t' -v m="$2" '$1 ~ "^" m { print $2; exit }' "$work/$1.snapshots" |
        python3 -c 'import json, sys
try:
    q = [e for e in json.load(sys.stdin)["queues"] if e["vq"] >= int(sys.argv[1])]
    print(sum(e["kicks"] for e in q), sum(e["completions"] for e in q),
          " ".join("%s/%s" % (e["sq_need_wakeup"], e["cq_need_wakeup"]) for e in q if e["running"]))
except Exception:
    print("? ? ?")' "$first_req_vq"
}
# the first request queue's index: virtio-scsi's control and event queues
# come first, virtio-blk has request queues only
first_req_vq=2; [ "$blk" = 1 ] && first_req_vq=0
# Host checks of a run: both pollers asleep at the guest's idle snapshot;
# per-I/O figures of the measuring run.
sqcq_host_checks() {
    local run="$1" f
    if [ "$expect_sqcq" = on ] && grep -q "^SQCQ-SNAPSHOT idle" "$work/$run.console.log"; then
        read -r _ _ f < <(figures "$run" "SQCQ-SNAPSHOT idle")
        if [ -n "$f" ] && [ "$(echo "$f" | tr ' ' '\n' | sort -u)" = "True/True" ]; then
            host_check "$run/idle_need_wakeup" PASS "NEED_WAKEUP set in every SQ and CQ doorbell while idle (sq/cq: $f)"
        else
            host_check "$run/idle_need_wakeup" FAIL "doorbell NEED_WAKEUP (sq/cq per request queue) while idle: ${f:-no snapshot}"
        fi
    fi
    if grep -q "^SQCQ-HOST queue-break" "$work/$run.console.log"; then
        local reply vring
        reply=$(grep "^== .* rpc fault_break " "$work/host-actions.log" | tail -n 1 | sed 's/.* -> //')
        vring=$(grep -c "vhost vring error in virtqueue" "$work/$run.qemu.log" || true)
        if [[ "$reply" == ok*'"armed"'* ]] && [ "$vring" -gt 0 ]; then
            host_check "$run/queue_break" PASS "daemon: '$reply'; QEMU reported $vring vring error(s) (DEVICE_NEEDS_RESET)"
        elif [[ "$reply" == *'no method'*fault_break* ]]; then
            host_check "$run/queue_break" FAIL "sqcqd was built without fault injection" \
                "(cargo build -p sqcq-target --features fault-injection): '$reply'"
        else
            host_check "$run/queue_break" FAIL "daemon: '${reply:-no reply}'; QEMU vring errors: $vring"
        fi
    fi
    if [ "$bp" = 1 ]; then
        local t
        # the request queues: from vq 2 on virtio-scsi, every vq on blk
        t=$(python3 -c 'import json, sys
q = [e for e in json.load(open(sys.argv[1]))["queues"] if e["vq"] >= int(sys.argv[2])]
print(sum(e["limited"] for e in q), sum(e["throttled"] for e in q))' "$work/stats.json" "$([ "$blk" = 1 ] && echo 0 || echo 2)" 2>/dev/null || true)
        if [ -n "$t" ] && [ "${t#* }" -gt 0 ]; then
            host_check "$run/bp_throttled" PASS "daemon: request queues at their limit $t times (limited, THROTTLE set)"
        else
            host_check "$run/bp_throttled" FAIL "the daemon never set THROTTLE (limited, throttled: ${t:-no statistics})"
        fi
    fi
    [ "$measure" = 1 ] || return 0
    local qd k0 c0 k1 c1 line ios irqs ticks
    for qd in 1 32; do
        read -r k0 c0 _ < <(figures "$run" "MEASURE-BEGIN qd$qd")
        read -r k1 c1 _ < <(figures "$run" "MEASURE-END qd$qd ")
        # awk reads the whole log itself: a `grep -m1` after a pipe
        # would end the writer with SIGPIPE (141), fatal under pipefail
        line=$(awk -v p="MEASURE-END qd$qd ios=" '{ gsub(/\r/, "") } index($0, p) == 1 { print; exit }' \
            "$work/$run.console.log")
        ios=$(echo "$line" | sed -n 's/.* ios=\([0-9]*\).*/\1/p')
        irqs=$(echo "$line" | sed -n 's/.* irqs=\([0-9]*\).*/\1/p')
        ticks=$(echo "$line" | sed -n 's/.* ticks=\([0-9]*\).*/\1/p')
        if [ -z "$ios" ] || [ "$k0" = "?" ] || [ "$k1" = "?" ] || [ -z "$k0" ] || [ -z "$k1" ]; then
            host_check "$run/measure_qd$qd" FAIL "no figures (guest: '$line')"
            continue
        fi
        # kicks per request the device completed (both from its own
        # counters); interrupts and CPU per I/O fio completed in the guest.
        # Measured, not asserted: how many a poller saves depends on how
        # soon each side's poller gets a CPU (the figures of a loaded and
        # an idle machine: docs/guest-tests.md, `measure`). That the
        # feature is in use is asserted by lifecycle/queue_mode and
        # runN/idle_need_wakeup.
        m=$(python3 -c "print('ios=%d device_requests=%d kicks_per_io=%.3f irqs_per_io=%.3f guest_cpu_us_per_io=%.0f' % ($ios, $c1 - $c0, ($k1 - $k0) / max($c1 - $c0, 1), $irqs / $ios, $ticks * 10000 / $ios))")
        host_check "$run/measure_qd$qd" PASS "$m"
        echo "${label:-$queue_mode${packed_label:-}} qd$qd $m" >> "$repo/target/guest/measure.txt"
    done
}

# ------------------------------------------------------------------ runs
say "daemon: $daemon_cmd"
say "guest: $kernel + $initrd ($(du -h "$initrd" | cut -f1)), built/cached in ${t_build} s"
nonce1=$(od -An -tx4 -N4 /dev/urandom | tr -d ' ')
nonce2=$(od -An -tx4 -N4 /dev/urandom | tr -d ' ')
if start_daemon; then
    qemu_run run1 "$bios" full "$nonce1" "" 1
    sets1="${P}full"
    [ "$expect_sqcq" = on ] && sets1="$sets1 sqcq ${P}sqcqfull"
    [ "$measure" = 1 ] && sets1="$sets1 measure"
    [ "$bp" = 1 ] && sets1="$sets1 backpressure"
    collect run1 "$work/run1.console.log" "$sets1"
    sqcq_host_checks run1
    prev=""
    grep -q "^run1/qemu PASS" "$results" && grep -q "^run1/disk0/marker PASS" "$results" && prev="$nonce1"
    if [ "$only_run1" = 0 ]; then
        # lifecycle: does the daemon keep serving after QEMU went away?
        for _ in $(seq 10); do daemon_alive || break; sleep 0.2; done
        if daemon_alive && [ -S "$sock" ]; then
            host_check lifecycle/daemon_survives_qemu PASS "still serving after run1's QEMU exited"
        else
            st=$(daemon_alive && echo running || daemon_status)
            if [ "$one_conn" = 1 ]; then
                host_check lifecycle/daemon_survives_qemu SKIP "the daemon serves one connection per process" \
                    "(exited with status $st when run1's QEMU disconnected); run2 uses a fresh daemon"
            else
                host_check lifecycle/daemon_survives_qemu FAIL "the daemon is gone (status $st, socket" \
                    "$([ -S "$sock" ] && echo present || echo missing)) after run1's QEMU exited"
            fi
            daemon_pid=""
            [ "$file_backed" = 1 ] || prev=""
            start_daemon || host_check lifecycle/daemon_restart FAIL "the daemon did not start again"
        fi
        if daemon_alive; then
            q=${P}quick; [ "$expect_sqcq" = on ] && q="$q sqcq"
            if [ "$no_reset" = 1 ]; then
                qemu_run run2 "$bios2" quick "$nonce2" "$prev" 1
                b1="$q"; [ -n "$prev" ] && b1="$q ${P}prev"
                collect run2 "$work/run2.console.log" "$b1"
                host_check lifecycle/guest_reboot SKIP "$no_reset_why"
            else
                qemu_run run2 "$bios2" reboot "$nonce2" "$prev" 2
                b1="$q"; [ -n "$prev" ] && b1="$q ${P}prev"
                collect run2 "$work/run2.console.log" "$b1" "$q ${P}boot2"
                if grep -q "^run2/qemu PASS" "$results" && ! grep -q "^run2.boot2/.* FAIL" "$results"; then
                    host_check lifecycle/guest_reboot PASS "guest rebooted ($bios2) on the same connection, checks pass again"
                else
                    host_check lifecycle/guest_reboot FAIL "see run2.boot2 and run2/qemu"
                fi
            fi
        fi
    fi
    # SeaBIOS drives the disk and resets the device before Linux starts
    sea=""
    [ "$bios" = seabios ] && sea="run1"
    [ "$bios2" = seabios ] && [ -s "$work/run2.console.log" ] && sea="${sea:+$sea }run2"
    if [ -n "$sea" ]; then
        bad=""
        for r in $sea; do
            grep -Eq "^$r(\.boot1)?/disks PASS" "$results" || bad="$bad $r"
        done
        if [ -z "$bad" ]; then host_check lifecycle/seabios PASS "Linux found the disks after SeaBIOS used and reset the device ($sea)"
        else host_check lifecycle/seabios FAIL "no disks after SeaBIOS ($bad)"; fi
    elif [ "$no_reset" = 1 ]; then
        host_check lifecycle/seabios SKIP "$no_reset_why"
    fi
    if [ -n "${bin:-}" ] && [ "$daemon" = sqcqd ] && [[ "$daemon_cmd" == *"{dir}/stats.json"* ]]; then
        # How the daemon served every request queue when the guest does
        # not negotiate bit 42 (stock Linux, or the daemon withholds it):
        # classic kicks and calls with --poll kick, ring-poll with --poll
        # ring or auto (the default); the doorbells with the patched
        # guest.
        st="$work/stats.json"
        modes=$({ grep -o '"mode": *"[a-z-]*"' "$st" 2>/dev/null || true; } | sed 's/.*"\([a-z-]*\)"$/\1/' | sort -u | tr '\n' ' ')
        what="kicks and calls (bit 42 not negotiated)"
        [ "$queue_mode" = sqcq ] && what="SQ/CQ doorbells (bit 42 negotiated)"
        [ "$queue_mode" = ring-poll ] && what="ring polling (bit 42 not negotiated)"
        if [ -z "$modes" ]; then
            host_check lifecycle/queue_mode FAIL "sqcqd wrote no per-queue statistics to $st"
        elif [ "$modes" = "$queue_mode " ]; then
            host_check lifecycle/queue_mode PASS "every request queue was served by $what"
        else
            host_check lifecycle/queue_mode FAIL "queues ran in modes: $modes, expected $queue_mode"
        fi
    fi
else
    host_check daemon/start FAIL "the daemon did not start: $(tail -n 1 "$work/daemon.log")"
fi

# ---------------------------------------------------------------- report
echo
print_results "$results" 36
if [ "$nfail" -gt 0 ]; then
    for f in "$work"/run*.console.log; do
        [ -e "$f" ] || continue
        echo; echo "---- tail of $(basename "$f") ----"
        tr -d '\r' < "$f" | tail -n 60
    done
    for f in "$work"/run*.qemu.log; do
        [ -s "$f" ] || continue
        echo; echo "---- $(basename "$f") ----"; tail -n 20 "$f"
    done
    echo; echo "---- tail of daemon.log ----"; tail -n 30 "$work/daemon.log"
    keep=1
fi
echo
say "daemon $daemon, total $(( $(date +%s) - t0 )) s"
echo "guest: $npass passed, $nfail failed, $nskip skipped"
[ "$nfail" -eq 0 ]
