# shellcheck shell=bash
# Sourced by scripts/bench-*: what every bench does alike.
#
#   bench_init NAME          errexit reaches into $(...) (a failed case is an
#                            error, not a fast run); the load average at start
#   time_us CMD...           CMD's wall time in microseconds; exits 70 if CMD fails
#   timed_pair I A FA B FB ARGS...
#                            runs FA and FB with ARGS, appends their times to
#                            the arrays named A and B; even I runs FA first,
#                            odd I FB, so that neither side always goes first
#   ratio_report LABEL A B GOAL
#                            each run's ratio A[i]/B[i], and their min, median
#                            and max; GOAL is "<= 1.25" or ">= 0.7", judged on
#                            the median ("": no goal); one row of scripts/bench's table
#   wait_all PID...          waits for each; fails if any failed
#   bench_leftovers DIR [KEY=VALUE | KEY]...
#                            what a run left: containers, volumes, networks
#                            with any of the labels (KEY alone: with a value
#                            under DIR), mounts under DIR, loop devices
#                            backed by a file under DIR, processes whose
#                            arguments name a path under DIR; fails if any
#   bench_end                the load average at start and at the end
#   bench_bins DEFAULT NAME...
#                            the directory of the commands NAME, built with
#                            the profile $PROFILE (default DEFAULT); with
#                            PROFILE=debug they are used as built, no cargo
#                            (dev is cargo's name for the debug profile);
#                            BENCH_BIN_DIR names the directory instead
#
# Rows go to $BENCH_TABLE (tab-separated: bench, case, median, min, max,
# goal, verdict, load at start, load at end) when scripts/bench sets it.

bench_init() {
    BENCH=$1
    shopt -s inherit_errexit
    BENCH_LOAD0=$(bench_load)
    echo "$BENCH: load average at start: $BENCH_LOAD0 ($(nproc) CPUs)"
}

BENCH_TOP=$PWD

bench_bins() {
    local profile=${PROFILE:-$1} args=() n
    shift
    if [[ -n ${BENCH_BIN_DIR:-} ]]; then
        echo "$BENCH_BIN_DIR"
        return
    fi
    if [[ $profile != debug ]]; then
        for n in "$@"; do args+=(--bin "$n"); done
        cargo build --quiet --locked --profile "$profile" "${args[@]}" >&2
    fi
    [[ $profile == dev ]] && profile=debug
    echo "$BENCH_TOP/target/x86_64-unknown-linux-gnu/$profile"
}

bench_load() { cut -d' ' -f1-3 /proc/loadavg; }

bench_end() { echo "$BENCH: load average at start $BENCH_LOAD0, at the end $(bench_load)"; }

time_us() {
    local t0=${EPOCHREALTIME/./} t1 rc=0
    # In the background so that errexit holds inside CMD (a command in an
    # `||` list runs with errexit off), and waited for at once.
    "$@" >/dev/null &
    wait $! || rc=$?
    t1=${EPOCHREALTIME/./}
    if ((rc)); then
        echo "$BENCH: a timed case failed (status $rc): $*" >&2
        return 70
    fi
    echo $((t1 - t0))
}

timed_pair() {
    local i=$1 fa=$3 fb=$5
    local -n _ta=$2 _tb=$4
    shift 5
    if ((i % 2 == 0)); then
        _ta+=("$(time_us "$fa" "$@")"); _tb+=("$(time_us "$fb" "$@")")
    else
        _tb+=("$(time_us "$fb" "$@")"); _ta+=("$(time_us "$fa" "$@")")
    fi
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
best() { sort -g | head -1; }
worst() { sort -g | tail -1; }

wait_all() {
    local p failed=0
    for p in "$@"; do wait "$p" || failed=$((failed + 1)); done
    if ((failed)); then
        echo "$BENCH: $failed of $# parallel cases failed" >&2
        return 70
    fi
}

ratio_report() {
    local label=$1 goal=$4 r
    local -n _ra=$2 _rb=$3
    local -a rs=()
    for ((r = 0; r < ${#_ra[@]}; r++)); do
        rs+=("$(awk -v a="${_ra[r]}" -v b="${_rb[r]}" 'BEGIN { printf "%.2f", a / b }')")
    done
    local lo mid hi verdict
    lo=$(printf '%s\n' "${rs[@]}" | best); hi=$(printf '%s\n' "${rs[@]}" | worst)
    mid=$(printf '%s\n' "${rs[@]}" | median | awk '{ printf "%.2f", $1 }')
    if [[ -z $goal ]]; then
        verdict="no goal" goal=none
    else
        verdict=$(awk -v m="$mid" -v g="$goal" 'BEGIN { split(g, p, " ");
            ok = (p[1] == "<=") ? (m <= p[2]) : (m >= p[2]); print ok ? "met" : "NOT met" }')
        goal+=x
    fi
    printf '%s: per-run ratios %s; min %.2fx median %.2fx max %.2fx (goal %s): %s\n' \
        "$label" "${rs[*]}" "$lo" "$mid" "$hi" "$goal" "$verdict"
    bench_row "$label" "$mid" "$lo" "$hi" "$goal" "$verdict"
}

bench_row() {
    [[ -n ${BENCH_TABLE:-} ]] || return 0
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$BENCH" "$1" "$2" "$3" "$4" "$5" "$6" "$BENCH_LOAD0" "$(bench_load)" \
        >>"$BENCH_TABLE"
}

# docker_labelled KIND SPEC: names of containers, volumes or networks with
# the label SPEC: KEY=VALUE exactly, or KEY with a value under $dir.
docker_labelled() {
    local kind=$1 spec=$2 name=.Name
    [[ $kind == container ]] && name=.Names
    local list=(docker "$kind" ls)
    [[ $kind == container ]] && list=(docker ps -a)
    if [[ $spec == *=* ]]; then
        "${list[@]}" --filter "label=$spec" --format "{{$name}}" 2>/dev/null || true
    else
        "${list[@]}" --filter "label=$spec" --format "{{$name}}	{{.Label \"$spec\"}}" 2>/dev/null |
            awk -F'\t' -v d="$dir/" 'index($2 "/", d) == 1 { print $1 }' || true
    fi
}

# processes_under DIR: "PID:COMMAND" of processes whose arguments name a
# path under DIR (read from /proc here, so that no searching process names
# DIR itself).
processes_under() {
    local p args
    for p in /proc/[0-9]*; do
        [[ ${p#/proc/} == "$$" || ${p#/proc/} == "$BASHPID" ]] && continue
        args=$( { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) || continue
        [[ $args == *"$1/"* ]] && echo "${p#/proc/}:${args%% *}"
    done
    return 0
}

bench_leftovers() {
    local dir=$1 spec kind left=0 found
    shift
    for spec in "$@"; do
        for kind in container volume network; do
            found=$(docker_labelled "$kind" "$spec")
            if [[ -n $found ]]; then
                echo "$BENCH: left behind, ${kind}s labelled $spec:" $found >&2
                left=1
            fi
        done
    done
    found=$(awk -v d="$dir/" 'index($2 "/", d) == 1 { print $2 }' /proc/mounts)
    if [[ -n $found ]]; then
        echo "$BENCH: left behind, mounts under $dir:" $found >&2
        left=1
    fi
    found=$(losetup -a 2>/dev/null | grep -F "$dir/" || true)
    if [[ -n $found ]]; then
        echo "$BENCH: left behind, loop devices on files under $dir:" $found >&2
        left=1
    fi
    found=$(processes_under "$dir")
    if [[ -n $found ]]; then
        echo "$BENCH: left behind, processes naming $dir:" $found >&2
        left=1
    fi
    return $left
}
