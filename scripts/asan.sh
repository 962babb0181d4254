#!/usr/bin/env bash
# The unsafe-heavy crates' unit and integration tests under
# AddressSanitizer: sqcq-backstore (io_uring, iovecs, image locks),
# sqcq-target (guest memory, rings, the daemon: its integration tests
# start an instrumented sqcqd) and sqcq-driver (the driver-side ring).
# A heap use after free, an overflow or a leak in any of them fails the
# run with ASan's report.
#
# Stable Rust: RUSTC_BOOTSTRAP=1 lets it take -Zsanitizer (as for the
# fuzz targets, scripts/fuzz.sh). Built apart, in target/asan, with an
# explicit --target so that build scripts and proc macros stay
# uninstrumented.
#
#   scripts/asan.sh [CARGO TEST ARGS...]    e.g. scripts/asan.sh --test restart
set -euo pipefail
cd "$(dirname "$0")/.."

host="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="${RUSTFLAGS:-} -Zsanitizer=address"
export RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -Zsanitizer=address"
export CARGO_TARGET_DIR="$PWD/target/asan"
# Leaks are errors; a report names the test that made it.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}"
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-p sqcq-backstore -p sqcq-target -p sqcq-driver)
exec cargo test --target "$host" "${args[@]}"
