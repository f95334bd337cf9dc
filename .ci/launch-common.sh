# Sourced by .ci/launchers.sh and .ci/slurm.sh: a private work folder, the task wrapper, and
# `run`, which launches the README's one-command form under a launcher and checks it. Expects
# TBON (absolute path to the binary) and GUARD_S (hang guard, seconds) to be set.

work="$(mktemp -d)" # mode 0700: the URI file's directory must not be writable by others
launcher_pgid=""
cleanup() {
    if [[ -n "$launcher_pgid" ]]; then
        kill -KILL -- "-$launcher_pgid" 2>/dev/null || true
    fi
    # Daemons that escaped the launcher's process group (none expected).
    for f in "$work"/pid.*; do
        [[ -e "$f" ]] && kill -KILL "$(cat "$f")" 2>/dev/null || true
    done
    rm -rf "$work"
    if declare -F extra_cleanup >/dev/null; then
        extra_cleanup
    fi
}
trap cleanup EXIT

# Each task runs this: it records the daemon's pid (to signal it), exit code and output.
cat >"$work/task.sh" <<'EOF'
#!/bin/sh
r="${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${SLURM_PROCID:-x}}}"
if [ -n "${PMIX_ONLY:-}" ]; then
    # Only what PMIx gives: the rank in PMIX_RANK, the size in TBON_SIZE.
    unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE
fi
"$TBON" daemon "$@" >"$W/out.$r" 2>"$W/err.$r" &
pid=$!
echo "$pid" >"$W/pid.$r"
wait "$pid"
rc=$?
echo "$rc" >"$W/rc.$r"
exit "$rc"
EOF
chmod +x "$work/task.sh"

fail() {
    echo "== $LABEL: FAIL: $*" >&2
    for f in "$work"/launcher.out "$work"/err.*; do
        [[ -s "$f" ]] || continue
        echo "--- $f (last lines)" >&2
        tail -n 8 "$f" >&2
    done
    exit 1
}

# Seconds since $1 (an $EPOCHREALTIME), to 0.1 s.
elapsed() {
    awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'
}

# Counts the ranks whose stdout holds the complete self-test line.
count_ok() {
    local n=$1 c=0 r
    for ((r = 0; r < n; r++)); do
        grep -q "rank $r: all-to-all ok ($((n - 1)) of $((n - 1)))" "$work/out.$r" 2>/dev/null && c=$((c + 1))
    done
    echo "$c"
}

# Waits (hang guard only) for the launcher process to end; sets launcher_rc to its exit code
# (not in a subshell: only this shell can wait for its child).
launcher_rc=""
wait_launcher() {
    local pid=$1 i
    launcher_rc="timeout"
    for ((i = 0; i < GUARD_S * 10; i++)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            launcher_rc=0
            wait "$pid" || launcher_rc=$?
            return
        fi
        sleep 0.1
    done
}

# run NAME N [KILL_RANK] -- LAUNCHER ARGS...: launches N daemons with the README's one-command
# form, checks the self-test, optionally SIGKILLs one daemon and waits for the repair, then
# SIGTERMs rank 0 and checks every (surviving) daemon's exit.
run() {
    local name=$1 n=$2 victim=$3
    shift 4
    rm -f "$work"/out.* "$work"/err.* "$work"/rc.* "$work"/pid.* "$work/hnp.uri" "$work/job.key"
    "$TBON" keygen "$work/job.key" >/dev/null
    local start=$EPOCHREALTIME
    W="$work" TBON="$TBON" setsid "$@" "$work/task.sh" \
        --key-file "$work/job.key" --uri-file "$work/hnp.uri" --hnp-file "$work/hnp.uri" \
        --if-include 127.0.0.1/32 --ping-all --print-faults >"$work/launcher.out" 2>&1 &
    local lpid=$!
    launcher_pgid=$lpid
    local i ok=0
    for ((i = 0; i < GUARD_S * 10; i++)); do
        ok=$(count_ok "$n")
        [[ "$ok" == "$n" ]] && break
        kill -0 "$lpid" 2>/dev/null || fail "$name: the launcher exited before every daemon's self-test ($ok of $n)"
        sleep 0.1
    done
    [[ "$ok" == "$n" ]] || fail "$name: only $ok of $n daemons printed 'all-to-all ok' within ${GUARD_S}s"
    local wired
    wired=$(elapsed "$start")
    local survivors=$n
    if [[ "$victim" != "-" ]]; then
        kill -KILL "$(cat "$work/pid.$victim")"
        survivors=$((n - 1))
        # Every survivor reports the repair that took the victim out (--print-faults).
        for ((i = 0; i < GUARD_S * 10; i++)); do
            local seen=0 r
            for ((r = 0; r < n; r++)); do
                [[ "$r" == "$victim" ]] && continue
                grep -q "\"newly_failed\":\[$victim\]" "$work/out.$r" 2>/dev/null && seen=$((seen + 1))
            done
            [[ "$seen" == "$survivors" ]] && break
            kill -0 "$lpid" 2>/dev/null || fail "$name: the launcher ended the job after rank $victim was killed"
            sleep 0.1
        done
        [[ "$seen" == "$survivors" ]] || fail "$name: only $seen of $survivors survivors reported rank $victim failed"
    fi
    [[ -s "$work/hnp.uri" ]] || fail "$name: rank 0's URI file is missing while it runs"
    kill -TERM "$(cat "$work/pid.0")"
    wait_launcher "$lpid"
    local rc=$launcher_rc
    launcher_pgid=""
    [[ "$rc" == "timeout" ]] && fail "$name: the DVM did not stop within ${GUARD_S}s of SIGTERM to rank 0"
    local r
    for ((r = 0; r < n; r++)); do
        [[ "$r" == "$victim" ]] && continue
        [[ -s "$work/rc.$r" ]] || fail "$name: rank $r recorded no exit code"
        [[ "$(cat "$work/rc.$r")" == 0 ]] || fail "$name: rank $r exited $(cat "$work/rc.$r")"
        grep -q "rank $r: stopped$" "$work/err.$r" || fail "$name: rank $r did not log a clean stop"
        if [[ "$victim" == "-" ]] && grep -E "probing| WARN | ERROR " "$work/err.$r" >&2; then
            fail "$name: rank $r logged the alarms above in an orderly run"
        fi
    done
    if [[ "$victim" == "-" ]]; then
        [[ "$rc" == 0 ]] || fail "$name: the launcher exited $rc"
    fi
    [[ ! -e "$work/hnp.uri" ]] || fail "$name: rank 0 left its URI file behind"
    local total
    total=$(elapsed "$start")
    echo "== $LABEL: ok: $name: $n daemons self-tested ${wired} s after the launch; SIGTERM to rank 0: $survivors exited 0 (launcher exit $rc); ${total} s in all"
}

