#!/usr/bin/env bash
# bench/train_vs_torch.sh [ENERGON] [THREADS]
# CPU training throughput, energon against PyTorch (+ PEFT for LoRA), side
# by side in one run. Two random-weight Llama-shaped models are written by
# `energon init` into a temp dir:
#   s15m   stories15M's shape: hidden 288, 6 layers, 6 heads, FFN 768
#   s110m  hidden 768, 12 layers, 12 heads, FFN 2048
# both with the Llama 2 vocabulary (32000), untied lm_head. For each shape,
# full fine-tuning and LoRA (rank 8, alpha 16, on all seven projections,
# as `energon bench train --lora-rank` adapts them), batch 4 x 256, THREADS
# threads on both sides, float32: `energon bench train` (forward, backward,
# AdamW; two warm-up steps, median of STEPS timed steps) and
# bench/torch_train_bench.py (transformers' LlamaForCausalLM from the same
# config.json + model.safetensors, AdamW, no checkpointing, timed the same).
# energon runs with --recompute none, PyTorch's choice (it keeps every
# activation); EN_RECOMPUTE="none selective" adds rows for energon's default.
# EN_BASE=path/to/another/energon adds its tokens/s and ratio (a build from
# before a change, timed in the same run).
#
# Model GFLOP/s = F * N * tokens/s, N the matmul weights (every layer's
# q,k,v,o,gate,up,down plus the lm_head; not the embedding lookup), F = 6
# for full fine-tuning (forward 2N, input and weight gradients 4N), F = 4
# for LoRA (no base weight gradients; the rank-8 adapters are ignored).
# Attention's T*T work is left out of both. The same formula on both sides,
# so the ratio is the tokens/s ratio.
set -euo pipefail
ENERGON=${1:-build/energon}
THREADS=${2:-2}
PY=${PYTHON:-python3}
RECOMPUTE=${EN_RECOMPUTE:-none}
STEPS_S15M=${EN_STEPS_S15M:-5}
STEPS_S110M=${EN_STEPS_S110M:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
TOK=${EN_LLAMA2_TOKENIZER:-$HERE/../../shared/models/llama2-tokenizer/tokenizer.model}
T=$(mktemp -d /tmp/en_train_vs_torch_XXXXXX)
trap 'rm -rf "$T"' EXIT

shape() { # name hidden ffn layers heads
    cat >"$T/$1.json" <<JSON
{"model_type": "llama", "hidden_size": $2, "intermediate_size": $3, "num_hidden_layers": $4,
 "num_attention_heads": $5, "num_key_value_heads": $5, "max_position_embeddings": 1024,
 "rms_norm_eps": 1e-5, "tie_word_embeddings": false}
JSON
    "$ENERGON" init --config "$T/$1.json" --tokenizer "$TOK" --out "$T/$1" --seed 1 >/dev/null 2>&1
}
# N of the formula above, from the written config.json
matmul_n() {
    "$PY" -c 'import json,sys; c=json.load(open(sys.argv[1]))
C,F,L,V=c["hidden_size"],c["intermediate_size"],c["num_hidden_layers"],c["vocab_size"]
D=c.get("head_dim",C//c["num_attention_heads"])
Q=c["num_attention_heads"]*D; K=c["num_key_value_heads"]*D
print(L*(C*Q+2*C*K+Q*C+3*C*F)+V*C)' "$T/$1/config.json"
}
tps() { sed -E 's/.*"tok_per_s": ?([0-9.]+).*/\1/'; }
BASE=${EN_BASE:-}
en_train() { # binary model recompute lora-args...
    local e=$1 m=$2 rc=$3
    shift 3
    "$e" bench train --model "$T/$m" --batch 4 --seq-len 256 --threads "$THREADS" \
        --repeats "$steps" --recompute "$rc" "$@" --json 2>/dev/null | tps
}

shape s15m 288 768 6 6
shape s110m 768 2048 12 12
TV=$("$PY" -c 'import torch; print(torch.__version__)')
echo "energon: $ENERGON${BASE:+ (before: $BASE)}; torch $TV; $THREADS threads; batch 4 x 256"
printf '%-6s %-5s %-10s %12s %12s %10s %10s %7s' shape mode recompute "energon t/s" "torch t/s" \
    "en GF/s" "torch GF/s" ratio
[ -n "$BASE" ] && printf ' %12s %7s' "before t/s" ratio
echo
for m in s15m s110m; do
    steps=$STEPS_S15M
    [ "$m" = s110m ] && steps=$STEPS_S110M
    n=$(matmul_n "$m")
    for mode in full lora; do
        lr=()
        f=6
        if [ "$mode" = lora ]; then
            lr=(--lora-rank 8)
            f=4
        fi
        pt=$("$PY" "$HERE/torch_train_bench.py" --model "$T/$m" --batch 4 --seq-len 256 \
            --threads "$THREADS" --steps "$steps" "${lr[@]}" 2>/dev/null | tail -1 | tps)
        for rc in $RECOMPUTE; do
            et=$(en_train "$ENERGON" "$m" "$rc" "${lr[@]}")
            awk -v m="$m" -v mode="$mode" -v rc="$rc" -v e="$et" -v p="$pt" -v n="$n" -v f="$f" \
                'BEGIN { printf "%-6s %-5s %-10s %12.1f %12.1f %10.2f %10.2f %6.2fx",
                         m, mode, rc, e, p, f * n * e / 1e9, f * n * p / 1e9, e / p }'
            if [ -n "$BASE" ]; then
                bt=$(en_train "$BASE" "$m" "$rc" "${lr[@]}")
                awk -v b="$bt" -v p="$pt" 'BEGIN { printf " %12.1f %6.2fx", b, b / p }'
            fi
            echo
        done
    done
done
