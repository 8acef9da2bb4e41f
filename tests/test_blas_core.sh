#!/usr/bin/env bash
# test_blas_core.sh ENERGON [FIXTURES SHARED]
# energon runs OpenBLAS kernels that the CPU supports, not the library's
# fallback for a CPU it does not know (common/blas_core.c). The reference is
# the kernel's flags in /proc/cpuinfo: where they have avx2 and fma, the
# kernel set named by `energon version` must be one of OpenBLAS's AVX2 sets;
# a set chosen by the user with OPENBLAS_CORETYPE is left alone; running the
# program again keeps its arguments and exit code.
set -u
ENERGON=$1
pass=0
fail=0
ok() { printf '  ok %s\n' "$1"; pass=$((pass + 1)); }
bad() { printf 'FAIL %s\n' "$1"; fail=$((fail + 1)); }

core_of() { sed -n 's/^BLAS: [^,]*, \([A-Za-z0-9_]*\) kernels.*/\1/p'; }

out=$(env -u OPENBLAS_CORETYPE "$ENERGON" version 2>&1)
core=$(printf '%s\n' "$out" | core_of)
[ -n "$core" ] || { echo "FAIL: no 'BLAS: ... kernels' line in energon version:"; echo "$out"; exit 1; }
echo "  energon version: $(printf '%s\n' "$out" | grep '^BLAS:')"

flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { printf '%s\n' "$flags" | grep -qw "$1"; }
case $(uname -m) in
x86_64)
    if has avx2 && has fma; then
        case $core in
        Haswell | Zen | SkylakeX | Cooperlake | SapphireRapids | Excavator | AlderLake)
            ok "CPU has avx2+fma, OpenBLAS runs $core kernels" ;;
        *) bad "CPU has avx2+fma but OpenBLAS runs $core kernels" ;;
        esac
        if has avx512f && has avx512bw && has avx512vl && has avx512dq && has avx512cd &&
            printf '%s\n' "$out" | grep -q 'set by energon'; then
            [ "$core" = SkylakeX ] && ok "corrected to SkylakeX on an AVX-512 CPU" ||
                bad "corrected to $core on an AVX-512 CPU (want SkylakeX)"
        fi
    else
        echo "  (CPU without avx2+fma: only the checks below apply)"
    fi ;;
*) echo "  ($(uname -m): only the checks below apply)" ;;
esac

# The user's choice stays, and nothing claims energon set it.
out=$(OPENBLAS_CORETYPE=Prescott "$ENERGON" version 2>&1)
c=$(printf '%s\n' "$out" | core_of)
if [ "$(uname -m)" != x86_64 ]; then
    :
elif [ "$c" = Prescott ] && printf '%s\n' "$out" | grep -q 'OPENBLAS_CORETYPE=Prescott'; then
    ok "OPENBLAS_CORETYPE=Prescott is kept"
else
    bad "OPENBLAS_CORETYPE=Prescott gave: $(printf '%s\n' "$out" | grep '^BLAS:')"
fi

# Arguments (spaces included) and the exit code survive the second start.
E=${TMPDIR:-/tmp}/en_bc.$$
env -u OPENBLAS_CORETYPE "$ENERGON" no-such-command >/dev/null 2>"$E"
rc=$?
if [ $rc -eq 2 ] && grep -qF "unknown command 'no-such-command'" "$E"; then
    ok "unknown command: exit 2 and its name, after the second start"
else
    bad "unknown command: exit $rc, stderr: $(head -c 200 "$E")"
fi
env -u OPENBLAS_CORETYPE "$ENERGON" tokenizer encode --model "/nonexistent dir/t.model" \
    --text 'a b' >/dev/null 2>"$E"
rc=$?
if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -qF "/nonexistent dir/t.model" "$E"; then
    ok "an argument with a space reaches the subcommand whole (exit $rc)"
else
    bad "tokenizer encode on a missing model: exit $rc, stderr: $(head -c 200 "$E")"
fi
rm -f "$E"

echo "test_blas_core: $pass passed, $fail failed"
[ $fail -eq 0 ]
