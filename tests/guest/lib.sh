# shellcheck shell=bash disable=SC2034 # sets globals for its callers
# Shared by the guest runs (tests/guest/run.sh, tests/guest/live.sh,
# scripts/libvirt-test.sh); sourced from the repository root, which they
# cd to first.

# Where a failed run leaves its logs (absolute: the runs cd elsewhere).
failed_logs_root="$PWD/target/guest/failed"

# keep_logs RC WORK: called first thing at exit; when the run failed (RC
# is not 0) copies every file of the scratch directory WORK below 16 MiB
# (guest consoles, daemon and QEMU logs, results; not the disk images) to
# target/guest/failed/<WORK's name>/, so that a failure leaves its logs
# where CI collects them even when the scratch directory goes.
keep_logs() {
    local rc="$1" work="$2" dest
    [ "$rc" != 0 ] && [ -d "$work" ] || return 0
    dest="$failed_logs_root/$(basename "$work")"
    mkdir -p "$dest"
    (cd "$work" && find . -type f -size -16M -print0 | xargs -0 -r cp --parents -t "$dest") || true
    echo "the run failed (status $rc): its logs are in $dest" >&2
}

# kill_group PID: TERM the process group PID leads (or PID), wait up to
# 5 s until every process of the group is gone, then KILL the group. (The
# group, not PID alone: a daemon started with `setsid sh -c CMD` runs
# under that shell, which dies at once; a daemon KILLed while it stops
# leaves an RBD image locked and watched for 30 s.)
kill_group() {
    local p="$1"
    [ -n "$p" ] || return 0
    kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true
    for _ in $(seq 25); do
        kill -0 -- "-$p" 2>/dev/null || kill -0 "$p" 2>/dev/null || break
        sleep 0.2
    done
    kill -KILL -- "-$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
}

# build_guest [MODULES_DIR]: the suite's kernel and initramfs (built once,
# cached under target/guest), in $kernel and $initrd; both empty if the
# build failed.
build_guest() {
    kernel="" initrd=""
    local k v
    # shellcheck disable=SC2086 # no argument without modules
    while read -r k v; do
        case "$k" in kernel) kernel="$v" ;; initrd) initrd="$v" ;; esac
    done < <(timeout 600 tests/guest/build-initramfs.sh "$PWD/target/guest" ${1:-})
}

# print_results FILE WIDTH: the "name STATUS reason" lines of FILE as a
# table whose name column is WIDTH wide; sets npass, nfail and nskip.
print_results() {
    awk -v w="$2" '{ printf "  %-4s %-*s %s\n", $2, w, $1, substr($0, length($1) + length($2) + 3) }' "$1"
    npass=$(awk '$2 == "PASS"' "$1" | wc -l)
    nfail=$(awk '$2 == "FAIL"' "$1" | wc -l)
    nskip=$(awk '$2 == "SKIP"' "$1" | wc -l)
}

# ------------------------------------------------ Ceph RBD disks (--rbd)
# The disks of an --rbd run are images of the Ceph test cluster
# (scripts/ceph-cluster.sh, docs/rbd.md), made for the run and removed at
# its end, whatever the end.

# rbd_cli ARGS...: the rbd tool as the cluster's test user, never waiting
# long for an answer.
rbd_cli() {
    timeout 60 rbd --conf "$CEPH_CONF" --id "$SQCQ_CEPH_ID" --keyring "$SQCQ_CEPH_KEYRING" "$@"
}

# rbd_setup: the cluster's client settings in CEPH_CONF, SQCQ_CEPH_POOL,
# SQCQ_CEPH_ID and SQCQ_CEPH_KEYRING: from the environment (scripts/test.sh
# exports them), else from `scripts/ceph-cluster.sh start`, which starts
# the cluster (installing Ceph's packages if needed) or reuses a running
# one. Returns 1, the reason in rbd_why, when there is no cluster that
# answers. Sets rbd_prefix, the names of this run's images, and removes
# the images earlier runs left when they were killed (their harness's pid
# is in the name and gone).
rbd_setup() {
    local env k v img pid
    rbd_why="" rbd_images=()
    if [ -z "${CEPH_CONF:-}" ] || [ -z "${SQCQ_CEPH_POOL:-}" ] || [ -z "${SQCQ_CEPH_ID:-}" ] ||
       [ -z "${SQCQ_CEPH_KEYRING:-}" ]; then
        if ! env="$(scripts/ceph-cluster.sh start 2>&1)"; then
            rbd_why="no Ceph cluster: scripts/ceph-cluster.sh start failed: $(echo "$env" | tail -n 1)"
            return 1
        fi
        while IFS='=' read -r k v; do export "$k=$v"; done < <(echo "$env" | grep -E '^(CEPH_CONF|SQCQ_CEPH_[A-Z]+)=')
    fi
    if ! img="$(rbd_cli ls "$SQCQ_CEPH_POOL" 2>&1)"; then
        rbd_why="the Ceph cluster of $CEPH_CONF does not answer (rbd ls $SQCQ_CEPH_POOL): $(echo "$img" | tail -n 1)"
        return 1
    fi
    for img in $img; do
        pid=$(echo "$img" | sed -n 's/^sqcq-guest-\([0-9]*\)-.*/\1/p')
        [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null || continue
        rbd_cli rm --no-progress "$SQCQ_CEPH_POOL/$img" > /dev/null 2>&1 || true
    done
    rbd_prefix="sqcq-guest-$$-$(od -An -tx2 -N2 /dev/urandom | tr -d ' ')"
}

# rbd_create NAME SIZE: a fresh image $rbd_prefix-NAME of SIZE (rbd's
# units: 64M), removed by rbd_remove_all.
rbd_create() {
    rbd_images+=("$SQCQ_CEPH_POOL/$rbd_prefix-$1")
    rbd_cli create --size "$2" "$SQCQ_CEPH_POOL/$rbd_prefix-$1"
}

# rbd_lun NAME: the --lun options of image $rbd_prefix-NAME
rbd_lun() {
    echo "kind=rbd,pool=$SQCQ_CEPH_POOL,image=$rbd_prefix-$1,conf=$CEPH_CONF,id=$SQCQ_CEPH_ID,keyring=$SQCQ_CEPH_KEYRING"
}

# rbd_remove_all: removes this run's images, once their daemons are gone.
# A daemon killed with -9 leaves its watch on the image until the OSD
# drops it (30 s), and `rbd rm` refuses an image that has watchers: such
# an image is tried again for up to 45 s.
rbd_remove_all() {
    local img out t
    for img in "${rbd_images[@]}"; do
        t=$SECONDS
        until out="$(rbd_cli rm --no-progress "$img" 2>&1)"; do
            case "$out" in
            *"No such file"*|*"does not exist"*) break ;;
            *watchers*)
                [ $((SECONDS - t)) -gt 0 ] || echo "rbd rm $img: it still has watchers, trying again for 45 s" >&2
                [ $((SECONDS - t)) -lt 45 ] || { echo "rbd rm $img: $out" >&2; break; }
                sleep 2 ;;
            *) echo "rbd rm $img: $out" >&2; break ;;
            esac
        done
    done
    rbd_images=()
}

# ------------------------------------------------------------ slow disk
# blkio_setup NAME DIR: a blkio cgroup NAME (v1 blkio.throttle, or v2
# io.max) for I/O to the disk under DIR, in $cg, with $cg_kind (v1|v2) and
# $cg_disk (MAJ:MIN); a process joins it with `echo PID > $cg/cgroup.procs`.
# Fails (and leaves $cg empty) without a block device under DIR (tmpfs)
# or a controller; the caller removes $cg (rmdir) when done.
blkio_setup() {
    local mm
    cg=""
    mm=$(findmnt -no MAJ:MIN -T "$2" 2>/dev/null | tr -d ' ')
    [ -n "$mm" ] && [ -e "/sys/dev/block/$mm" ] || return 1
    # a partition: the limit goes on its disk
    [ ! -e "/sys/dev/block/$mm/partition" ] || mm=$(cat "/sys/dev/block/$mm/../dev")
    if [ -w /sys/fs/cgroup/blkio/blkio.throttle.write_iops_device ]; then
        cg=/sys/fs/cgroup/blkio/$1 cg_kind=v1
    elif grep -qw io /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
        cg=/sys/fs/cgroup/$1 cg_kind=v2
    else
        return 1
    fi
    mkdir "$cg" 2>/dev/null || { cg=""; return 1; }
    cg_disk=$mm
}
# blkio_limit N|off [writes]: the cgroup's writes, and reads unless
# "writes", limited to N a second; or no limit
blkio_limit() {
    local n r
    if [ "$cg_kind" = v1 ]; then
        n=0; [ "$1" = off ] || n=$1
        r=$n; [ "${2:-}" != writes ] || r=0
        echo "$cg_disk $r" > "$cg/blkio.throttle.read_iops_device"
        echo "$cg_disk $n" > "$cg/blkio.throttle.write_iops_device"
    else
        n=max; [ "$1" = off ] || n=$1
        r=$n; [ "${2:-}" != writes ] || r=max
        echo "$cg_disk riops=$r wiops=$n" > "$cg/io.max"
    fi
}
