#!/usr/bin/env bash
# Starts sqcqd from a qemu-storage-daemon command line: the subset QEMU's
# own vhost-user-blk functional test (tests/qtest/vhost-user-blk-test.c,
# run by scripts/qtest.sh) hands to QTEST_QEMU_STORAGE_DAEMON_BINARY:
#
#   --blockdev driver=file,node-name=NODE,filename=PATH
#   --export type=vhost-user-blk,id=ID,node-name=NODE,
#            addr.type=fd,addr.str=FD | addr.type=unix,addr.path=PATH,
#            [writable=on|off],[num-queues=N]
#
# Each export becomes a blk device of one file LUN (read-only unless
# writable=on, as in qemu-storage-daemon). A listening socket passed as a
# descriptor is handed to sqcqd by socket activation (sd_listen_fds(3):
# moved to 3, 4, ..., LISTEN_FDS, LISTEN_PID of this process, which sqcqd
# then is, LISTEN_FDNAMES the path it is bound to); sqcqd leaves the
# socket's file to its owner. The process is sqcqd in the end (exec), so
# SIGTERM ends it with status 0 as it ends qemu-storage-daemon.
#
# SQCQD names the binary (default target/debug/sqcqd); SQCQD_ARGS adds
# options. Anything else qemu-storage-daemon takes is refused with a
# message, not ignored.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
sqcqd="${SQCQD:-$repo/target/debug/sqcqd}"
die() { echo "qsd-compat: $*" >&2; exit 1; }

# QEMU's key=value,key=value option syntax (no ",," escapes: the test's
# paths have no commas).
declare -A node_file=()
exports=()
while [ $# -gt 0 ]; do
    opt="$1"
    case "$opt" in
        --blockdev | --export) [ $# -ge 2 ] || die "$opt needs a value"; val="$2"; shift 2 ;;
        --blockdev=* | --export=*) val="${opt#*=}"; opt="${opt%%=*}"; shift ;;
        *) die "unsupported argument: $opt" ;;
    esac
    if [ "$opt" = --blockdev ]; then
        driver="" node="" file=""
        IFS=, read -r -a kvs <<< "$val"
        for kv in "${kvs[@]}"; do
            case "$kv" in
                driver=*) driver="${kv#driver=}" ;;
                node-name=*) node="${kv#node-name=}" ;;
                filename=*) file="${kv#filename=}" ;;
                *) die "--blockdev: unsupported option ${kv%%=*}" ;;
            esac
        done
        [ "$driver" = file ] || die "--blockdev: only driver=file is supported (got '$driver')"
        [ -n "$node" ] && [ -n "$file" ] || die "--blockdev needs node-name= and filename="
        node_file[$node]="$(realpath -- "$file")"
    else
        exports+=("$val")
    fi
done
[ "${#exports[@]}" -gt 0 ] || die "no --export"

# The path a listening socket descriptor of this process is bound to.
bound_path() {
    local inode
    inode="$(readlink "/proc/$$/fd/$1")" || die "descriptor $1 is not open"
    inode="${inode#socket:[}"
    inode="${inode%]}"
    awk -v ino="$inode" '$7 == ino && NF >= 8 { print $8; exit }' /proc/net/unix
}

# A TOML basic string.
toml_str() {
    local v="${1//\\/\\\\}"
    printf '"%s"' "${v//\"/\\\"}"
}

config=""
passed_fds=()
names=()
for val in "${exports[@]}"; do
    type="" id="" node="" addr_type="" addr_str="" addr_path="" writable=off queues=1
    IFS=, read -r -a kvs <<< "$val"
    for kv in "${kvs[@]}"; do
        case "$kv" in
            type=*) type="${kv#type=}" ;;
            id=*) id="${kv#id=}" ;;
            node-name=*) node="${kv#node-name=}" ;;
            addr.type=*) addr_type="${kv#addr.type=}" ;;
            addr.str=*) addr_str="${kv#addr.str=}" ;;
            addr.path=*) addr_path="${kv#addr.path=}" ;;
            writable=*) writable="${kv#writable=}" ;;
            num-queues=*) queues="${kv#num-queues=}" ;;
            *) die "--export: unsupported option ${kv%%=*}" ;;
        esac
    done
    [ "$type" = vhost-user-blk ] || die "--export: only type=vhost-user-blk is supported"
    [ -n "${node_file[$node]:-}" ] || die "--export $id: no --blockdev with node-name=$node"
    case "$addr_type" in
        fd)
            [[ "$addr_str" =~ ^[0-9]+$ ]] || die "--export $id: addr.str must be a descriptor number"
            addr_path="$(bound_path "$addr_str")"
            [ -n "$addr_path" ] || die "--export $id: descriptor $addr_str is not a bound unix socket"
            [[ "$addr_path" != *:* ]] || die "--export $id: socket path $addr_path has a ':' (LISTEN_FDNAMES separator)"
            passed_fds+=("$addr_str")
            names+=("$addr_path")
            ;;
        unix) [ -n "$addr_path" ] || die "--export $id: addr.type=unix needs addr.path" ;;
        *) die "--export $id: addr.type must be fd or unix" ;;
    esac
    [[ "$queues" =~ ^[0-9]+$ ]] || die "--export $id: num-queues=$queues"
    case "$writable" in on | true | yes) ro=false ;; off | false | no) ro=true ;;
        *) die "--export $id: writable=$writable" ;; esac
    config+="[[device]]
type = \"blk\"
socket-path = $(toml_str "$addr_path")
num-queues = $queues

[[device.lun]]
kind = \"file\"
path = $(toml_str "${node_file[$node]}")
read-only = $ro
serial = $(toml_str "$id")

"
done

# Passed descriptors to 3, 4, ...: first out of the way (above any of
# them), then down, so that none overwrites another still to be moved.
if [ "${#passed_fds[@]}" -gt 0 ]; then
    high=100
    for fd in "${passed_fds[@]}"; do [ "$fd" -lt "$high" ] || high=$((fd + 1)); done
    for i in "${!passed_fds[@]}"; do
        eval "exec $((high + i))<&${passed_fds[$i]} ${passed_fds[$i]}<&-"
    done
    for i in "${!passed_fds[@]}"; do
        eval "exec $((3 + i))<&$((high + i)) $((high + i))<&-"
    done
    export LISTEN_PID=$$ LISTEN_FDS="${#passed_fds[@]}"
    LISTEN_FDNAMES="$(IFS=:; echo "${names[*]}")"
    export LISTEN_FDNAMES
fi
# The configuration reaches sqcqd through a descriptor: no file to clean
# up after an exec.
# shellcheck disable=SC2086
exec "$sqcqd" --config /dev/fd/9 --stats-interval 0 ${SQCQD_ARGS:-} 9<<< "$config"
