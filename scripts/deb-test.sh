#!/usr/bin/env bash
# The Debian package's check (scripts/test.sh runs it after
# scripts/build-deb.sh): lintian; dpkg -i; every file where it belongs
# (man pages render, completions load, the conffile registered, the user
# and /run/sqcq made, no unit enabled); systemd-analyze verify of the
# installed units, with and without the metrics-tcp drop-in; the service
# run from its installed unit and configuration as systemd would run it
# (below), answering `sqcqd rpc daemon_info` on the default admin socket
# and a scrape of its metrics socket, reloaded by its ExecReload= and
# stopped by SIGTERM with exit 0; an edited conffile kept by a reinstall
# and by dpkg -r; dpkg -P removing it and leaving nothing of the units.
#
#   scripts/deb-test.sh [PACKAGE.deb]    (default: what build-deb.sh made)
#
# Needs root, and a machine without sqcq installed: it installs and purges
# the package. Whatever it made (the package, the user and group sqcq,
# the group libvirt-qemu that the unit asks for, /run/sqcq, /var/lib/sqcq)
# is removed on exit, pass or fail.
#
# When systemd is PID 1 the unit is started with systemctl. Otherwise (a
# container) the test does what systemd would with the installed unit:
# ExecStart= and ExecReload= as written, Type=notify (a notification
# socket, READY=1 awaited), User=, Group=, SupplementaryGroups=, UMask=,
# NoNewPrivileges=, the empty CapabilityBoundingSet= and
# AmbientCapabilities=, StateDirectory=, and in a mount and network
# namespace of its own ProtectSystem=strict (a read-only root with
# ReadWritePaths= and the state directory writable), PrivateTmp= and
# PrivateNetwork=. It names what it leaves to systemd, and fails on a
# directive it knows nothing of, so that a unit change is tested or
# consciously left out here.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/lib/packages.sh
source scripts/lib/packages.sh
# shellcheck source=scripts/lib/deb.sh
source scripts/lib/deb.sh

say() { echo "deb-test: $*"; }
fail() {
    echo "deb-test: FAILED: $*" >&2
    exit 1
}

[ "$(id -u)" = 0 ] || fail "needs root (it installs the package)"
deb=${1:-$(deb_path "$(deb_target_dir)")}
[ -f "$deb" ] || fail "no package $deb (scripts/build-deb.sh makes it)"
deb=$(realpath "$deb")
ensure_packages deb-test lintian man-db curl dpkg-dev util-linux

# A machine with sqcq on it is left alone.
if dpkg-query -W -f='${Status}' sqcq 2>/dev/null | grep -qv 'not-installed'; then
    fail "the package sqcq is installed here: this test installs and purges it"
fi
for path in /etc/sqcq /var/lib/sqcq /run/sqcq /etc/systemd/system/sqcqd.service.d; do
    [ ! -e "$path" ] ||
        fail "$path exists (sqcq installed by hand, or a daemon or test using it): this test makes and removes it, so it does not run here"
done

work=$(mktemp -d /run/sqcq-deb-test.XXXXXX)
chmod 0755 "$work"
had_user=$(getent passwd sqcq >/dev/null && echo yes || echo no)
had_group=$(getent group sqcq >/dev/null && echo yes || echo no)
had_libvirt_group=$(getent group libvirt-qemu >/dev/null && echo yes || echo no)
daemon_pid=
notify_pid=
cleanup() {
    local rc=$?
    set +e
    [ -z "$daemon_pid" ] || kill -KILL "$daemon_pid" 2>/dev/null
    [ -z "$notify_pid" ] || kill "$notify_pid" 2>/dev/null
    wait 2>/dev/null
    if dpkg-query -W -f='${Status}' sqcq 2>/dev/null | grep -qv 'not-installed'; then
        dpkg -P sqcq >/dev/null 2>&1 || echo "deb-test: cleanup: dpkg -P sqcq failed" >&2
    fi
    rm -rf /etc/systemd/system/sqcqd.service.d /var/lib/sqcq /run/sqcq /etc/sqcq "$work"
    [ "$had_user" = yes ] || ! getent passwd sqcq >/dev/null || userdel sqcq
    [ "$had_group" = yes ] || ! getent group sqcq >/dev/null || groupdel sqcq
    [ "$had_libvirt_group" = yes ] || ! getent group libvirt-qemu >/dev/null || groupdel libvirt-qemu
    [ "$rc" = 0 ] || echo "deb-test: failed (exit $rc); the machine was cleaned up" >&2
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

say "package $deb ($(du -h "$deb" | cut -f1))"

# --- lintian -----------------------------------------------------------
# Errors and warnings fail. The default maintainer address of
# build-deb.sh (DEBEMAIL unset) has no real mail host, which lintian
# calls an error: it is only tolerated in that case.
suppress=()
if [ "$(dpkg-deb -f "$deb" Maintainer)" = "sqcq <dev@sqcq>" ]; then
    suppress=(--suppress-tags "bogus-mail-host,bogus-mail-host-in-debian-changelog")
    say "lintian: the placeholder maintainer address is tolerated (set DEBEMAIL when building)"
fi
if ! (cd "$work" && lintian --fail-on error,warning "${suppress[@]}" "$deb") >"$work/lintian.log" 2>&1; then
    cat "$work/lintian.log" >&2
    fail "lintian"
fi
say "lintian: no error or warning$(grep -c '^[IPN]:' "$work/lintian.log" | sed 's/^0$//; s/^[1-9].*/ (& notes)/')"

# --- install -----------------------------------------------------------
# --path-include: a minimised image's dpkg.cfg.d may exclude man pages and
# /usr/share/doc, which the checks below look for.
dpkg --path-include='/usr/share/man/man?/sqcq*' --path-include='/usr/share/doc/sqcq/*' \
    -i "$deb" </dev/null >"$work/dpkg-install.log" 2>&1 ||
    { cat "$work/dpkg-install.log" >&2; fail "dpkg -i $deb (its Depends must be installed: scripts/setup.sh)"; }
version=$(dpkg-deb -f "$deb" Version)
say "installed sqcq $version"

for f in /usr/bin/sqcqd /usr/bin/sqcq-bench \
    /lib/systemd/system/sqcqd.service /lib/systemd/system/sqcqd.socket \
    /usr/lib/tmpfiles.d/sqcqd.conf /etc/sqcq/sqcqd.toml \
    /usr/share/man/man8/sqcqd.8.gz /usr/share/man/man8/sqcqd-rpc.8.gz \
    /usr/share/man/man8/sqcqd-top.8.gz \
    /usr/share/man/man1/sqcq-bench.1.gz \
    /usr/share/bash-completion/completions/sqcqd \
    /usr/share/zsh/vendor-completions/_sqcqd \
    /usr/share/fish/vendor_completions.d/sqcqd.fish \
    /usr/share/doc/sqcq/copyright /usr/share/doc/sqcq/changelog.gz \
    /usr/share/doc/sqcq/examples/metrics-tcp.conf; do
    [ -f "$f" ] || fail "$f is not installed"
done
[ "$(/usr/bin/sqcqd version)" = "sqcqd ${version//\~/-}" ] || fail "sqcqd version: $(/usr/bin/sqcqd version)"
/usr/bin/sqcq-bench --version >/dev/null || fail "sqcq-bench --version"
grep -q '^ExecStart=/usr/bin/sqcqd ' /lib/systemd/system/sqcqd.service ||
    fail "the installed unit does not run /usr/bin/sqcqd"
dpkg-query -W -f='${Conffiles}\n' sqcq | grep -q '^ /etc/sqcq/sqcqd.toml ' ||
    fail "/etc/sqcq/sqcqd.toml is not a conffile"

for page in sqcqd sqcqd-rpc sqcqd-top sqcq-bench; do
    path=$(man -w "$page") || fail "man -w $page finds no page"
    # man's own warnings (groff -ww) on stderr, as lintian checks them.
    LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$path" >"$work/$page.txt" 2>"$work/$page.err" ||
        fail "man -l $path"
    [ ! -s "$work/$page.err" ] || fail "man -l $path warns: $(cat "$work/$page.err")"
    grep -q -- '--' "$work/$page.txt" || fail "man -l $path renders no option"
done
say "man pages render: sqcqd(8), sqcqd-rpc(8), sqcqd-top(8), sqcq-bench(1)"
bash -n /usr/share/bash-completion/completions/sqcqd || fail "bash -n of the bash completion"
bash -c 'source /usr/share/bash-completion/completions/sqcqd && complete -p sqcqd' >/dev/null ||
    fail "the bash completion registers nothing for sqcqd"
shells="bash"
if command -v zsh >/dev/null; then
    zsh -n /usr/share/zsh/vendor-completions/_sqcqd || fail "zsh -n of the zsh completion"
    shells+=", zsh"
fi
if command -v fish >/dev/null; then
    fish --no-execute /usr/share/fish/vendor_completions.d/sqcqd.fish || fail "fish -n of the fish completion"
    shells+=", fish"
fi
say "completions parse: $shells"

# What postinst made: the system user, /run/sqcq as the tmpfiles entry
# says; the units neither enabled nor started.
IFS=: read -r _ _ uid _ _ home shell < <(getent passwd sqcq) || fail "postinst made no user sqcq"
[ "$uid" -lt 1000 ] || fail "sqcq is not a system user (uid $uid)"
[ "$shell" = /usr/sbin/nologin ] || fail "sqcq's shell is $shell"
[ "$(stat -c '%U:%G %a' /run/sqcq 2>/dev/null)" = "sqcq:sqcq 755" ] ||
    fail "/run/sqcq is not sqcq:sqcq 0755 (systemd-tmpfiles in postinst): $(stat -c '%U:%G %a' /run/sqcq 2>&1)"
if find /etc/systemd/system -name 'sqcqd.*' | grep -q .; then
    fail "installing enabled a unit: $(find /etc/systemd/system -name 'sqcqd.*')"
fi
say "postinst: user sqcq (uid $uid, home $home), /run/sqcq, no unit enabled"

# --- systemd-analyze ---------------------------------------------------
verify() {
    systemd-analyze verify /lib/systemd/system/sqcqd.service /lib/systemd/system/sqcqd.socket \
        >"$work/verify.log" 2>&1 || { cat "$work/verify.log" >&2; fail "systemd-analyze verify $1"; }
    [ ! -s "$work/verify.log" ] || { cat "$work/verify.log" >&2; fail "systemd-analyze verify $1 warns"; }
}
# The group the unit's SupplementaryGroups= names; libvirt-daemon-system
# makes it on a libvirt host.
[ "$had_libvirt_group" = yes ] || groupadd --system libvirt-qemu
verify "of the installed units"
install -D -m 0644 /usr/share/doc/sqcq/examples/metrics-tcp.conf \
    /etc/systemd/system/sqcqd.service.d/metrics-tcp.conf
verify "with the metrics-tcp drop-in"
rm -r /etc/systemd/system/sqcqd.service.d
say "systemd-analyze verify: the units, and the service with examples/metrics-tcp.conf"

# --- the service -------------------------------------------------------
unit=/lib/systemd/system/sqcqd.service
# The [Service] directives of the unit, one "Key=value" a line.
sed -n '/^\[Service\]/,/^\[/{/^[A-Za-z]/p}' "$unit" >"$work/service"
# unit_value KEY: the value systemd uses (the last assignment).
unit_value() { sed -n "s/^$1=//p" "$work/service" | tail -n 1; }
emulated=" Type NotifyAccess ExecStart ExecReload TimeoutStopSec User Group SupplementaryGroups
    ReadWritePaths StateDirectory StateDirectoryMode UMask NoNewPrivileges CapabilityBoundingSet
    AmbientCapabilities ProtectSystem PrivateTmp PrivateNetwork "
systemd_only=" Restart ProtectHome PrivateDevices ProtectKernelTunables ProtectKernelModules
    ProtectKernelLogs ProtectControlGroups ProtectClock ProtectHostname ProtectProc
    RestrictNamespaces RestrictRealtime RestrictSUIDSGID LockPersonality MemoryDenyWriteExecute
    SystemCallArchitectures RestrictAddressFamilies IPAddressDeny PrivateMounts RemoveIPC "
known=$(tr -s '[:space:]' '\n' <<<"$emulated $systemd_only")
while IFS='=' read -r key _; do
    grep -qxF "$key" <<<"$known" ||
        fail "$unit sets $key=, which this test neither does as systemd would nor knows to leave to systemd: add it to one of its lists"
done <"$work/service"

[ "$(unit_value Type)" = notify ] || fail "Type=$(unit_value Type): the test expects notify"
exec_start=$(unit_value ExecStart)
case "$exec_start" in
    /*) ;;
    *) fail "ExecStart=$exec_start: not an absolute path without prefixes" ;;
esac
case "$exec_start" in
    *[\"\'%\\\$]*) fail "ExecStart=$exec_start: quoting, specifiers or variables this test does not expand" ;;
esac
read -ra argv <<<"$exec_start"
admin_socket=/run/sqcq/sqcqd.sock
metrics_socket=$(sed -n 's/^metrics-listen = "unix:\(.*\)"$/\1/p' /etc/sqcq/sqcqd.toml)
notify_log="$work/notify.log"

if [ -d /run/systemd/system ]; then
    # systemd is PID 1: the unit itself (not run in the project's
    # container, which has no systemd as PID 1).
    say "systemd runs here: systemctl start sqcqd.service"
    systemctl start sqcqd.service || fail "systemctl start sqcqd.service: $(systemctl status sqcqd --no-pager 2>&1)"
    daemon_pid=$(systemctl show -p MainPID --value sqcqd.service)
else
    say "systemd is not PID 1 here ($(ps -o comm= -p 1)): running the unit's ExecStart= as systemd would"
    user=$(unit_value User)
    group=$(unit_value Group)
    # initgroups(User=) and SupplementaryGroups=, as systemd sets them.
    gids=$(id -G "$user" | tr ' ' '\n')
    for g in $(unit_value SupplementaryGroups); do
        gids+=$'\n'$(getent group "$g" | cut -d: -f3)
    done
    gids=$(sort -un <<<"$gids" | paste -sd, -)
    state_dir=/var/lib/$(unit_value StateDirectory)
    install -d -o "$user" -g "$group" -m "$(unit_value StateDirectoryMode)" "$state_dir"
    priv=(setpriv "--reuid=$user" "--regid=$group" "--groups=$gids" --inh-caps=-all)
    [ "$(unit_value NoNewPrivileges)" = yes ] && priv+=(--no-new-privs)
    [ -z "$(unit_value CapabilityBoundingSet)" ] && priv+=(--bounding-set=-all)
    [ -z "$(unit_value AmbientCapabilities)" ] || fail "AmbientCapabilities=$(unit_value AmbientCapabilities): the test runs with none"
    # ProtectSystem=strict and the paths that stay writable, PrivateTmp=.
    setup="set -e"
    for p in $(unit_value ReadWritePaths) "$state_dir"; do
        [ -d "$p" ] || fail "ReadWritePaths=$p does not exist"
        setup+="; mount --bind $p $p"
    done
    [ "$(unit_value ProtectSystem)" = strict ] && setup+="; mount -o bind,remount,ro /"
    [ "$(unit_value PrivateTmp)" = yes ] && setup+="; mount -t tmpfs -o mode=1777 tmpfs /tmp; mount -t tmpfs -o mode=1777 tmpfs /var/tmp"
    setup+="; umask $(unit_value UMask); cd /"
    namespaces=(--mount --propagation private)
    [ "$(unit_value PrivateNetwork)" = yes ] && namespaces+=(--net)
    unshare "${namespaces[@]}" true || fail "unshare ${namespaces[*]}: the test needs mount and network namespaces"

    # The notification socket systemd gives a Type=notify service (anyone
    # may send to it, as to /run/systemd/notify): each datagram a line.
    python3 -c '
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o666)
with open(sys.argv[2], "a", buffering=1) as log:
    print("LISTENING", file=log)
    while True:
        log.write(s.recv(4096).decode(errors="replace").replace("\n", " ") + "\n")
' "$work/notify" "$notify_log" &
    notify_pid=$!
    for _ in $(seq 50); do grep -q LISTENING "$notify_log" 2>/dev/null && break; sleep 0.1; done
    grep -q LISTENING "$notify_log" || fail "the notification socket does not listen"

    # The environment systemd gives a system service.
    env=(env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
        "USER=$user" "LOGNAME=$user" "HOME=$home" "SHELL=$shell"
        "INVOCATION_ID=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')" "NOTIFY_SOCKET=$work/notify")
    unshare "${namespaces[@]}" /bin/sh -c "$setup; exec \"\$@\"" sh \
        "${priv[@]}" "${env[@]}" "${argv[@]}" >"$work/sqcqd.log" 2>&1 &
    daemon_pid=$!
    say "not done here (systemd's own):$(tr -s ' \n' ' ' <<<"$systemd_only")"
fi

# notified WORD [SINCE]: waits (up to 30 s, as long as the daemon lives)
# for a notification with WORD after line SINCE of the log.
notified() {
    for _ in $(seq 300); do
        tail -n "+$((${2:-0} + 1))" "$notify_log" 2>/dev/null | grep -qw "$1" && return 0
        kill -0 "$daemon_pid" 2>/dev/null || break
        sleep 0.1
    done
    return 1
}
show_log() {
    cat "$work/sqcqd.log" >&2 2>/dev/null
    cat "$notify_log" >&2 2>/dev/null
}

if [ -z "$notify_pid" ]; then
    systemctl is-active --quiet sqcqd.service || fail "sqcqd.service is not active"
else
    notified READY=1 || { show_log; fail "the daemon did not notify READY=1"; }
    say "READY=1: $(grep -o 'STATUS=[^=]*$' "$notify_log" | tail -n 1)"
    status=$(cat "/proc/$daemon_pid/status")
    for line in "Uid:"$'\t'"$(id -u "$user")" "NoNewPrivs:"$'\t'"1" \
        "CapBnd:"$'\t'"0000000000000000" "Seccomp:"$'\t'"2"; do
        grep -q "^$line" <<<"$status" || fail "the daemon's /proc status has no '$line'"
    done
    for g in $(unit_value SupplementaryGroups); do
        grep "^Groups:" <<<"$status" | grep -qw "$(getent group "$g" | cut -d: -f3)" ||
            fail "the daemon is not in the group $g"
    done
    grep ' / / ' "/proc/$daemon_pid/mountinfo" | grep -q ' ro[, ]' ||
        fail "the daemon's root is not read-only"
    if [ "$(unit_value PrivateNetwork)" = yes ] &&
        [ "$(readlink "/proc/$daemon_pid/ns/net")" = "$(readlink /proc/self/ns/net)" ]; then
        fail "the daemon runs in the host's network namespace"
    fi
fi

[ -S "$admin_socket" ] || fail "no admin socket at $admin_socket"
env -u SQCQ_ADMIN_SOCKET /usr/bin/sqcqd rpc daemon_info >"$work/daemon_info.json" 2>&1 ||
    { show_log; cat "$work/daemon_info.json" >&2; fail "sqcqd rpc daemon_info on the default socket"; }
python3 -c '
import json, sys
info = json.load(open(sys.argv[1]))
assert info["pid"] == int(sys.argv[2]), "pid"
assert info["version"] == sys.argv[3], "version"
assert info["devices"] == int(sys.argv[4]), "devices"
print("deb-test: sqcqd rpc daemon_info:", json.dumps(info, sort_keys=True))
' "$work/daemon_info.json" "$daemon_pid" "${version//\~/-}" "$(grep -c '^\[\[device\]\]' /etc/sqcq/sqcqd.toml)" ||
    fail "daemon_info is not this daemon's, of the configuration's devices: $(cat "$work/daemon_info.json")"
if [ -n "$metrics_socket" ]; then
    curl -sf --unix-socket "$metrics_socket" http://localhost/metrics >"$work/metrics.txt" ||
        fail "no scrape from the metrics socket $metrics_socket"
    grep -q '^sqcq_' "$work/metrics.txt" || fail "the scrape of $metrics_socket has no sqcq_ family"
    say "metrics: $(grep -c '^sqcq_' "$work/metrics.txt") samples from $metrics_socket"
fi
sed -n 's|^path = "\(/var/lib/sqcq/.*\)"$|\1|p' /etc/sqcq/sqcqd.toml | while read -r lun; do
    [ "$(stat -c %U "$lun" 2>/dev/null)" = sqcq ] || fail "the LUN file $lun was not made by sqcq"
done

if [ -z "$notify_pid" ]; then
    systemctl reload sqcqd.service || fail "systemctl reload"
    systemctl stop sqcqd.service || fail "systemctl stop"
    [ "$(systemctl show -p Result --value sqcqd.service)" = success ] ||
        fail "sqcqd.service: $(systemctl show -p Result --value sqcqd.service)"
    daemon_pid=
else
    # ExecReload= as written, $MAINPID the daemon's pid.
    reload=$(unit_value ExecReload)
    since=$(wc -l <"$notify_log")
    sh -c "${reload//\$MAINPID/$daemon_pid}" || fail "ExecReload=$reload"
    if ! notified RELOADING=1 "$since" || ! notified READY=1 "$since"; then
        show_log
        fail "no RELOADING=1 then READY=1 after ExecReload="
    fi
    ! tail -n "+$((since + 1))" "$notify_log" | grep -q 'reload failed' ||
        { show_log; fail "the reload failed"; }
    say "ExecReload=$reload: RELOADING=1, READY=1"

    # systemd's stop: SIGTERM, then TimeoutStopSec= before SIGKILL.
    kill -TERM "$daemon_pid"
    timeout=$(unit_value TimeoutStopSec)
    for _ in $(seq $((${timeout:-90} * 10))); do
        kill -0 "$daemon_pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$daemon_pid" 2>/dev/null && { show_log; fail "still running ${timeout:-90} s after SIGTERM"; }
    rc=0
    wait "$daemon_pid" || rc=$?
    daemon_pid=
    [ "$rc" = 0 ] || { show_log; fail "the daemon exited $rc on SIGTERM"; }
    notified STOPPING=1 || fail "no STOPPING=1"
    grep -qi 'panic' "$work/sqcqd.log" && { show_log; fail "the daemon's log has a panic"; }
    grep -q 'ERROR' "$work/sqcqd.log" && { show_log; fail "the daemon logged an error"; }
    { grep 'WARN' "$work/sqcqd.log" || true; } | sed 's/^/deb-test: the daemon warned: /'
fi
[ ! -e "$admin_socket" ] || fail "the admin socket was left behind"
say "SIGTERM: STOPPING=1, exit 0, the admin socket removed"

# --- conffile, remove, purge ------------------------------------------
echo "# edited by deb-test" >>/etc/sqcq/sqcqd.toml
dpkg -i "$deb" </dev/null >"$work/dpkg-reinstall.log" 2>&1 ||
    { cat "$work/dpkg-reinstall.log" >&2; fail "dpkg -i again (a reinstall over an edited conffile)"; }
grep -q '^# edited by deb-test$' /etc/sqcq/sqcqd.toml || fail "a reinstall replaced the edited conffile"
dpkg -r sqcq </dev/null >"$work/dpkg-remove.log" 2>&1 || { cat "$work/dpkg-remove.log" >&2; fail "dpkg -r sqcq"; }
for f in /usr/bin/sqcqd /usr/bin/sqcq-bench /lib/systemd/system/sqcqd.service /usr/share/man/man8/sqcqd.8.gz; do
    [ ! -e "$f" ] || fail "dpkg -r left $f"
done
grep -q '^# edited by deb-test$' /etc/sqcq/sqcqd.toml 2>/dev/null || fail "dpkg -r removed the conffile"
[ "$(dpkg-query -W -f='${Status}' sqcq)" = "deinstall ok config-files" ] ||
    fail "after dpkg -r: $(dpkg-query -W -f='${Status}' sqcq)"
dpkg -P sqcq </dev/null >"$work/dpkg-purge.log" 2>&1 || { cat "$work/dpkg-purge.log" >&2; fail "dpkg -P sqcq"; }
[ ! -e /etc/sqcq ] || fail "dpkg -P left /etc/sqcq: $(ls -A /etc/sqcq)"
if find /etc/systemd/system /var/lib/systemd/deb-systemd-helper-enabled -name 'sqcqd.*' 2>/dev/null | grep -q .; then
    fail "dpkg -P left $(find /etc/systemd/system /var/lib/systemd/deb-systemd-helper-enabled -name 'sqcqd.*')"
fi
! dpkg-query -W -f='${Status}' sqcq 2>/dev/null | grep -qv 'not-installed' || fail "sqcq is still known to dpkg after dpkg -P"
[ -d /var/lib/sqcq ] || fail "dpkg -P removed /var/lib/sqcq (the LUN files)"
say "a reinstall and dpkg -r kept the edited conffile; dpkg -P removed it and the units' state, kept /var/lib/sqcq"
say "passed"
