# shellcheck shell=bash
# Sourced by scripts/test.sh and scripts/test-guests.sh: each stage is
# announced with the time since the run began, and the durations are
# listed at the end (and on failure), so that a slow CI run shows where
# its time went.
#
# SQCQ_STAGES_FILE: where the stages are recorded (test.sh sets it for
# both of its lanes, so that one list holds them all; a temporary file
# when unset); SQCQ_STAGES_T0: the
# run's start (seconds since the epoch); SQCQ_STAGES_LANE: the lane's
# name in that list.

: "${SQCQ_STAGES_T0:=$(date +%s)}"
export SQCQ_STAGES_T0
if [ -z "${SQCQ_STAGES_FILE:-}" ]; then
    SQCQ_STAGES_FILE="$(mktemp "${TMPDIR:-/tmp}/sqcq-stages.XXXXXX")"
    export SQCQ_STAGES_FILE
fi

# stage TEXT: announces a stage and records its start.
stage() {
    local t=$(($(date +%s) - SQCQ_STAGES_T0))
    echo "== [$(printf '%d:%02d' $((t / 60)) $((t % 60)))] $1"
    printf '%5d s  %-6s %s\n' "$t" "${SQCQ_STAGES_LANE:-}" "$1" >> "$SQCQ_STAGES_FILE"
}

# stage_report: every stage recorded, in the order they began, with the
# total time so far.
stage_report() {
    local t=$(($(date +%s) - SQCQ_STAGES_T0))
    echo "== stages (start time since the beginning; total $t s)"
    sort -n "$SQCQ_STAGES_FILE"
}
