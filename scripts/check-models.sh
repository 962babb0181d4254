#!/usr/bin/env bash
# Model-check models/need_wakeup.pml with spin.
#
# The full model must verify with 0 errors (safety: assertions and invalid
# end states; liveness: every request is eventually harvested, under weak
# fairness). Each of the four variants without one of the fence(SeqCst)
# points must produce a counterexample. Exits non-zero otherwise.
# Works from any directory; builds pan in a temporary directory.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model="$root/models/need_wakeup.pml"
pml="$(basename "$model")"

install_pkg() { # command package
    command -v "$1" >/dev/null 2>&1 && return 0
    echo "$1 not found: installing package $2 with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y "$2" >/dev/null 2>&1 && return 0
    apt-get update >/dev/null 2>&1 && apt-get install -y "$2" >/dev/null 2>&1 && return 0
    echo "cannot install $2; install it and run again" >&2
    exit 2
}
install_pkg spin spin
install_pkg gcc gcc

work="$(mktemp -d "${TMPDIR:-/tmp}/check-models.XXXXXX")"
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
# pan: -m depth bound far above the model's (~600), -n no unreached report.
PAN_CFLAGS=(-O2 -w -DVECTORSZ=1024)
PAN_DEPTH=-m1000000

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

# build DIR SPIN_DEFINES... : spin -a and gcc in DIR
build() {
    local dir=$1
    shift
    mkdir -p "$dir" && cp "$model" "$dir/" || return 1
    (cd "$dir" && spin "$@" -a "$pml" >spin.out 2>&1 &&
        gcc "${PAN_CFLAGS[@]}" -o pan pan.c >gcc.out 2>&1)
}

# errors FILE : the error count pan reported, empty if none was reported
errors() { sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' "$1" | tail -n 1; }

# exhaustive FILE : pan searched the whole state space (no depth cut-off)
exhaustive() { ! grep -q 'max search depth too small' "$1"; }

states() { awk '/states, stored/ { print $1; exit }' "$1"; }

verdict() { # PASS|FAIL text
    if [ "$1" = PASS ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    printf '%s  %s\n' "$1" "$2"
}

check_full() {
    local start dir e1 e2
    start=$(now)
    dir="$work/full"
    if ! build "$dir/safety"; then
        verdict FAIL "full model: build failed ($(tail -n 1 "$dir"/safety/*.out))"
        return
    fi
    (cd "$dir/safety" && ./pan $PAN_DEPTH -n >pan.out 2>&1)
    e1=$(errors "$dir/safety/pan.out")
    if [ "$e1" != 0 ] || ! exhaustive "$dir/safety/pan.out"; then
        verdict FAIL "full model: safety errors=${e1:-?} ($(since "$start"))"
        grep -E '^pan:|max search depth' "$dir/safety/pan.out" | head -n 3 | sed 's/^/      /'
        return
    fi
    if ! build "$dir/liveness" -DLIVENESS; then
        verdict FAIL "full model: liveness build failed"
        return
    fi
    (cd "$dir/liveness" && ./pan $PAN_DEPTH -n -a -f >pan.out 2>&1)
    e2=$(errors "$dir/liveness/pan.out")
    if [ "$e2" != 0 ] || ! exhaustive "$dir/liveness/pan.out"; then
        verdict FAIL "full model: liveness errors=${e2:-?} ($(since "$start"))"
        grep -E '^pan:|max search depth' "$dir/liveness/pan.out" | head -n 3 | sed 's/^/      /'
        return
    fi
    verdict PASS "full model: 0 errors, safety ($(states "$dir/safety/pan.out") states) and liveness under weak fairness, exhaustive ($(since "$start"))"
}

# check_variant MACRO description: the model without that fence must fail
check_variant() {
    local macro=$1 what=$2 start dir e
    start=$(now)
    dir="$work/$macro"
    if ! build "$dir" "-D$macro"; then
        verdict FAIL "-D$macro: build failed ($(tail -n 1 "$dir"/*.out))"
        return
    fi
    # Stops at the first counterexample (the trail is not the shortest: a
    # breadth-first pan, gcc -DBFS, finds that, in seconds to minutes).
    (cd "$dir" && ./pan $PAN_DEPTH -n >pan.out 2>&1)
    e=$(errors "$dir/pan.out")
    if [ -z "$e" ] || [ "$e" = 0 ] || [ ! -f "$dir/$pml.trail" ]; then
        verdict FAIL "-D$macro ($what): no counterexample, but one was expected ($(since "$start"))"
        return
    fi
    verdict PASS "-D$macro ($what): counterexample found, as expected ($(since "$start"))"
    (cd "$dir" && spin -T -t "-D$macro" "$pml" >replay.out 2>&1)
    printf '      %s, trail of %s steps\n' \
        "$(grep -m 1 '^pan:1:' "$dir/pan.out")" \
        "$(sed -n 's/^spin: trail ends after \([0-9]*\) steps.*/\1/p' "$dir/replay.out")"
    # The processes left blocked outside an end state, and where.
    grep -E '^ *[0-9]+:[[:space:]]+proc ' "$dir/replay.out" | grep -v 'valid end state' |
        while read -r _ _ _ name loc _; do
            name=${name#(}
            line=${loc##*:}
            printf '      %s blocked forever at line %s: %s\n' "${name%%:*}" "$line" \
                "$(sed -n "${line}p" "$model" | sed 's/^[[:space:]]*//; s/[[:space:]][[:space:]]*/ /g')"
        done
}

begin=$(now)
check_full
check_variant NO_FENCE_SQ_PRODUCER "fence 1, driver: sq.idx store -> sq.flags load"
check_variant NO_FENCE_SQ_CONSUMER "fence 2, device: sq.flags store -> sq.idx load"
check_variant NO_FENCE_CQ_PRODUCER "fence 3, device: cq.idx store -> cq.flags load"
check_variant NO_FENCE_CQ_CONSUMER "fence 4, driver: cq.flags store -> cq.idx load"
echo "total $(since "$begin")"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
