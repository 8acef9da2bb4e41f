#!/usr/bin/env bash
# bench/dtype.sh [ENERGON] [THREADS] [ROUNDS]
# Weights held at 16 bits against float32, side by side in one run: a
# random-weight s110m-shaped llama (hidden 768, 12 layers, 12 heads, FFN
# 2048, Llama 2 vocabulary 32000) written as a BF16 checkpoint by
# `energon init --dtype bf16`, loaded with --dtype f32 and --dtype bf16
# (the same values: bf16 widens exactly), and timed with `energon bench
# decode` (64 tokens after a 16-token prompt, median of 5 repeats), rounds
# alternating. Prints each round's resident memory after loading and decode
# tokens/s, and the bf16 / f32 ratios.
set -euo pipefail
ENERGON=${1:-build/energon}
THREADS=${2:-2}
ROUNDS=${3:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
TOK=${EN_LLAMA2_TOKENIZER:-$HERE/../../shared/models/llama2-tokenizer/tokenizer.model}
T=$(mktemp -d /tmp/en_dtype_XXXXXX)
trap 'rm -rf "$T"' EXIT
cat >"$T/config.json" <<'JSON'
{"model_type": "llama", "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
 "num_attention_heads": 12, "num_key_value_heads": 12, "max_position_embeddings": 1024,
 "rms_norm_eps": 1e-5, "tie_word_embeddings": false}
JSON
"$ENERGON" init --config "$T/config.json" --tokenizer "$TOK" --out "$T/m" --dtype bf16 >/dev/null 2>&1
printf '%-6s %-6s %18s %12s\n' round dtype "RSS after load MB" "decode tok/s"
for r in $(seq 1 "$ROUNDS"); do
    for d in f32 bf16; do
        line=$("$ENERGON" bench decode --model "$T/m" --dtype "$d" --threads "$THREADS" --tokens 64 \
               --repeats 5 --json 2>/dev/null)
        rss=$(echo "$line" | sed -E 's/.*"rss_after_load_mb":([0-9.]+).*/\1/')
        tps=$(echo "$line" | sed -E 's/.*"tok_per_s":([0-9.]+).*/\1/')
        printf '%-6s %-6s %18s %12s\n' "$r" "$d" "$rss" "$tps"
        echo "$r $d $rss $tps" >>"$T/rows"
    done
done
awk '{ if ($2 == "f32") { r[$1] = $3; t[$1] = $4 } else printf "round %s: bf16/f32 resident %.3f, decode %.2fx\n", $1, $3 / r[$1], $4 / t[$1] }' "$T/rows"
