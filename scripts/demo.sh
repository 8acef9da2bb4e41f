#!/usr/bin/env bash
# The energon demo, start to finish on the bundled example company
# (examples/company, the fictional Quillon Robotics):
#   1. train a SentencePiece tokenizer on the company documents;
#   2. make a small Llama-shaped model from scratch (`energon init`) and
#      pretrain it on the documents (full fine-tuning from random weights);
#   3. fine-tune it with LoRA on the company's question/answer pairs;
#   4. ask questions whose answers are only in the company documents, with
#      and without the adapter, next to the expected answers.
#   5. serve the merged model with `energon serve` and ask the same questions
#      through `energon chat` over the OpenAI-compatible API.
# Takes about four minutes on 2 cores. Outputs go to demo-out/.
set -euo pipefail
ENERGON=${1:-build/energon}
HERE=$(cd "$(dirname "$0")/.." && pwd)
X=$HERE/examples/company
OUT=$HERE/demo-out
THREADS=${ENERGON_THREADS:-$(nproc)}
rm -rf "$OUT"
mkdir -p "$OUT"
t0=$(date +%s)
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "1/5 tokenizer: SentencePiece BPE, 1024 pieces, on the company documents"
"$ENERGON" tokenizer train --data "$X/handbook.txt" --data "$X/policies.txt" --data "$X/products.txt" \
    --vocab-size 1024 --out "$OUT/tok.model"

say "2/5 base model: a 0.9M-parameter Llama from scratch, pretrained on the documents (300 steps)"
"$ENERGON" init --config "$X/base_model.json" --tokenizer "$OUT/tok.model" --out "$OUT/init" --seed 1
"$ENERGON" finetune --model "$OUT/init" \
    --data "$X/handbook.txt" --data "$X/policies.txt" --data "$X/products.txt" --doc-sep blank \
    --seq-len 128 --batch 8 --steps 300 --lr 3e-3 --warmup 10 \
    --val-fraction 0.05 --eval-every 100 --save-every 100 --threads "$THREADS" --out "$OUT/pretrain"

say "3/5 LoRA fine-tuning on $(wc -l <"$X/qa.jsonl") question/answer pairs (rank 64, every linear layer, base frozen)"
"$ENERGON" finetune --model "$OUT/pretrain/model" --data "$X/qa.jsonl" \
    --seq-len 64 --batch 8 --epochs 20 --lr 3e-3 --warmup 30 \
    --lora-rank 64 --lora-alpha 64 --lora-targets q,k,v,o,gate,up,down \
    --save-every 200 --threads "$THREADS" --out "$OUT/lora"

say "4/5 questions (answers only in the company documents; greedy decoding)"
correct=0
total=0
while IFS=$'\t' read -r q want; do
    base=$("$ENERGON" generate --model "$OUT/pretrain/model" --chat --prompt "$q" \
        --temperature 0 --max-tokens 40 --threads "$THREADS" 2>/dev/null | head -n 1)
    got=$("$ENERGON" generate --model "$OUT/pretrain/model" --adapter "$OUT/lora" --chat --prompt "$q" \
        --temperature 0 --max-tokens 40 --threads "$THREADS" 2>/dev/null | head -n 1)
    total=$((total + 1))
    mark="✗"
    if [ "$got" = "$want" ]; then mark="✓"; correct=$((correct + 1)); fi
    printf '\nQ:        %s\n' "$q"
    printf 'expected: %s\n' "$want"
    printf 'LoRA:     %s  %s\n' "$got" "$mark"
    printf 'base:     %s\n' "$base"
done < <(sed -E 's/^\{"question": "(.*)", "expected": "(.*)"\}$/\1\t\2/' "$X/demo_questions.jsonl")

"$ENERGON" export --model "$OUT/pretrain/model" --adapter "$OUT/lora" --out "$OUT/merged" 2>/dev/null
printf '\n%d of %d answers match the documents exactly (the base model alone knows none of them).\n' "$correct" "$total"
printf 'These questions were among the fine-tuning pairs: a model this small memorises rather than reasons.\n'

say "5/5 serving: the merged model behind the OpenAI-compatible API, asked through energon chat"
"$ENERGON" serve --model "$OUT/merged" --port 0 --threads "$THREADS" --quiet 2>"$OUT/serve.log" &
serve_pid=$!
trap 'kill "$serve_pid" 2>/dev/null || true' EXIT
url=""
for _ in $(seq 1 100); do
    url=$(sed -n 's/^energon serve: listening on \(http:[^ ]*\).*/\1/p' "$OUT/serve.log")
    if [ -n "$url" ] && grep -q "ready" "$OUT/serve.log"; then break; fi
    sleep 0.1
done
if [ -z "$url" ]; then echo "the server did not start:"; cat "$OUT/serve.log"; exit 1; fi
printf 'energon serve is up at %s (chat page: %s/)\n' "$url" "$url"
questions=$(sed -E 's/^\{"question": "(.*)", "expected": "(.*)"\}$/\1/' "$X/demo_questions.jsonl")
expected=$(sed -E 's/^\{"question": "(.*)", "expected": "(.*)"\}$/\2/' "$X/demo_questions.jsonl")
# Each question alone (/reset in between), all sent over HTTP, greedy.
answers=$(printf '%s\n' "$questions" | while IFS= read -r q; do printf '%s\n/reset\n' "$q"; done |
    "$ENERGON" chat --url "$url" --temperature 0 --max-tokens 40 --one-line)
served_ok=$(paste -d '\t' <(printf '%s\n' "$answers") <(printf '%s\n' "$expected") |
    awk -F'\t' '{ sub(/[ \t]+$/, "", $1) } $1 == $2' | wc -l)
printf '%s\n' "$answers" | head -n 3 | sed -E 's/[[:space:]]+$//; s/^/served:   /'
printf '%d of %d served answers match the documents (through /v1/chat/completions).\n' \
    "$served_ok" "$total"
curl -s "$url/metrics" | grep -E '^energon_(requests_total|generation_tokens_total)' | head -n 4
kill -TERM "$serve_pid"
wait "$serve_pid" || true
trap - EXIT
printf '\nOutputs in %s (%d s):\n' "$OUT" $(( $(date +%s) - t0 ))
printf '  pretrain/loss.svg, lora/loss.svg   loss curves (open in a browser)\n'
printf '  lora/adapter_*.json|safetensors     the LoRA adapter, PEFT layout\n'
printf '  merged/                             base + adapter merged, a Hugging Face directory\n'
printf 'Try: %s generate --model %s --adapter %s --chat --prompt "Who is the CEO of Quillon?" --temperature 0\n' \
    "$ENERGON" "$OUT/pretrain/model" "$OUT/lora"
printf 'Or:  %s serve --model %s   (then open http://127.0.0.1:8080/ or run %s chat --url http://127.0.0.1:8080)\n' \
    "$ENERGON" "$OUT/merged" "$ENERGON"
