#!/usr/bin/env bash
# The vhost-user-blk guest of the QEMU suite, started by libvirt: the domain
# of tests/guest/libvirt-domain.xml (two <disk type='vhostuser'>, memfd
# shared memory, direct kernel boot, TCG) against sqcqd serving two blk
# devices. The guest is the suite's (tests/guest/build-initramfs.sh) and
# runs its quick virtio-blk checks (sqcq_dev=blk sqcq_mode=quick).
# docs/guest-tests.md#libvirt-scriptslibvirt-testsh.
#
#   scripts/libvirt-test.sh [--keep]
#
# libvirt is a private one: a session libvirtd started here, with its
# configuration, sockets, logs and caches under a scratch directory, run as
# the user nobody when this runs as root (a session daemon runs QEMU as its
# own user, so nothing needs libvirt-daemon-system, a system libvirtd or
# the libvirt-qemu user; a running system libvirtd is left alone). sqcqd
# runs as the caller; its sockets are handed to that user (chown).
# Installs the Debian packages it needs when missing (as root, idempotent).
# Env: SQCQD (path of sqcqd), SQCQ_LIBVIRT_TIMEOUT_BOOT/_CHECKS/_SHUTDOWN
#      (seconds: 90/120/30), SQCQ_GUEST_APPEND (as for guest-test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
source scripts/lib/packages.sh
source tests/guest/lib.sh

keep=0
case "${1:-}" in
    --keep) keep=1 ;;
    "") ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "libvirt-test: unknown option $1" >&2; exit 2 ;;
esac
say() { echo "libvirt-test: $*"; }
t0=$(date +%s)
t_boot="${SQCQ_LIBVIRT_TIMEOUT_BOOT:-90}"
t_checks="${SQCQ_LIBVIRT_TIMEOUT_CHECKS:-120}"
t_shutdown="${SQCQ_LIBVIRT_TIMEOUT_SHUTDOWN:-30}"

# ------------------------------------------------------------ packages
# the guest's (as guest-test.sh), libvirt's daemon, QEMU driver and virsh,
# and xmllint for virt-xml-validate
ensure_packages libvirt-test qemu-system-x86 qemu-system-data linux-image-amd64 \
    busybox-static sg3-utils fio e2fsprogs cpio kmod \
    libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libxml2-utils

bin="${SQCQD:-}"
# the newer of the two builds
# shellcheck disable=SC2012 # two fixed paths
[ -n "$bin" ] || bin="$(ls -t target/release/sqcqd target/debug/sqcqd 2>/dev/null | head -n 1 || true)"
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    say "SKIP: sqcqd is not built (cargo build -p sqcq-target), nothing to test"
    exit 0
fi

# ------------------------------------------------- scratch, lock, cleanup
mkdir -p target/guest
# one guest at a time on this machine (the lock of tests/guest/run.sh)
exec 9> target/guest/qemu.lock
if ! flock -w 900 9; then say "another guest test held target/guest/qemu.lock for 900 s"; exit 1; fi
work="$(mktemp -d /tmp/sqcq-libvirt.XXXXXX)"
chmod 0711 "$work"
lv="$work/libvirt"          # the session daemon's HOME and XDG directories
mkdir -p "$lv/home" "$lv/config/libvirt" "$lv/run" "$lv/cache" "$lv/data"
# the console goes to a file (libvirt's virtlogd is not started)
echo 'stdio_handler = "file"' > "$lv/config/libvirt/qemu.conf"
run_as=()
if [ "$(id -u)" = 0 ]; then
    run_as=(setpriv --reuid="$(id -u nobody)" --regid="$(id -g nobody)" --clear-groups)
    chown -R nobody: "$lv"
fi
as_user() {
    "${run_as[@]}" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$lv/home" \
        XDG_CONFIG_HOME="$lv/config" XDG_RUNTIME_DIR="$lv/run" \
        XDG_CACHE_HOME="$lv/cache" XDG_DATA_HOME="$lv/data" "$@"
}
virsh_() { as_user virsh -q -c qemu:///session "$@"; }
name="sqcq-libvirt-$$"
domlog="$lv/cache/libvirt/qemu/log/$name.log"
console="$lv/console.log"

daemon_pid="" libvirtd_pid="" qemu_pid=""
stop_pid() { # pid: TERM (its process group when it leads one), then KILL
    local p="$1"
    [ -n "$p" ] || return 0
    kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true
    for _ in $(seq 25); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
}
cleanup() {
    local rc=$?
    if [ -n "$libvirtd_pid" ]; then
        virsh_ destroy "$name" >/dev/null 2>&1 || true
        stop_pid "$libvirtd_pid"; libvirtd_pid=""
    fi
    # a QEMU the daemon did not stop (it runs in a session of its own)
    if [ -n "$qemu_pid" ] && grep -qs "guest=$name" "/proc/$qemu_pid/cmdline"; then
        stop_pid "$qemu_pid"
    fi
    qemu_pid=""
    stop_pid "$daemon_pid"; daemon_pid=""
    keep_logs "$rc" "$work"
    if [ "$keep" = 1 ]; then say "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM HUP

results="$work/results"   # "name STATUS reason" lines
: > "$results"
check() { echo "$1 $2 ${*:3}" >> "$results"; }

# ------------------------------------------------------------- the guest
build_guest
if [ -z "$kernel" ] || [ -z "$initrd" ]; then say "building the guest failed"; exit 1; fi
# QEMU runs as the session's user: it must be able to read both
if ! as_user test -r "$initrd"; then
    cp "$initrd" "$work/initrd.cpio"; chmod 0644 "$work/initrd.cpio"; initrd="$work/initrd.cpio"
fi
as_user test -r "$kernel" || { say "$kernel is not readable by the session's user"; exit 1; }

# --------------------------------------------------------------- sqcqd
# two blk devices, as guest-test.sh --blk: vda read-write with 512-byte
# blocks, vdb read-only with 4096
source tests/guest/blk-toml.sh
blk_toml "$work" 2 > "$work/blk.toml"
start_daemon() {
    setsid "$bin" --config "$work/blk.toml" --admin-socket "$work/admin.sock" \
        > "$work/daemon.log" 2>&1 < /dev/null &
    daemon_pid=$!
    for _ in $(seq 100); do
        [ -S "$work/blk0.sock" ] && [ -S "$work/blk1.sock" ] && break
        kill -0 "$daemon_pid" 2>/dev/null || break
        sleep 0.1
    done
    [ -S "$work/blk0.sock" ] && [ -S "$work/blk1.sock" ] || return 1
    # QEMU connects as the session's user
    [ "${#run_as[@]}" -eq 0 ] || chown nobody: "$work/blk0.sock" "$work/blk1.sock"
}

# ------------------------------------------------------------ libvirtd
start_libvirtd() {
    setsid "${run_as[@]}" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$lv/home" \
        XDG_CONFIG_HOME="$lv/config" XDG_RUNTIME_DIR="$lv/run" \
        XDG_CACHE_HOME="$lv/cache" XDG_DATA_HOME="$lv/data" \
        libvirtd > "$work/libvirtd.log" 2>&1 < /dev/null &
    libvirtd_pid=$!
    for _ in $(seq 150); do
        [ -S "$lv/run/libvirt/libvirt-sock" ] && virsh_ version > "$work/versions" 2>&1 && return 0
        kill -0 "$libvirtd_pid" 2>/dev/null || break
        sleep 0.2
    done
    return 1
}

# ----------------------------------------------------------- the domain
nonce=$(od -An -tx4 -N4 /dev/urandom | tr -d ' ')
cmdline="console=ttyS0 panic=-1"
case "${SQCQ_GUEST_APPEND:-}" in
    *verbose*) cmdline="$cmdline loglevel=7 ${SQCQ_GUEST_APPEND/verbose/}" ;;
    *) cmdline="$cmdline quiet loglevel=3 ${SQCQ_GUEST_APPEND:-}" ;;
esac
cmdline="$cmdline sqcq_mode=quick sqcq_disks=2 sqcq_expect=off sqcq_dev=blk sqcq_mq=2"
cmdline="$cmdline sqcq_nonce=$nonce sqcq_timeout=60 sqcq_bs=512,4096"
xml="$(cat tests/guest/libvirt-domain.xml)"
xml="${xml//@NAME@/"$name"}"
xml="${xml//@KERNEL@/"$kernel"}"
xml="${xml//@INITRD@/"$initrd"}"
xml="${xml//@CMDLINE@/"$cmdline"}"
xml="${xml//@SOCKET0@/"$work/blk0.sock"}"
xml="${xml//@SOCKET1@/"$work/blk1.sock"}"
xml="${xml//@CONSOLE@/"$console"}"
echo "$xml" > "$work/domain.xml"
chmod 0644 "$work/domain.xml"

# expected: the guest's checks of a quick blk boot with two disks
expected() {
    awk '/^#/ || NF < 3 || $1 != "bquick" { next }
         $2 == "global" { print $3 }
         $2 == "disk0" || $2 == "disk1" { print $2 "/" $3 }' tests/guest/checks.list
}

# supervise: the guest's stages, each with a deadline, and the daemon
supervise() {
    local start now stage="" limit changed state last="" inits dones verdict=""
    start=$(date +%s); changed=$start
    while :; do
        sleep 0.5
        now=$(date +%s)
        inits=$(grep -c SQCQ-INIT "$console" 2>/dev/null || true)
        dones=$(grep -c SQCQ-DONE "$console" 2>/dev/null || true)
        state="$inits/$dones"
        [ "$state" != "$last" ] && { last="$state"; changed=$now; }
        if ! kill -0 "$libvirtd_pid" 2>/dev/null; then
            verdict="FAIL libvirtd died during stage ${stage:-boot}"; break
        fi
        if ! virsh_ list --name 2>/dev/null | grep -qxF "$name"; then
            if [ "$dones" -ge 1 ]; then verdict="PASS booted, checks done, powered off in $((now - start)) s"
            else verdict="FAIL the domain ended after $inits boot(s) without SQCQ-DONE"; fi
            break
        fi
        if [ "$inits" -gt 1 ]; then verdict="FAIL unexpected boot $inits (expected 1)"; break; fi
        if [ "$inits" -eq 0 ]; then stage=boot limit=$t_boot
        elif [ "$dones" -eq 0 ]; then stage=checks limit=$t_checks
        else stage=shutdown limit=$t_shutdown; fi
        if [ "$stage" != shutdown ] && ! kill -0 "$daemon_pid" 2>/dev/null; then
            verdict="FAIL sqcqd died during stage $stage"; break
        fi
        if [ $((now - changed)) -gt "$limit" ]; then verdict="FAIL stage $stage exceeded $limit s"; break; fi
    done
    say "domain: $verdict"
    # shellcheck disable=SC2086 # "STATUS reason..."
    check libvirt/domain $verdict
}

# ------------------------------------------------------------------ run
say "sqcqd: $bin; guest: $kernel + $initrd ($(du -h "$initrd" | cut -f1))"
if out=$(virt-xml-validate "$work/domain.xml" domain 2>&1); then
    check libvirt/xml_valid PASS "tests/guest/libvirt-domain.xml, filled in, validates against libvirt's domain schema"
else
    check libvirt/xml_valid FAIL "$(echo "$out" | tr '\n' ' ')"
fi
if ! start_daemon; then
    check daemon/start FAIL "sqcqd did not create its sockets: $(tail -n 1 "$work/daemon.log")"
elif ! start_libvirtd; then
    check libvirt/daemon FAIL "libvirtd (session) did not answer within 30 s:" \
        "$(tail -n 3 "$work/libvirtd.log" | tr '\n' ' ') $(tr '\n' ' ' < "$work/versions" 2>/dev/null)"
else
    check libvirt/daemon PASS "session libvirtd: $(grep -E 'Using library|Running hypervisor' "$work/versions" | tr -s ' ' | tr '\n' ';' | sed 's/;$//')"
    : > "$console"
    [ "${#run_as[@]}" -eq 0 ] || chown nobody: "$console"
    if out=$(virsh_ create "$work/domain.xml" 2>&1); then
        check libvirt/create PASS "virsh create: transient domain $name"
        qemu_pid=$(cat "$lv/run/libvirt/qemu/run/$name.pid" 2>/dev/null || true)
        say "domain $name started (QEMU pid ${qemu_pid:-unknown})"
        # what libvirt made of the XML: the devices and memory the daemon needs
        n_blk=$(grep -c '"driver":"vhost-user-blk-pci","num-queues":2' "$domlog" || true)
        if [ "$n_blk" = 2 ] && grep -q '"qom-type":"memory-backend-memfd".*"share":true' "$domlog"; then
            check libvirt/qemu_cmdline PASS "QEMU got 2 vhost-user-blk-pci (num-queues 2) and a shared memfd backend"
        else
            check libvirt/qemu_cmdline FAIL "$n_blk vhost-user-blk-pci with num-queues 2, or no shared memfd backend (see $domlog)"
        fi
        supervise
        tr -d '\r' < "$console" | sed -n 's/^CHECK //p' > "$work/got"
        while read -r ck; do
            line="$(awk -v n="$ck" '$1 == n { print; exit }' "$work/got")"
            if [ -n "$line" ]; then echo "guest/$line" >> "$results"
            else check "guest/$ck" FAIL "not reported (the guest stopped before it)"; fi
        done < <(expected)
        # anything reported but not expected is shown too
        awk '{ print $1 }' "$work/got" | while read -r ck; do
            grep -qxF "$ck" <<< "$(expected)" || grep "^$ck " "$work/got" | head -n 1 | sed 's|^|guest/|' >> "$results"
        done
    else
        check libvirt/create FAIL "virsh create: $(echo "$out" | tr '\n' ' ')"
    fi
fi

# ---------------------------------------------------------------- report
echo
print_results "$results" 28
if [ "$nfail" -gt 0 ]; then
    for f in "$console" "$domlog" "$work/libvirtd.log" "$work/daemon.log"; do
        [ -s "$f" ] || continue
        echo; echo "---- tail of $f ----"; tr -d '\r' < "$f" | tail -n 40
    done
    keep=1
fi
echo
say "total $(( $(date +%s) - t0 )) s"
echo "libvirt: $npass passed, $nfail failed, $nskip skipped"
[ "$nfail" -eq 0 ]
