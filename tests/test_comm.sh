#!/usr/bin/env bash
# test_comm.sh MPIEXEC TEST_COMM TEST_COMM_ALT
# The communicator under a real launcher: test_comm's checks under
# mpirun -np 1, 2 and 4 (and once without mpirun), then the ways a job can go
# wrong, each of which must end the job with a clear message, not a hang:
#   timeout   one rank sleeps past a 2 s collective timeout: the watchdog of
#             the waiting rank aborts the job;
#   die       one rank exits before a collective: the job ends;
#   bad-tp    tp = 3 at np = 4: creation fails on every rank with the numbers;
#   build-id  an MPMD launch of two builds (test_comm_alt differs only in a
#             compile definition): creation fails on every rank, naming rank 1.
# Prints the wall time of every run.
set -u
MPIEXEC=$1
PROG=$2
ALT=$3
T=$(mktemp -d /tmp/en_comm_XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0

# Open MPI refuses root without a flag and more ranks than cores without
# another; the test machine has 2 cores and runs as root.
MPIRUN=("$MPIEXEC")
if "$MPIEXEC" --version 2>&1 | grep -qE "Open MPI|OpenRTE"; then
    MPIRUN+=(--oversubscribe)
    [ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
fi

# run NAME LIMIT_S cmd...: runs cmd under a hard time limit; sets rc and secs.
run() {
    local name=$1 limit=$2
    shift 2
    local t0=$EPOCHREALTIME
    timeout -k 5 "$limit" "$@" >"$T/$name.log" 2>&1 </dev/null
    rc=$?
    secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
}
ok() {
    printf '  ok %-9s %5s s  %s\n' "$1" "$secs" "$(echo "$2" | cut -c1-120)"
    pass=$((pass + 1))
}
bad() {
    echo "FAIL $1 (exit $rc, ${secs} s): $2"
    sed 's/^/  | /' "$T/$1.log" | tail -n 25
    fail=$((fail + 1))
}

run single 120 "$PROG"
if [ "$rc" -eq 0 ]; then ok single "$(tail -n 1 "$T/single.log")"; else bad single "checks failed"; fi

for np in 1 2 4; do
    run "np$np" 400 "${MPIRUN[@]}" -np "$np" "$PROG" mpi "$np"
    if [ "$rc" -eq 0 ]; then
        ok "np$np" "$(grep -c 'passed, 0 failed' "$T/np$np.log") ranks passed"
    else
        bad "np$np" "checks failed"
    fi
done

run bad-tp 60 "${MPIRUN[@]}" -np 4 "$PROG" bad-tp 3
want="world size 4 is not a multiple of the tensor-parallel size tp = 3"
if [ "$rc" -eq 0 ] && [ "$(grep -cF "$want" "$T/bad-tp.log")" -eq 4 ]; then
    ok bad-tp "$(grep -m 1 'world size' "$T/bad-tp.log" | sed 's/.*: the world/the world/')"
else
    bad bad-tp "want tp = 3 at np = 4 to fail on all 4 ranks, and a clean exit"
fi

run timeout 60 "${MPIRUN[@]}" -np 2 "$PROG" timeout
want="energon: rank 0: collective allreduce_sum on the world group did not complete within 2 s"
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -qF "$want" "$T/timeout.log" &&
    awk -v s="$secs" 'BEGIN { exit !(s < 10) }'; then
    ok timeout "$(grep -F "$want" "$T/timeout.log" | head -n 1)"
else
    bad timeout "want a non-zero exit within 10 s and '$want'"
fi

run die 60 "${MPIRUN[@]}" -np 2 "$PROG" die
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "rank 1 dies now" "$T/die.log" &&
    ! grep -q "survived" "$T/die.log" &&
    awk -v s="$secs" 'BEGIN { exit !(s < 15) }'; then
    ok die "job ended (exit $rc)"
else
    bad die "want the job to end with a non-zero exit within 15 s"
fi

run build-id 60 "${MPIRUN[@]}" -np 1 "$PROG" build-id : -np 1 "$ALT" build-id
if [ "$rc" -eq 0 ] && [ "$(grep -c 'different builds' "$T/build-id.log")" -eq 2 ]; then
    ok build-id "$(grep -m 1 'different builds' "$T/build-id.log" | sed 's/.*: the ranks/the ranks/')"
else
    bad build-id "want creation to fail on both ranks with 'different builds'"
fi

echo "test_comm.sh: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
