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
# 2 s, then KILL the group.
kill_group() {
    local p="$1"
    [ -n "$p" ] || return 0
    kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
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
