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

# lane_cpu: the CPU milliseconds this lane has used so far: its shell's and
# those of the children it has waited for (/proc/$$/stat: utime, stime,
# cutime, cstime, in clock ticks; $$ is the lane's shell in a subshell
# too). A background child counts once it is waited for: test.sh's
# figures leave out its two other lanes, which report their own.
lane_cpu() {
    local -a st
    read -r -a st < /proc/$$/stat
    echo $(( (st[13] + st[14] + st[15] + st[16]) * 1000 / $(getconf CLK_TCK) ))
}

# stage TEXT: announces a stage and records its start, and the lane's CPU
# time so far.
stage() {
    local t=$(($(date +%s) - SQCQ_STAGES_T0))
    echo "== [$(printf '%d:%02d' $((t / 60)) $((t % 60)))] $1"
    printf '%5d s  %-6s %9d  %s\n' "$t" "${SQCQ_STAGES_LANE:-}" "$(lane_cpu)" "$1" >> "$SQCQ_STAGES_FILE"
}

# stage_report: every stage recorded, in the order they began, with how
# long it took and how many CPU seconds its lane used meanwhile (up to the
# lane's next stage: each lane ends with one), and the total time so far.
# Bash reaps a background lane when it exits, adding its CPU time to the
# lane that started it: that lane's figure for the stage in which another
# lane recorded its last stage is given without the other lane's total.
stage_report() {
    local t=$(($(date +%s) - SQCQ_STAGES_T0))
    echo "== stages (start since the beginning, duration, CPU seconds of the lane in it; total $t s)"
    sort -n -s -k1,1 "$SQCQ_STAGES_FILE" | awk -v parent="${SQCQ_STAGES_LANE:-}" '
        { start[NR] = $1; lane[NR] = $3; cpu[NR] = $4; last[$3] = NR
          name[NR] = $0; sub(/^ *[0-9]+ s +[^ ]+ +[0-9]+  /, "", name[NR]) }
        END {
            for (i = 1; i <= NR; i++) {
                d = "?"; c = "?"
                for (j = i + 1; j <= NR; j++)
                    if (lane[j] == lane[i]) {
                        d = start[j] - start[i]; ms = cpu[j] - cpu[i]
                        if (lane[i] == parent)
                            for (l in last)
                                if (l != parent && start[last[l]] >= start[i] && start[last[l]] < start[j])
                                    ms -= cpu[last[l]]
                        c = sprintf("%.0f", ms / 1000)
                        break
                    }
                printf "%5d s  %-6s %5s s %6s cpu-s  %s\n", start[i], lane[i], d, c, name[i]
            }
        }'
}
