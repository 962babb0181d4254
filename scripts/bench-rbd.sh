#!/usr/bin/env bash
# sqcqd next to qemu-storage-daemon on one Ceph RBD image (issue 27,
# item 7): both exported as vhost-user-blk, driven by the same sqcq-bench,
# 4 KiB random reads and writes at QD1 and QD32, in the same notification
# mode (notify, which qemu-storage-daemon serves as sqcqd does; and
# ring-poll, which on sqcqd adds its --poll ring worker while
# qemu-storage-daemon, which has no device-side ring polling, serves it
# kick-driven), interleaved repeats, medians; see docs/rbd.md,
# "Performance next to qemu-storage-daemon".
#
# Usage: scripts/bench-rbd.sh [sqcq-compare options]: an option given
# replaces the default below (--runtime 2 --repeat 1 for a quick look).
#
# It starts (or reuses) the test cluster (scripts/ceph-cluster.sh), installs
# Debian's qemu-block-extra (QEMU's rbd driver for qemu-storage-daemon) when
# missing, checks that the driver loads, creates the image once and writes it
# whole (so that reads find data on the OSD, not holes), builds the release
# binaries, and runs sqcq-compare with the targets on CPU $TARGET_CPU (0)
# and the driver on $DRIVER_CPU (1), as scripts/vs-spdk.sh pins them, and
# the OSD's CPU time per I/O measured beside the daemons'.
#
# Environment: SQCQ_RBD_BENCH_IMAGE (default sqcq-bench-rbd), its size
# SQCQ_RBD_BENCH_SIZE (default 1G), TARGET_CPU, DRIVER_CPU, OUT (default
# target/compare-rbd).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/packages.sh
source scripts/lib/packages.sh

image=${SQCQ_RBD_BENCH_IMAGE:-sqcq-bench-rbd}
size=${SQCQ_RBD_BENCH_SIZE:-1G}
tcpu=${TARGET_CPU:-0} dcpu=${DRIVER_CPU:-1}
out=${OUT:-target/compare-rbd}

ensure_packages bench-rbd qemu-block-extra
eval "$(scripts/ceph-cluster.sh start | grep -E '^[A-Z_]+=')"
export CEPH_CONF SQCQ_CEPH_POOL SQCQ_CEPH_ID SQCQ_CEPH_KEYRING
rbd=(rbd --conf "$CEPH_CONF" --id "$SQCQ_CEPH_ID" --keyring "$SQCQ_CEPH_KEYRING")

# qemu-storage-daemon's rbd driver is a module (block-rbd.so): asked for an
# image that does not exist, a loaded driver says so; a missing one says
# "Unknown driver".
probe=$(qemu-storage-daemon --blockdev "driver=rbd,node-name=probe,pool=$SQCQ_CEPH_POOL,image=sqcq-no-such-image,conf=$CEPH_CONF,user=$SQCQ_CEPH_ID" 2>&1 || true)
case "$probe" in
    *"No such file"*) ;;
    *) echo "bench-rbd: qemu-storage-daemon's rbd driver does not load: $probe" >&2; exit 1 ;;
esac
echo "bench-rbd: $(qemu-storage-daemon --version | head -1), rbd driver loads"

# Written whole once; the image's metadata remembers it.
if ! "${rbd[@]}" info "$SQCQ_CEPH_POOL/$image" >/dev/null 2>&1; then
    "${rbd[@]}" create --size "$size" "$SQCQ_CEPH_POOL/$image"
fi
if [ "$("${rbd[@]}" image-meta get "$SQCQ_CEPH_POOL/$image" sqcq.written 2>/dev/null)" != yes ]; then
    echo "bench-rbd: writing $SQCQ_CEPH_POOL/$image whole ($size)"
    "${rbd[@]}" bench --io-type write --io-pattern seq --io-size 4M --io-threads 4 \
        --io-total "$size" "$SQCQ_CEPH_POOL/$image" >/dev/null
    "${rbd[@]}" image-meta set "$SQCQ_CEPH_POOL/$image" sqcq.written yes
fi

CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build --quiet --release -p sqcq-target -p sqcq-bench -p sqcq-compare
osd=$(pgrep -o -f "ceph-osd --conf $CEPH_CONF" || true)
watch=()
[ -z "$osd" ] || watch=(--watch "ceph-osd=$osd")
# The defaults, each unless the command line gives that option.
opts=()
default() {
    local given
    for given in "${args[@]}"; do
        case "$given" in "$1" | "$1"=*) return ;; esac
    done
    opts+=("$@")
}
args=("$@")
default --devices blk
default --targets sqcqd,qemu-storage-daemon
default --modes notify,ring-poll
default --rw randread,randwrite
default --qd 1,32
default --jobs 1
default --runtime 5
default --ramp 1
default --repeat 3
default --rbd "pool=$SQCQ_CEPH_POOL,image=$image,conf=$CEPH_CONF,id=$SQCQ_CEPH_ID"
default --target-cpus "$tcpu"
default --out "$out"
mkdir -p "$out"
{
    echo "bench-rbd: $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg), targets on CPU $tcpu, driver on CPU $dcpu; $(git log -1 --format='%h %s' 2>/dev/null | cut -c1-80)"
    echo "busiest processes: $(ps -eo pcpu=,comm= --sort=-pcpu | head -5 | awk '{printf "%s %s%%, ", $2, $1}')"
} | tee "$out/report.txt"
taskset -c "$dcpu" target/release/sqcq-compare "${opts[@]}" "${watch[@]}" "$@" | tee -a "$out/report.txt"
