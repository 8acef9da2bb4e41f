#!/usr/bin/env bash
# tests/gpu/check.sh - the CUDA backend's device check (issue 6), one call on
# a machine with an NVIDIA GPU, under 8 minutes on an H200:
#   1. build (release, -Werror, sm_90 unless CUDA_ARCH says otherwise);
#   2. every op of the backend table against the CPU backend
#      (tests/test_cuda_ops: float32 bounds in the test) and one training
#      step of tiny fixture models, loss, every gradient and one AdamW step,
#      plus a greedy generation (tests/test_cuda_train);
#   3. timings on a ~1B-parameter Llama shape (hidden 2048, 16 layers, 32
#      heads, 8 kv heads, MLP 5632, sequence 2048), with --precision bf16
#      (bf16 GEMM inputs, fp32 accumulation and master weights): training
#      tokens/s and model-FLOPs utilisation against a bf16 peak of 790
#      TFLOP/s, and
#      decode tokens/s with the weight bandwidth achieved at batch 1 and 32
#      against 4.3 TB/s;
#   4. one table at the end.
# Usage: bash tests/gpu/check.sh [OUT_DIR]   (OUT_DIR: logs, default $OUT or /tmp)
# Exit status 0 when every correctness check passed (timings are reported,
# not judged: the issue's targets are printed next to them).
set -uo pipefail
HERE=$(cd "$(dirname "$0")/../.." && pwd)
OUTD=${1:-${OUT:-/tmp}}/gpu-check
mkdir -p "$OUTD"
B=$HERE/build-gpu
PEAK_TFLOPS=${PEAK_TFLOPS:-790}   # measured bf16 dense peak of an H200
PEAK_TBS=${PEAK_TBS:-4.3}         # measured read bandwidth of an H200
t_start=$(date +%s)
rows=()
status=0
row() { rows+=("$(printf '%-44s %s' "$1" "$2")"); }
fail() { status=1; row "$1" "FAIL $2"; }

echo "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUTD/gpu.txt" ||
    { echo "no nvidia-smi: is there a GPU?"; exit 1; }

echo "== build"
if ! { cmake -S "$HERE" -B "$B" -DCMAKE_BUILD_TYPE=Release -DENERGON_WERROR=ON \
        -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" >"$OUTD/cmake.log" 2>&1 &&
       cmake --build "$B" -j "$(nproc)" >"$OUTD/build.log" 2>&1; }; then
    tail -n 30 "$OUTD/cmake.log" "$OUTD/build.log"
    echo "build failed"
    exit 1
fi
row "build (sm_${CUDA_ARCH:-90}, -Werror)" "ok ($(( $(date +%s) - t_start )) s)"

echo "== ops and a training step against the CPU backend"
for t in test_cuda_ops test_cuda_train; do
    "$B/tests/$t" >"$OUTD/$t.log" 2>&1
    rc=$?
    tail -n 40 "$OUTD/$t.log"
    summary=$(grep -E "passed, [0-9]+ failed" "$OUTD/$t.log" | tail -n 1)
    if [ $rc -eq 0 ]; then row "$t" "ok: $summary"
    elif [ $rc -eq 77 ]; then fail "$t" "skipped (no GPU seen): $(tail -n 1 "$OUTD/$t.log")"
    else fail "$t" "exit $rc: $summary"; fi
done

echo "== a ~1B Llama (random weights) for the timings"
M=$OUTD/llama1b
if [ ! -f "$M/config.json" ]; then
    TOK=$HERE/../shared/models/llama2-tokenizer/tokenizer.model
    if [ ! -f "$TOK" ]; then # no ../shared here: a tokenizer from the example documents
        TOK=$OUTD/tok.model
        "$B/energon" tokenizer train --data "$HERE/examples/company/handbook.txt" \
            --data "$HERE/examples/company/policies.txt" --data "$HERE/examples/company/products.txt" \
            --vocab-size 4096 --out "$TOK" >"$OUTD/tok.log" 2>&1 || { cat "$OUTD/tok.log"; exit 1; }
    fi
    cat >"$OUTD/llama1b.json" <<'EOF'
{"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632,
 "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
 "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
 "tie_word_embeddings": false}
EOF
    "$B/energon" init --config "$OUTD/llama1b.json" --tokenizer "$TOK" --out "$M" --seed 1 \
        >"$OUTD/init.log" 2>&1 || { cat "$OUTD/init.log"; exit 1; }
fi

json_field() { sed -n "s/.*\"$1\":\([0-9.eE+-]*\).*/\1/p" | head -n 1; }

echo "== training step timing (batch 1 x 2048, selective recompute, bf16 GEMMs)"
if timeout 240 "$B/energon" bench train --device cuda --precision bf16 --model "$M" --batch 1 \
        --seq-len 2048 --repeats 3 --json >"$OUTD/train.json" 2>"$OUTD/train.err"; then
    tps=$(json_field tok_per_s <"$OUTD/train.json")
    gfl=$(json_field gflop_per_s <"$OUTD/train.json")
    [ -z "$tps" ] && tps=$(json_field tokens_per_s <"$OUTD/train.json")
    mfu=$(awk -v g="$gfl" -v p="$PEAK_TFLOPS" 'BEGIN { printf "%.1f", g / (p * 1000) * 100 }')
    row "train 1B, seq 2048: tokens/s" "$tps"
    row "train 1B: model TFLOP/s, MFU (target >= 40%)" "$(awk -v g="$gfl" 'BEGIN{printf "%.1f", g/1000}') TFLOP/s, ${mfu}% of ${PEAK_TFLOPS}"
else
    fail "train 1B, seq 2048" "$(tail -n 3 "$OUTD/train.err")"
fi

echo "== decode timing"
for seqs in 1 32; do
    if timeout 120 "$B/energon" bench decode --device cuda --precision bf16 --model "$M" \
            --seqs "$seqs" --prompt 128 --tokens 128 --repeats 3 --json >"$OUTD/decode$seqs.json" \
            2>"$OUTD/decode$seqs.err"; then
        tps=$(json_field tok_per_s <"$OUTD/decode$seqs.json")
        gbs=$(json_field weight_gb_per_s <"$OUTD/decode$seqs.json")
        pct=$(awk -v g="$gbs" -v p="$PEAK_TBS" 'BEGIN { printf "%.1f", g / (p * 1000) * 100 }')
        row "decode batch $seqs: tokens/s" "$tps"
        row "decode batch $seqs: weights GB/s (target b1 >= 60%)" "$gbs GB/s, ${pct}% of ${PEAK_TBS} TB/s"
    else
        fail "decode batch $seqs" "$(tail -n 3 "$OUTD/decode$seqs.err")"
    fi
done

echo
echo "== energon device check ($(head -n 1 "$OUTD/gpu.txt"), $(( $(date +%s) - t_start )) s)"
printf '%s\n' "${rows[@]}"
exit $status
