#!/usr/bin/env bash
# bench/matmul_w16.sh [BUILD_DIR] [THREADS] [REPEATS] [M N K ...]: float32
# en_op_matmul beside bf16 and f16 en_op_matmul_w16 on the CPU backend, in
# one run: median time, GB/s of weights and GFLOP/s per shape, and the
# 16-bit speedups over float32 (bench/matmul_w16.c; built with the project
# as bench_matmul_w16). Defaults: build, 2 threads, 21 repeats, the
# program's list of decode (M = 1, 4, 8, 16) and prefill (M = 128) shapes.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
THREADS=${2:-2}
REPEATS=${3:-21}
shift $(($# < 3 ? $# : 3))
BIN="$BUILD/bench_matmul_w16"
[ -x "$BIN" ] || { echo "bench/matmul_w16.sh: $BIN not built (cmake --build $BUILD)" >&2; exit 1; }
# One OpenMP team for our loops and OpenBLAS (the OpenMP build).
OMP_NUM_THREADS=$THREADS exec "$BIN" "$THREADS" "$REPEATS" "$@"
