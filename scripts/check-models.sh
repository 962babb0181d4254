#!/usr/bin/env bash
# Model-check the spin models in models/.
#
#   need_wakeup.pml  the NEED_WAKEUP handshake (spec section 4)
#   throttle.pml     backpressure: THROTTLE in sq.flags (spec section 5)
#   restart.pml      stop, crash and restart of a queue (spec section 8.3)
#   packed.pml       the handshake on a packed virtqueue (spec section 10)
#
# Each full model must verify with 0 errors (safety: assertions and invalid
# end states; liveness: every request is eventually harvested, under weak
# fairness). Each variant that leaves out a fence or a rule must produce a
# counterexample; a variant may need other rules left out too, or another
# size (its macros are a comma-separated list, each passed to spin as -D:
# N=3,NO_D1,NO_D2). Exits non-zero otherwise. Runs up to CHECK_MODELS_JOBS
# checks at once (default: the number of CPUs). Works from any directory;
# builds pan in a temporary directory.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
models="$root/models"

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

jobs_max=${CHECK_MODELS_JOBS:-$(nproc 2>/dev/null || echo 1)}
# pan: -m depth bound far above the models' (~800), -n no unreached report.
# A variant stops at its first counterexample, mostly within a second or
# two: compiling pan without optimisation saves more than it costs there.
PAN_CFLAGS=(-w -DVECTORSZ=1024)
PAN_DEPTH=-m1000000

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

# defines MACROS : "A,B=1" -> "-DA -DB=1"
defines() { [ -n "$1" ] && printf -- '-D%s ' ${1//,/ }; }

# build DIR MODEL GCC_FLAGS SPIN_DEFINES... : spin -a and gcc in DIR
build() {
    local dir=$1 model=$2 cflags=$3
    shift 3
    mkdir -p "$dir" && cp "$models"/*.pml "$dir/" || return 1
    # shellcheck disable=SC2086 # cflags is a list of gcc flags
    (cd "$dir" && spin "$@" -a "$model" >spin.out 2>&1 &&
        gcc "${PAN_CFLAGS[@]}" $cflags -o pan pan.c >gcc.out 2>&1)
}

# errors FILE : the error count pan reported, empty if none was reported
errors() { sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' "$1" | tail -n 1; }

# exhaustive FILE : pan searched the whole state space (no depth cut-off)
exhaustive() { ! grep -q 'max search depth too small' "$1"; }

states() { awk '/states, stored/ { print $1; exit }' "$1"; }

# verdict PASS|FAIL text : one result line (the caller's log)
verdict() { printf '%s  %s\n' "$1" "$2"; }

# check_full MODEL safety|liveness [MACROS [description]] : the model
# must verify (with MACROS: a claim that those rules are not needed there)
check_full() {
    local model=$1 kind=$2 macros=${3:-} what=${4:-} start dir e name
    local cflags="-O2 -DSAFETY" sdefs=() flags=()
    start=$(now)
    dir="$work/$model-$kind-${macros//[,=]/+}"
    name="$model${macros:+ $(defines "$macros")}"
    name=${name% }
    # shellcheck disable=SC2207 # defines prints words without spaces
    sdefs=($(defines "$macros"))
    if [ "$kind" = liveness ]; then
        cflags=-O2
        sdefs+=(-DLIVENESS)
        flags=(-a -f)
    fi
    if ! build "$dir" "$model" "$cflags" "${sdefs[@]}"; then
        verdict FAIL "$name, $kind: build failed ($(tail -n 1 "$dir"/*.out))"
        return
    fi
    (cd "$dir" && ./pan $PAN_DEPTH -n "${flags[@]}" >pan.out 2>&1)
    e=$(errors "$dir/pan.out")
    if [ "$e" != 0 ] || ! exhaustive "$dir/pan.out"; then
        verdict FAIL "$name${what:+ ($what)}, $kind: errors=${e:-?} ($(since "$start"))"
        grep -E '^pan:|max search depth' "$dir/pan.out" | head -n 3 | sed 's/^/      /'
        return
    fi
    if [ "$kind" = liveness ]; then
        verdict PASS "$name${what:+ ($what)}, liveness under weak fairness: 0 errors, exhaustive, $(states "$dir/pan.out") states ($(since "$start"))"
    else
        verdict PASS "$name${what:+ ($what)}, safety: 0 errors, exhaustive, $(states "$dir/pan.out") states ($(since "$start"))"
    fi
}

# check_variant MODEL MACROS description: the model without it must fail
check_variant() {
    local model=$1 macros=$2 what=$3 start dir e loc name sdefs
    start=$(now)
    dir="$work/$model-${macros//[,=]/+}"
    # shellcheck disable=SC2207 # defines prints words without spaces
    sdefs=($(defines "$macros"))
    name="$model ${sdefs[*]}"
    if ! build "$dir" "$model" "-O0 -DSAFETY" "${sdefs[@]}"; then
        verdict FAIL "$name: build failed ($(tail -n 1 "$dir"/*.out))"
        return
    fi
    # Stops at the first counterexample (the trail is not the shortest: a
    # breadth-first pan, gcc -DBFS, finds that, in seconds to minutes).
    (cd "$dir" && ./pan $PAN_DEPTH -n >pan.out 2>&1)
    e=$(errors "$dir/pan.out")
    if [ -z "$e" ] || [ "$e" = 0 ] || [ ! -f "$dir/$model.trail" ]; then
        verdict FAIL "$name ($what): no counterexample, but one was expected ($(since "$start"))"
        return
    fi
    verdict PASS "$name ($what): counterexample found, as expected ($(since "$start"))"
    (cd "$dir" && spin -T -t "${sdefs[@]}" "$model" >replay.out 2>&1)
    printf '      %s, trail of %s steps\n' \
        "$(grep -m 1 '^pan:1:' "$dir/pan.out")" \
        "$(sed -n 's/^spin: trail ends after \([0-9]*\) steps.*/\1/p' "$dir/replay.out")"
    # An assertion: where. A deadlock: the processes left blocked outside an
    # end state, and where.
    if grep -q '^pan:1: assertion violated' "$dir/pan.out"; then
        loc=$(sed -n 's/^spin: \([^ ]*\), Error: assertion violated.*/\1/p' "$dir/replay.out" | head -n 1)
        printf '      assertion at %s: %s\n' "$loc" \
            "$(sed -n "${loc##*:}p" "$models/${loc%%:*}" | sed 's/^[[:space:]]*//; s/[[:space:]][[:space:]]*/ /g')"
        return
    fi
    grep -E '^ *[0-9]+:[[:space:]]+proc ' "$dir/replay.out" | grep -v 'valid end state' |
        while read -r _ _ _ name loc _; do
            name=${name#(}
            printf '      %s blocked forever at %s: %s\n' "${name%%:*}" "$loc" \
                "$(sed -n "${loc##*:}p" "$models/${loc%%:*}" |
                    sed 's/^[[:space:]]*//; s/[[:space:]][[:space:]]*/ /g')"
        done
}

# The checks, longest first so that parallel runs end together. Each runs
# in the background into its own log; the logs are printed in this order.
checks=(
    "check_full restart.pml liveness"
    "check_full need_wakeup.pml liveness"
    "check_variant throttle.pml N=3,NO_D1,NO_D2 'D2 where the driver resumes only on a clear THROTTLE: sq.flags read before used->idx'"
    "check_full throttle.pml liveness"
    "check_full restart.pml safety"
    "check_full need_wakeup.pml safety"
    "check_full throttle.pml safety"
    "check_full throttle.pml safety COUNT_FENCE,NO_T1,NO_T2_ORDER,NO_D2 'with fence 6, T1, T2 and the read of D2 serve throughput only'"
    "check_variant restart.pml NO_START_RECONCILE 'R1: a published batch still counted in flight'"
    "check_variant restart.pml LAST_HEAD_ONLY 'R1/I2: only the last request of a published batch known'"
    "check_variant restart.pml NO_START_CQ_IDX 'R2: cq.idx not rewritten from used.idx'"
    "check_variant restart.pml NO_START_FENCE 'R2: no fence between the cq.idx store and the cq.flags load'"
    "check_variant restart.pml NO_START_CALL 'R2: no call when cq.flags has NEED_WAKEUP'"
    "check_variant restart.pml NO_START_RESCAN 'R3: waits for sq.idx to change'"
    "check_variant need_wakeup.pml NO_FENCE_SQ_PRODUCER 'fence 1, driver: sq.idx store -> sq.flags load'"
    "check_variant need_wakeup.pml NO_FENCE_SQ_CONSUMER 'fence 2, device: sq.flags store -> sq.idx load'"
    "check_variant need_wakeup.pml NO_FENCE_CQ_PRODUCER 'fence 3, device: cq.idx store -> cq.flags load'"
    "check_variant need_wakeup.pml NO_FENCE_CQ_CONSUMER 'fence 4, driver: cq.flags store -> cq.idx load'"
    "check_variant throttle.pml NO_FENCE_5 'D3, fence 5, submitter: held record store -> sq.flags load'"
    "check_variant throttle.pml NO_T3 'T3: at its limit, the device waits for sq.idx to change'"
    "check_variant throttle.pml NO_T2_ORDER 'T2: THROTTLE cleared after the completion is published; no fence 6'"
    "check_variant throttle.pml NO_T1 'T1: THROTTLE set with nothing outstanding; no fence 6'"
    "check_variant throttle.pml COUNT_FENCE,NO_T1,NO_D1 'D1 against a device that breaks T1: holds with nothing outstanding'"
    "check_full packed.pml liveness"
    "check_full packed.pml liveness CQ 'the CQ doorbell'"
    "check_full packed.pml safety"
    "check_full packed.pml safety CQ 'the CQ doorbell'"
    "check_variant packed.pml RECHECK_IDX_LAST 'C5 compares sq.idx with the last value acted on, not the descriptor flags: two laps alias'"
    "check_variant packed.pml NO_BATCH,RECHECK_IDX_LAST 'the same, each entry published with its own sq.idx store, fence and sq.flags load'"
    "check_variant packed.pml NO_FENCE_PRODUCER 'fence 1, driver: sq.idx store -> sq.flags load'"
    "check_variant packed.pml NO_FENCE_CONSUMER 'fence 2, device: sq.flags store -> descriptor flags load'"
    "check_variant packed.pml CQ,RECHECK_IDX_LAST 'C5 compares cq.idx with the last value acted on, not the descriptor flags: two laps alias'"
    "check_variant packed.pml CQ,NO_FENCE_PRODUCER 'fence 3, device: cq.idx store -> cq.flags load'"
    "check_variant packed.pml CQ,NO_FENCE_CONSUMER 'fence 4, driver: cq.flags store -> descriptor flags load'"
)

begin=$(now)
for i in "${!checks[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do
        wait -n
    done
    eval "${checks[$i]}" >"$work/$i.log" 2>&1 &
done
wait

passed=0
failed=0
# Per model: safety, liveness, then the variants in the order above.
for model in need_wakeup.pml throttle.pml restart.pml packed.pml; do
    for prefix in "check_full $model safety" "check_full $model liveness" "check_variant $model "; do
        for i in "${!checks[@]}"; do
            case ${checks[$i]} in "$prefix"*) ;; *) continue ;; esac
            cat "$work/$i.log"
            if grep -q '^PASS ' "$work/$i.log"; then
                passed=$((passed + 1))
            else
                failed=$((failed + 1))
            fi
        done
    done
done
echo "total $(since "$begin"), $jobs_max checks at a time"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
