#!/usr/bin/env bash
# bench/adapters_serve.sh [--threads 2] [--concurrency 32] [--requests 96] [--repeats 3]
#                         [--targets q,k,v,o]  (the adapters' --lora-targets; finetune's default)
#
# Served throughput with many LoRA adapters mixed in one batch against the
# base alone, on one server in one run (issue 14): a random model of
# stories15M's shape (energon init, Llama 2 tokenizer from ../shared), three
# rank-8 adapters fine-tuned by `energon finetune` on three different texts
# of examples/company (a few steps each: the weights only have to differ),
# one `energon serve` with --adapter a1=... a2=... a3=..., and `energon bench
# serve` at the same concurrency with --model BASE, then with --model
# a1,a2,a3,BASE (request i asks for the (i mod 4)-th), then with --model a1
# (one adapter on every request: the low-rank work without the mixing).
# Repeated, alternating; prints the medians and their ratios to the base's
# (the issue asks for >= 0.8 mixed).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
ENERGON=${ENERGON:-$ROOT/build/energon}
SHARED=${EN_SHARED:-$(dirname "$ROOT")/shared}
THREADS=2 CONC=32 REQS=96 REPEATS=3 TARGETS=q,k,v,o
while [ $# -gt 0 ]; do
    case $1 in
    --threads) THREADS=$2; shift 2 ;;
    --concurrency) CONC=$2; shift 2 ;;
    --requests) REQS=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --targets) TARGETS=$2; shift 2 ;;
    *) echo "adapters_serve.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
log() { echo "adapters_serve: $*" >&2; }
[ -x "$ENERGON" ] || { log "no energon at $ENERGON (make build)"; exit 1; }
TOK=${EN_LLAMA2_TOKENIZER:-$SHARED/models/llama2-tokenizer/tokenizer.model}
[ -f "$TOK" ] || { log "no Llama 2 tokenizer at $TOK"; exit 1; }
W=$(mktemp -d /tmp/en_adapters_bench_XXXXXX)
SPID=
cleanup() { [ -n "$SPID" ] && kill "$SPID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT

cat >"$W/s15m.json" <<JSON
{"model_type": "llama", "hidden_size": 288, "intermediate_size": 768, "num_hidden_layers": 6,
 "num_attention_heads": 6, "num_key_value_heads": 6, "max_position_embeddings": 1024,
 "rms_norm_eps": 1e-5, "tie_word_embeddings": false}
JSON
"$ENERGON" init --config "$W/s15m.json" --tokenizer "$TOK" --out "$W/base" --seed 1 >/dev/null
i=0
for text in handbook policies products; do
    i=$((i + 1))
    log "fine-tuning adapter a$i on examples/company/$text.txt"
    "$ENERGON" finetune --model "$W/base" --data "$ROOT/examples/company/$text.txt" \
        --out "$W/a$i" --lora-rank 8 --lora-targets "$TARGETS" --steps 4 \
        --seq-len 128 --batch 2 --lr 1e-2 --threads "$THREADS" >"$W/ft$i.log" 2>&1 ||
        { tail -5 "$W/ft$i.log"; exit 1; }
done
"$ENERGON" serve --model "$W/base" --model-name base --port 0 --threads "$THREADS" --quiet \
    --max-batch "$CONC" --ctx 512 --adapter "a1=$W/a1" --adapter "a2=$W/a2" \
    --adapter "a3=$W/a3" >"$W/serve.log" 2>&1 &
SPID=$!
URL=
for _ in $(seq 1 600); do
    URL=$(grep -o 'listening on http://[^ ]*' "$W/serve.log" | head -1 | sed 's/listening on //' || true)
    [ -n "$URL" ] && break
    sleep 0.1
done
[ -n "$URL" ] || { cat "$W/serve.log"; exit 1; }
run() { # models -> output tokens/s
    "$ENERGON" bench serve --url "$URL" --model "$1" --concurrency "$CONC" --requests "$REQS" \
        --prompt-tokens 64 --max-tokens 64 --json 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["output_throughput"])'
}
base=() mixed=() one=()
for r in $(seq 1 "$REPEATS"); do
    base+=("$(run base)")
    mixed+=("$(run a1,a2,a3,base)")
    one+=("$(run a1)")
    log "repeat $r: base ${base[-1]} tok/s, 3 adapters + base ${mixed[-1]}, a1 alone ${one[-1]}"
done
python3 - "${base[*]}" "${mixed[*]}" "${one[*]}" "$CONC" <<'PY'
import statistics, sys
b, m, o = ([float(x) for x in a.split()] for a in sys.argv[1:4])
mb, mm, mo = statistics.median(b), statistics.median(m), statistics.median(o)
print(f"| concurrency {sys.argv[4]} | output tokens/s (median of {len(b)}) | vs base |")
print("| --- | --- | --- |")
print(f"| base alone | {mb:.1f} | 1.00 |")
print(f"| a1, a2, a3 and base mixed | {mm:.1f} | {mm / mb:.2f} |")
print(f"| a1 alone (every request) | {mo:.1f} | {mo / mb:.2f} |")
PY
