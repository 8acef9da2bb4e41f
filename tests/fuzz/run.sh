#!/usr/bin/env bash
# tests/fuzz/run.sh - build every libFuzzer target in tests/fuzz/ with clang
# (-fsanitize=fuzzer,address,undefined) and run each for a bounded time.
#
#   tests/fuzz/run.sh [SECONDS] [TARGET...]     (default 20 s, every target)
#
# A target is tests/fuzz/fuzz_NAME.c. It names what it links in two comment
# lines, paths relative to the repository root:
#   // fuzz-sources: tokenizer/jinja.c common/status.c ...
#   // fuzz-libs: -ljansson -lonig
#   // fuzz-cflags: -fopenmp     (optional: more flags for its C sources;
#                                  @ROOT@ stands for the repository root)
# A source ending in .cpp (tokenizer/tokenizer_spm.cpp) is compiled apart with
# clang++ (C++17, the same sanitizers) and linked in with libstdc++.
# Its seed corpus is tests/fuzz/corpus/NAME/ (valid inputs made by the tests'
# own generators, plus every finding once fixed, as a regression file); each
# seed is run first, then libFuzzer mutates for SECONDS. New inputs go to a
# temporary folder, never into the repository. Any crash, leak, sanitizer
# report or timeout fails the run and leaves the input in $FUZZ_OUT (default:
# a temporary folder, printed).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SECONDS_EACH=${1:-${FUZZ_SECONDS:-20}}
shift || true
CC=${FUZZ_CC:-clang}
CXX=${FUZZ_CXX:-clang++}
if ! command -v "$CC" >/dev/null; then
    echo "fuzz: $CC not found (scripts/install-deps installs clang and libclang-rt-14-dev)" >&2
    exit 1
fi
OUT=${FUZZ_OUT:-}
KEEP=${FUZZ_OUT:+1}
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/energon-fuzz.XXXXXX)
mkdir -p "$OUT"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for f in "$ROOT"/tests/fuzz/fuzz_*.c; do
        [ -e "$f" ] || continue
        n=$(basename "$f" .c); targets+=("${n#fuzz_}")
    done
fi
if [ ${#targets[@]} -eq 0 ]; then
    echo "fuzz: no targets in tests/fuzz/" >&2
    exit 1
fi
fail=0
for t in "${targets[@]}"; do
    src="$ROOT/tests/fuzz/fuzz_$t.c"
    [ -f "$src" ] || { echo "fuzz: no target $src" >&2; exit 1; }
    srcs=$(sed -n 's|^// fuzz-sources:||p' "$src")
    libs=$(sed -n 's|^// fuzz-libs:||p' "$src")
    xflags=$(sed -n 's|^// fuzz-cflags:||p' "$src")
    xflags=${xflags//@ROOT@/$ROOT}
    cflags=$(pkg-config --cflags jansson oniguruma libutf8proc 2>/dev/null || true)
    bin="$OUT/fuzz_$t"
    abs=()
    cxx=()
    for s in $srcs; do
        case "$s" in
        *.cpp) cxx+=("$ROOT/$s") ;;
        *) abs+=("$ROOT/$s") ;;
        esac
    done
    echo "fuzz: building $t"
    for s in ${cxx[@]+"${cxx[@]}"}; do
        o="$OUT/fuzz_$t-$(basename "$s" .cpp).o"
        "$CXX" -std=c++17 -O1 -g -D_GNU_SOURCE -DEN_FUZZING=1 -I"$ROOT" \
            $(pkg-config --cflags sentencepiece 2>/dev/null || true) \
            -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined \
            -c -o "$o" "$s"
        abs+=("$o")
    done
    [ ${#cxx[@]} -eq 0 ] || libs="$libs -lstdc++ -fsanitize-link-c++-runtime"
    # -O1 -g: libFuzzer's recommended flags; _GNU_SOURCE as the main build.
    "$CC" -std=c11 -O1 -g -D_GNU_SOURCE -DEN_FUZZING=1 -I"$ROOT" $cflags $xflags \
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
        -o "$bin" "$src" "${abs[@]}" $libs -lm
    work="$OUT/corpus_$t"; mkdir -p "$work"
    seeds=()
    [ -d "$ROOT/tests/fuzz/corpus/$t" ] && seeds+=("$ROOT/tests/fuzz/corpus/$t")
    echo "fuzz: running $t for ${SECONDS_EACH}s (seeds: ${seeds[*]:-none})"
    if ! ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
         UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
         "$bin" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
                -max_len=65536 -artifact_prefix="$OUT/${t}-" -print_final_stats=1 \
                "$work" "${seeds[@]}" >"$OUT/$t.log" 2>&1; then
        echo "fuzz: $t FAILED; log $OUT/$t.log, inputs $OUT/${t}-*" >&2
        tail -n 60 "$OUT/$t.log" >&2
        fail=1
    else
        grep -E "^stat::number_of_executed_units|^Done" "$OUT/$t.log" | tr '\n' ' '; echo
    fi
done
if [ $fail -eq 0 ]; then
    echo "fuzz: all targets clean"
    [ -n "$KEEP" ] || rm -rf "$OUT" # nothing to look at; findings are kept
fi
exit $fail
