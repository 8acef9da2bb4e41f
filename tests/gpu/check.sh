#!/usr/bin/env bash
# tests/gpu/check.sh - the CUDA backend's device check (issue 6), one call on
# a machine with an NVIDIA GPU, under 8 minutes on an H200:
#   1. build (release, -Werror, sm_90 unless CUDA_ARCH says otherwise);
#   2. every op of the backend table against the CPU backend
#      (tests/test_cuda_ops: float32 bounds in the test) and one training
#      step of tiny fixture models, loss, every gradient and one AdamW step,
#      plus a greedy generation (tests/test_cuda_train);
#   3. `energon finetune --device cuda` on a small model (hidden 256, 4
#      layers, sequence 64): the first 10 losses against the CPU backend's,
#      within 1e-4 relative at every step with --precision fp32 and 2e-2
#      with bf16 (metrics.jsonl);
#   4. with 2 or more GPUs (nvidia-smi -L) and mpirun: the same small run at
#      a global batch of 512 tokens on 1 GPU, then on 2 ranks under mpirun,
#      data parallel and --tp 2 (one GPU per rank, NCCL), losses within 2e-2;
#   5. timings on a ~1B-parameter Llama shape (hidden 2048, 16 layers, 32
#      heads, 8 kv heads, MLP 5632, sequence 2048), with --precision bf16
#      (bf16 GEMM inputs, fp32 accumulation and master weights): training
#      tokens/s and model-FLOPs utilisation against a bf16 peak of 790
#      TFLOP/s, and
#      decode tokens/s with the weight bandwidth achieved at batch 1 and 32
#      against 4.3 TB/s, and a LoRA and a full fine-tune of it (20 steps,
#      batch 4 x 512, bf16): tokens/s and MFU = 6 x params x tokens/s / peak;
#   6. the 1B model's first 2 steps (1 x 256 tokens, LoRA and full) on the
#      GPU in bf16 against the CPU backend, within 2e-2 at each step;
#   7. one table at the end.
# (2 also runs test_vocab_ce: the vocab-parallel loss kernels vs float64.)
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
for t in test_cuda_ops test_cuda_train test_vocab_ce; do
    "$B/tests/$t" >"$OUTD/$t.log" 2>&1
    rc=$?
    tail -n 40 "$OUTD/$t.log"
    summary=$(grep -E "passed, [0-9]+ failed" "$OUTD/$t.log" | tail -n 1)
    if [ $rc -eq 0 ]; then row "$t" "ok: $summary"
    elif [ $rc -eq 77 ]; then fail "$t" "skipped (no GPU seen): $(tail -n 1 "$OUTD/$t.log")"
    else fail "$t" "exit $rc: $summary"; fi
done

echo "== a tokenizer, a small model (CPU/GPU loss curves) and a ~1B Llama (timings)"
DOCS=$HERE/examples/company
DATA=(--data "$DOCS/handbook.txt" --data "$DOCS/policies.txt" --data "$DOCS/products.txt")
TOK=$HERE/../shared/models/llama2-tokenizer/tokenizer.model
if [ ! -f "$TOK" ]; then # no ../shared here: a tokenizer from the example documents
    TOK=$OUTD/tok.model
    if [ ! -f "$TOK" ]; then
        "$B/energon" tokenizer train "${DATA[@]}" --vocab-size 4096 --out "$TOK" \
            >"$OUTD/tok.log" 2>&1 || { cat "$OUTD/tok.log"; exit 1; }
    fi
fi
S=$OUTD/small
if [ ! -f "$S/config.json" ]; then
    cat >"$OUTD/small.json" <<'EOF'
{"model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
 "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
 "tie_word_embeddings": false}
EOF
    "$B/energon" init --config "$OUTD/small.json" --tokenizer "$TOK" --out "$S" --seed 1 \
        >"$OUTD/init_small.log" 2>&1 || { cat "$OUTD/init_small.log"; exit 1; }
fi
M=$OUTD/llama1b
if [ ! -f "$M/config.json" ]; then
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
# cfg_field FILE KEY: a number from a (pretty-printed or one-line) config.json
cfg_field() { sed -n "s/.*\"$2\": *\([0-9.eE+-]*\).*/\1/p" "$1" | head -n 1; }
# metric RUN_DIR KEY: KEY of every line of RUN_DIR/metrics.jsonl, one a line
metric() { sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" "$1/metrics.jsonl" 2>/dev/null; }
# ft NAME SECONDS CMD...: run CMD (an energon finetune) with --out $OUTD/NAME,
# its output in $OUTD/NAME.log; the status is CMD's (124: timed out)
ft() {
    local name=$1 secs=$2
    shift 2
    rm -rf "${OUTD:?}/$name"
    timeout "$secs" "$@" --out "$OUTD/$name" >"$OUTD/$name.log" 2>&1
}
# curves_match REF RUN N TOL: prints the largest relative |loss difference|
# over the first N steps of two runs; status 0 when both have N finite
# losses and every step is within TOL
curves_match() {
    paste <(metric "$1" loss | head -n "$3") <(metric "$2" loss | head -n "$3") |
        awk -v n="$3" -v tol="$4" '
            { k++
              if ($1 !~ /^[0-9.eE+-]+$/ || $2 !~ /^[0-9.eE+-]+$/) { bad = 1; next }
              d = $1 - $2; if (d < 0) d = -d
              a = $1 < 0 ? -$1 : $1; r = d / (a > 1e-12 ? a : 1e-12)
              if (r > w) w = r
              if (r > tol) bad = 1 }
            END { printf "max rel. diff %.2e over %d steps", w, k; exit (k == n && !bad) ? 0 : 1 }'
}
# ft_row LABEL RUN REF N TOL: a table row comparing run RUN with run REF
# (names under $OUTD); on failure both curves are printed
ft_row() {
    local cmp
    if cmp=$(curves_match "$OUTD/$3" "$OUTD/$2" "$4" "$5"); then
        row "$1" "ok: $cmp (bound $5)"
    else
        fail "$1" "$cmp (bound $5); $(tail -n 2 "$OUTD/$2.log" | tr '\n' ' ')"
        echo "$3 vs $2:"
        paste <(metric "$OUTD/$3" loss | head -n "$4") <(metric "$OUTD/$2" loss | head -n "$4")
    fi
}

echo "== finetune --device cuda against the CPU backend (small model, 10 steps)"
SMALL=(finetune --model "$S" "${DATA[@]}" --seq-len 64 --batch 4 --steps 10 --lr 1e-3
       --eval-every 0 --save-every 0 --seed 1)
if ft ft_cpu 240 "$B/energon" "${SMALL[@]}" --device cpu --threads "$(nproc)"; then
    for prec in fp32 bf16; do
        tol=2e-2
        [ "$prec" = fp32 ] && tol=1e-4
        ft "ft_gpu_$prec" 120 "$B/energon" "${SMALL[@]}" --device cuda --precision "$prec"
        ft_row "finetune small: cuda $prec vs CPU" "ft_gpu_$prec" ft_cpu 10 "$tol"
    done
else
    fail "finetune small on the CPU (reference)" "$(tail -n 2 "$OUTD/ft_cpu.log" | tr '\n' ' ')"
fi

NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "== 2 GPUs under mpirun, NCCL ($NGPU GPU(s) here)"
if [ "$NGPU" -lt 2 ]; then
    row "finetune on 2 GPUs (dp2, tp2)" "skipped: $NGPU GPU"
elif ! command -v mpirun >/dev/null; then
    row "finetune on 2 GPUs (dp2, tp2)" "skipped: no mpirun"
else
    # the same global batch of 8 x 64 tokens: 1 GPU accumulates 2
    # micro-batches of 4, dp2 runs one on each rank, tp2 (dp 1) accumulates 2
    GB=("${SMALL[@]}" --batch-tokens 512 --device cuda --precision bf16)
    MPI=(mpirun --allow-run-as-root --oversubscribe -np 2)
    if ft ft_gpu1_gb 120 "$B/energon" "${GB[@]}"; then
        ft ft_dp2 180 "${MPI[@]}" "$B/energon" "${GB[@]}"
        ft_row "finetune dp2 (2 GPUs, NCCL) vs 1 GPU" ft_dp2 ft_gpu1_gb 10 2e-2
        ft ft_tp2 180 "${MPI[@]}" "$B/energon" "${GB[@]}" --tp 2
        ft_row "finetune tp2 (2 GPUs, NCCL) vs 1 GPU" ft_tp2 ft_gpu1_gb 10 2e-2
    else
        fail "finetune 1 GPU, global batch 512" "$(tail -n 2 "$OUTD/ft_gpu1_gb.log" | tr '\n' ' ')"
    fi
fi

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

echo "== fine-tuning the 1B model on the GPU (20 steps, batch 4 x 512, bf16)"
# parameters of the 1B shape (untied embeddings), for MFU = 6 N tokens/s / peak
P1B=$(awk -v V="$(cfg_field "$M/config.json" vocab_size)" -v C="$(cfg_field "$M/config.json" hidden_size)" \
          -v F="$(cfg_field "$M/config.json" intermediate_size)" -v L="$(cfg_field "$M/config.json" num_hidden_layers)" \
          -v H="$(cfg_field "$M/config.json" num_attention_heads)" -v KV="$(cfg_field "$M/config.json" num_key_value_heads)" \
          'BEGIN { D = C / H; printf "%.0f", 2 * V * C + L * (2 * C * H * D + 2 * C * KV * D + 3 * C * F + 2 * C) + C }')
BIG=(finetune --model "$M" "${DATA[@]}" --seq-len 512 --batch 4 --steps 20 --lr 1e-4
     --eval-every 0 --save-every 0 --seed 1 --device cuda --precision bf16)
for kind in lora full; do
    extra=()
    [ "$kind" = lora ] && extra=(--lora-rank 16 --lora-targets q,k,v,o,gate,up,down)
    ft "ft1b_$kind" 200 "$B/energon" "${BIG[@]}" ${extra[@]+"${extra[@]}"}
    rc=$?
    if [ $rc -eq 0 ]; then
        n=$(metric "$OUTD/ft1b_$kind" loss | grep -cE '^[0-9.eE+-]+$')
        l0=$(metric "$OUTD/ft1b_$kind" loss | head -n 1)
        l1=$(metric "$OUTD/ft1b_$kind" loss | tail -n 1)
        # steady state: the mean over steps 3.. (the first ones pay for setup)
        tps=$(metric "$OUTD/ft1b_$kind" tokens_per_s |
              awk 'NR > 2 { s += $1; k++ } END { printf "%.0f", k ? s / k : 0 }')
        mfu=$(awk -v p="$P1B" -v t="$tps" -v pk="$PEAK_TFLOPS" \
              'BEGIN { printf "%.1f", 6 * p * t / (pk * 1e12) * 100 }')
        if [ "$n" -eq 20 ]; then
            row "finetune 1B $kind: loss step 1 -> 20" "ok: $l0 -> $l1"
            row "finetune 1B $kind: tokens/s, MFU (6N)" "$tps tok/s, ${mfu}% of ${PEAK_TFLOPS} TFLOP/s (N = $P1B)"
        else
            fail "finetune 1B $kind" "$n finite losses of 20: $l0 ... $l1"
        fi
    else
        fail "finetune 1B $kind" "exit $rc: $(tail -n 2 "$OUTD/ft1b_$kind.log" | tr '\n' ' ')"
    fi
done

echo "== the 1B model's first steps on the GPU against the CPU backend (2 steps, 1 x 256)"
# the issue's check at full size, kept short: the CPU runs the same 2 steps
FIRST=(finetune --model "$M" "${DATA[@]}" --seq-len 256 --batch 1 --steps 2 --lr 1e-4
       --eval-every 0 --save-every 0 --seed 1)
for kind in lora full; do
    extra=()
    [ "$kind" = lora ] && extra=(--lora-rank 16 --lora-targets q,k,v,o,gate,up,down)
    if ft "ft1b2_cpu_$kind" 150 "$B/energon" "${FIRST[@]}" --device cpu --threads "$(nproc)" \
            ${extra[@]+"${extra[@]}"}; then
        ft "ft1b2_gpu_$kind" 90 "$B/energon" "${FIRST[@]}" --device cuda --precision bf16 \
            ${extra[@]+"${extra[@]}"}
        ft_row "finetune 1B $kind: 2 steps cuda bf16 vs CPU" "ft1b2_gpu_$kind" "ft1b2_cpu_$kind" 2 2e-2
    else
        fail "finetune 1B $kind, 2 steps on the CPU" "$(tail -n 2 "$OUTD/ft1b2_cpu_$kind.log" | tr '\n' ' ')"
    fi
done

echo
echo "== energon device check ($(head -n 1 "$OUTD/gpu.txt"), $(( $(date +%s) - t_start )) s)"
printf '%s\n' "${rows[@]}"
exit $status
