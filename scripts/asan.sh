#!/usr/bin/env bash
# The unsafe-heavy crates' unit and integration tests under
# AddressSanitizer: sqcq-backstore (io_uring, iovecs, image locks),
# sqcq-target (guest memory, rings, the daemon: its integration tests
# start an instrumented sqcqd) and sqcq-driver (the driver-side ring).
# A heap use after free or an overflow in any of them fails the run with
# ASan's report; a leak in the unit tests too (see below).
#
# Stable Rust: RUSTC_BOOTSTRAP=1 lets it take -Zsanitizer (as for the
# fuzz targets, scripts/fuzz.sh). Built apart, in target/asan, with an
# explicit --target so that build scripts and proc macros stay
# uninstrumented.
#
#   scripts/asan.sh [CARGO TEST ARGS...]    e.g. scripts/asan.sh -p sqcq-target --test restart
set -euo pipefail
cd "$(dirname "$0")/.."

host="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="${RUSTFLAGS:-} -Zsanitizer=address"
export RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -Zsanitizer=address"
export CARGO_TARGET_DIR="$PWD/target/asan"
# The library unit tests run with LeakSanitizer as well: a leak fails
# them, except the ones test helpers make on purpose (lsan.supp). The
# rest (integration tests, and the sqcqd they start) runs with ASan's
# memory checks alone: LeakSanitizer's check at exit stops the process's
# threads with ptrace, which sqcqd's seccomp filter (on in many of those
# tests) rightly kills.
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/scripts/lsan.supp:print_suppressions=0}"
crates=(-p sqcq-backstore -p sqcq-target -p sqcq-driver)
if [ $# -gt 0 ]; then
    exec cargo test --no-fail-fast --target "$host" "$@"
fi
status=0
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1}" \
    cargo test --no-fail-fast --target "$host" "${crates[@]}" --lib || status=1
# Two service tests (socket activation, the unit's hardening) see the
# instrumented daemon killed by SIGSYS: ASan's runtime makes a system call
# their seccomp filter does not allow. They run uninstrumented in the
# plain test run only.
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:halt_on_error=1}" \
    cargo test --no-fail-fast --target "$host" "${crates[@]}" --test '*' -- \
    --skip an_activated_socket_is_served_after_ready_and_left_in_place \
    --skip the_daemon_serves_under_the_units_hardening || status=1
exit $status
