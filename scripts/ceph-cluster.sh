#!/usr/bin/env bash
# A real single-host Ceph cluster from Debian's packages, for the RBD
# backstore's tests: one monitor, one manager, one OSD (BlueStore on a
# sparse file, so that a killed OSD comes back with its data), cephx on,
# every daemon on 127.0.0.1 only, pool size 1; a pool `sqcq` with the rbd
# application, and a client `client.sqcq` with the rbd profile's caps.
#
# Usage: scripts/ceph-cluster.sh start|stop|status|env|kill-osd|pause-mon|resume-mon
#
#   start   installs the packages if missing (as root), creates the cluster
#           on first use, starts whichever daemon is not running (a running
#           cluster is reused; one stopped with its data, say after a reboot,
#           comes back with that data), waits for HEALTH_OK, prints `env`.
#   stop    kills the daemons and removes the work directory: everything.
#   status  `ceph -s`, exit status 0 when the cluster answers.
#   env     what clients need, as KEY=VALUE lines: CEPH_CONF (librados
#           and the ceph tools read it), SQCQ_CEPH_POOL, SQCQ_CEPH_ID,
#           SQCQ_CEPH_KEYRING.
#   kill-osd  kills the OSD with SIGKILL, for failure tests (`start`
#           brings it back with its data).
#   pause-mon  stops the monitor with SIGSTOP: it keeps its sockets but
#           answers nothing, as a hung or cut-off monitor (failure tests).
#   resume-mon  lets it go on (SIGCONT); `start` does too.
#
# Environment: SQCQ_CEPH_DIR (work directory, default /var/tmp/sqcq-ceph),
# SQCQ_CEPH_PORT (the monitor's msgr2 port, default 13300; the OSD and the
# manager take free ports from 13400-13499), SQCQ_CEPH_OSD_SIZE (the sparse
# BlueStore file, default 10G), SQCQ_CEPH_STORE=memstore for the in-memory
# store instead (faster to start, but a restarted OSD comes back empty and
# its memory grows with the data written).
#
# Measured on the project's machine (2 cores, Debian 12, Ceph 16.2.15):
# see docs/rbd.md, "The test cluster".
set -euo pipefail
cd "$(dirname "$0")/.."

dir="${SQCQ_CEPH_DIR:-/var/tmp/sqcq-ceph}"
port="${SQCQ_CEPH_PORT:-13300}"
osd_size="${SQCQ_CEPH_OSD_SIZE:-10G}"
store="${SQCQ_CEPH_STORE:-bluestore}"
conf="$dir/ceph.conf"
pool=sqcq

say() { echo "ceph-cluster: $*" >&2; }

# ceph CLI as the administrator, never waiting long for an answer.
admin() { timeout 60 ceph --conf "$conf" --name client.admin --connect-timeout 15 "$@"; }

# pid_alive NAME: the daemon NAME (mon.a, mgr.x, osd.0) runs.
pid_alive() {
    local pidfile="$dir/run/$1.pid"
    [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

write_conf() {
    local fsid="$1"
    mkdir -p "$dir/run" "$dir/log"
    cat >"$conf" <<EOF
# Written by scripts/ceph-cluster.sh: a single-host test cluster.
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$port
public network = 127.0.0.1/32
ms bind msgr1 = false
ms bind msgr2 = true
ms bind port min = 13400
ms bind port max = 13499
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
run dir = $dir/run
pid file = $dir/run/\$name.pid
admin socket = $dir/run/\$name.\$pid.asok
log file = $dir/log/\$name.log
crash dir = $dir/crash
osd pool default size = 1
osd pool default min size = 1
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 2
mon data avail crit = 1

[mon]
mon data = $dir/\$name
mon allow pool delete = true

[mgr]
mgr data = $dir/\$name
keyring = $dir/\$cluster.\$name.keyring

[osd]
osd data = $dir/\$name
keyring = $dir/\$cluster.\$name.keyring
osd objectstore = $store
bluestore block create = true
bluestore block size = $(numfmt --from=iec "$osd_size")
bluestore cache autotune = false
bluestore cache size = 128M
osd memory target = 939524096

[client]
keyring = $dir/\$cluster.\$name.keyring
# Bounded waits: without these librados waits forever for a dead OSD
# (rados_osd_op_timeout 0) and 300 s for the monitors at connect.
rados osd op timeout = 30
rados mon op timeout = 30
client mount timeout = 30
log file = $dir/log/\$name.\$pid.log
admin socket =
EOF
}

create() {
    say "creating a cluster in $dir ($store)"
    rm -rf "$dir"
    mkdir -p "$dir"
    write_conf "$(uuidgen)"
    local fsid
    fsid="$(awk '$1 == "fsid" {print $3}' "$conf")"
    ceph-authtool --create-keyring "$dir/ceph.mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
    ceph-authtool --create-keyring "$dir/ceph.client.admin.keyring" --gen-key -n client.admin \
        --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
    ceph-authtool "$dir/ceph.mon.keyring" --import-keyring "$dir/ceph.client.admin.keyring" >/dev/null
    monmaptool --create --addv a "[v2:127.0.0.1:$port]" --fsid "$fsid" "$dir/monmap" >/dev/null
    ceph-mon --conf "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/ceph.mon.keyring"
    ceph-mon --conf "$conf" -i a 2>>"$dir/log/start.log"
    # The manager (the cluster reports HEALTH_WARN without one).
    mkdir -p "$dir/mgr.x"
    admin auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
        -o "$dir/ceph.mgr.x.keyring" >/dev/null
    ceph-mgr --conf "$conf" -i x 2>>"$dir/log/start.log"
    # The OSD: registered with a fresh secret, then its store made.
    local uuid secret id
    uuid="$(uuidgen)"
    secret="$(ceph-authtool --gen-print-key)"
    id="$(echo "{\"cephx_secret\": \"$secret\"}" | admin osd new "$uuid" -i -)"
    [ "$id" = 0 ] || { say "unexpected OSD id $id"; exit 1; }
    mkdir -p "$dir/osd.0"
    ceph-authtool --create-keyring "$dir/ceph.osd.0.keyring" --name osd.0 --add-key "$secret" >/dev/null
    ceph-osd --conf "$conf" -i 0 --mkfs --osd-uuid "$uuid" 2>>"$dir/log/osd.0.mkfs.log"
    ceph-osd --conf "$conf" -i 0 2>>"$dir/log/start.log"
    admin osd pool create "$pool" 32 >/dev/null 2>&1
    admin osd pool application enable "$pool" rbd >/dev/null 2>&1
    admin auth get-or-create client.sqcq mon 'profile rbd' osd "profile rbd pool=$pool" \
        -o "$dir/ceph.client.sqcq.keyring" >/dev/null
    touch "$dir/created"
}

# Starts whichever daemon of an existing cluster is not running, and lets
# a paused monitor go on.
restart_daemons() {
    resume_mon
    pid_alive mon.a || ceph-mon --conf "$conf" -i a 2>>"$dir/log/start.log"
    pid_alive mgr.x || ceph-mgr --conf "$conf" -i x 2>>"$dir/log/start.log"
    pid_alive osd.0 || ceph-osd --conf "$conf" -i 0 2>>"$dir/log/start.log"
}

resume_mon() {
    if pid_alive mon.a; then kill -CONT "$(cat "$dir/run/mon.a.pid")"; fi
}

wait_healthy() {
    local health="" deadline=$((SECONDS + 60))
    while [ "$SECONDS" -lt "$deadline" ]; do
        health="$(admin health 2>/dev/null || true)"
        # HEALTH_OK and every placement group active (after an OSD
        # restart the health can be OK while they still peer).
        case "$health" in
        HEALTH_OK*)
            admin pg stat 2>/dev/null | grep -Eq '^([0-9]+) pgs: \1 active\+clean' && return 0
            ;;
        esac
        sleep 0.2
    done
    say "not healthy after 60 s: ${health:-no answer} (logs in $dir/log)"
    admin -s >&2 || true
    return 1
}

print_env() {
    echo "CEPH_CONF=$conf"
    echo "SQCQ_CEPH_POOL=$pool"
    echo "SQCQ_CEPH_ID=sqcq"
    echo "SQCQ_CEPH_KEYRING=$dir/ceph.client.sqcq.keyring"
}

stop() {
    local name pid
    resume_mon
    for name in osd.0 mgr.x mon.a; do
        if pid_alive "$name"; then
            pid="$(cat "$dir/run/$name.pid")"
            kill "$pid"
            for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        fi
    done
    rm -rf "$dir"
}

case "${1:-}" in
start)
    # shellcheck source=scripts/lib/packages.sh
    source scripts/lib/packages.sh
    ensure_packages ceph-cluster ceph-mon ceph-mgr ceph-osd ceph-common librbd-dev
    if [ -e "$dir/created" ]; then
        restart_daemons
    else
        create
    fi
    wait_healthy
    print_env
    ;;
stop) stop ;;
status)
    [ -e "$conf" ] || { say "no cluster in $dir"; exit 1; }
    admin -s
    ;;
kill-osd)
    pid_alive osd.0 || { say "the OSD is not running"; exit 1; }
    pid="$(cat "$dir/run/osd.0.pid")"
    kill -9 "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    ;;
pause-mon)
    pid_alive mon.a || { say "the monitor is not running"; exit 1; }
    kill -STOP "$(cat "$dir/run/mon.a.pid")"
    ;;
resume-mon) resume_mon ;;
env)
    [ -e "$dir/created" ] || { say "no cluster in $dir (scripts/ceph-cluster.sh start)"; exit 1; }
    print_env
    ;;
*)
    echo "usage: $0 start|stop|status|env|kill-osd|pause-mon|resume-mon" >&2
    exit 2
    ;;
esac
