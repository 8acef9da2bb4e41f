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
#      through `energon chat` over the OpenAI-compatible API;
#   6. grounded answers: index the documents (`energon index`), fine-tune a
#      real instruct model (SmolLM2-135M-Instruct, fetched by install-deps)
#      with LoRA on the question/answer pairs grounded in retrieved passages,
#      and ask it questions that are not among the pairs: each answer comes
#      with the passages it was given and cites them.
# Takes about seven minutes on 2 cores (step 6 about five). Outputs go
# to demo-out/. ENERGON_DEMO_SKIP_GROUNDED=1 stops after step 5.
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

# Step 6. Held-out questions (from eval_qa.jsonl, none among qa.jsonl's
# prompts), fixed here before any answer was seen.
GROUNDED_QUESTIONS=(
    "Who is in charge of the travel desk?"
    "To which address can a phishing email be forwarded?"
    "What is the name of the company VPN?"
    "How much does the Wren 2 cart weigh?"
    "When is Bramble 5.3 planned?"
)
gold_answer() {
    grep -F "\"question\": \"$1\"" "$X/eval_qa.jsonl" | sed -E 's/.*"answer": "([^"]*)".*/\1/'
}
grounded_step() {
    say "6/6 grounded answers: SmolLM2-135M-Instruct, an index of the documents, citations"
    if [ "${ENERGON_DEMO_SKIP_GROUNDED:-0}" = 1 ]; then
        echo "skipped (ENERGON_DEMO_SKIP_GROUNDED=1)"
        return 0
    fi
    local gguf
    if ! gguf=$(bash "$HERE/scripts/get-smollm2" 2>"$OUT/get-smollm2.log"); then
        echo "skipped: SmolLM2-135M-Instruct is not in the cache and could not be fetched:"
        sed 's/^/  /' "$OUT/get-smollm2.log"
        return 0
    fi
    "$ENERGON" index --docs "$X/handbook.txt" "$X/policies.txt" "$X/products.txt" \
        --out "$OUT/company.db" --chunk-tokens 128 --overlap 16
    printf '\nLoRA on the %d pairs, each prompt grounded in its top 3 passages (about 5 minutes):\n' \
        "$(wc -l <"$X/qa.jsonl")"
    "$ENERGON" finetune --model "$gguf" --data "$X/qa.jsonl" --index "$OUT/company.db" \
        --seq-len 800 --batch 4 --steps 20 --lr 2e-3 --lora-rank 8 --lora-targets q,k,v,o \
        --log-every 2 --threads "$THREADS" --out "$OUT/grounded-lora"
    local q answers
    answers=$(for q in "${GROUNDED_QUESTIONS[@]}"; do printf '%s\n/reset\n' "$q"; done |
        "$ENERGON" chat --model "$gguf" --adapter "$OUT/grounded-lora" --index "$OUT/company.db" \
            --threads "$THREADS" --temperature 0 --max-tokens 48 --one-line --show-sources \
            2>"$OUT/grounded-chat.log")
    # the answers, each followed by its "[n] FILE, SECTION (lines A-B)" lines
    local i=-1 line
    while IFS= read -r line; do
        if [[ "$line" =~ ^[[:space:]]*\[[0-9]+\] ]]; then
            printf '        %s\n' "$line"
            continue
        fi
        i=$((i + 1))
        q=${GROUNDED_QUESTIONS[$i]}
        printf '\nQ:        %s\n' "$q"
        printf 'expected: %s\n' "$(gold_answer "$q")"
        printf 'no index: %s\n' "$("$ENERGON" generate --model "$gguf" --chat --prompt "$q" \
            --temperature 0 --max-tokens 48 --threads "$THREADS" 2>/dev/null | tr '\n' ' ')"
        printf 'grounded: %s\n' "$line"
        printf 'sources (* = cited):\n'
    done <<<"$answers"
    printf '\nThese questions are not among the fine-tuning pairs: the answers come from the\n'
    printf 'passages retrieved for each. On all 75 held-out questions of eval_qa.jsonl see\n'
    printf '"energon eval qa" in docs/retrieval.md (a 135M model often rewords or misses).\n'
}

say "1/6 tokenizer: SentencePiece BPE, 1024 pieces, on the company documents"
"$ENERGON" tokenizer train --data "$X/handbook.txt" --data "$X/policies.txt" --data "$X/products.txt" \
    --vocab-size 1024 --out "$OUT/tok.model"

say "2/6 base model: a 0.9M-parameter Llama from scratch, pretrained on the documents (300 steps)"
"$ENERGON" init --config "$X/base_model.json" --tokenizer "$OUT/tok.model" --out "$OUT/init" --seed 1
"$ENERGON" finetune --model "$OUT/init" \
    --data "$X/handbook.txt" --data "$X/policies.txt" --data "$X/products.txt" --doc-sep blank \
    --seq-len 128 --batch 8 --steps 300 --lr 3e-3 --warmup 10 \
    --val-fraction 0.05 --eval-every 100 --save-every 100 --threads "$THREADS" --out "$OUT/pretrain"

say "3/6 LoRA fine-tuning on $(wc -l <"$X/qa.jsonl") question/answer pairs (rank 64, every linear layer, base frozen)"
"$ENERGON" finetune --model "$OUT/pretrain/model" --data "$X/qa.jsonl" \
    --seq-len 64 --batch 8 --epochs 20 --lr 3e-3 --warmup 30 \
    --lora-rank 64 --lora-alpha 64 --lora-targets q,k,v,o,gate,up,down \
    --save-every 200 --threads "$THREADS" --out "$OUT/lora"

say "4/6 questions (answers only in the company documents; greedy decoding)"
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

say "5/6 serving: the merged model behind the OpenAI-compatible API, asked through energon chat"
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
grounded_step
printf '\nOutputs in %s (%d s):\n' "$OUT" $(( $(date +%s) - t0 ))
printf '  pretrain/loss.svg, lora/loss.svg   loss curves (open in a browser)\n'
printf '  lora/adapter_*.json|safetensors     the LoRA adapter, PEFT layout\n'
printf '  merged/                             base + adapter merged, a Hugging Face directory\n'
printf 'Try: %s generate --model %s --adapter %s --chat --prompt "Who is the CEO of Quillon?" --temperature 0\n' \
    "$ENERGON" "$OUT/pretrain/model" "$OUT/lora"
printf 'Or:  %s serve --model %s   (then open http://127.0.0.1:8080/ or run %s chat --url http://127.0.0.1:8080)\n' \
    "$ENERGON" "$OUT/merged" "$ENERGON"
