#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ (a workspace of its own) for N seconds
# each, default 20: scripts/fuzz.sh [SECONDS] [TARGET...] (scripts/test.sh
# runs each for 15 s). Installs cargo-fuzz if it is missing. Works on stable Rust: RUSTC_BOOTSTRAP=1 lets
# cargo-fuzz pass -Zsanitizer=address (ASan is on by default). Set
# FUZZ_SANITIZER=none to build without ASan (faster, catches panics only).
# Exits non-zero on the first crash; its input is in fuzz/artifacts/TARGET/.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

secs=${1:-20}
shift || true
targets=("$@")
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
fi

export RUSTC_BOOTSTRAP=1
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo fuzz list)
fi
for t in "${targets[@]}"; do
    echo "== fuzz $t for ${secs}s"
    mkdir -p "corpus/$t"
    set +e
    cargo fuzz run -s "${FUZZ_SANITIZER:-address}" "$t" "corpus/$t" -- \
        -max_total_time="$secs" -print_final_stats=1 2>&1 |
        grep -E 'DONE|Done [0-9]+ runs|stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)|panicked|ERROR|SUMMARY|Test unit written|^(error|warning)(\[|:)'
    status=${PIPESTATUS[0]}
    set -e
    if [ "$status" -ne 0 ]; then
        echo "fuzz $t failed (exit $status); reproduce: RUSTC_BOOTSTRAP=1 cargo fuzz run $t fuzz/artifacts/$t/<file>" >&2
        exit "$status"
    fi
done
