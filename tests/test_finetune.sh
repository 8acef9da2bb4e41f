#!/usr/bin/env bash
# test_finetune.sh ENERGON FIXTURES SHARED
# The fine-tuner end to end, through the command line:
#  1. a run killed with SIGKILL at an arbitrary moment and resumed gives the
#     same per-step losses as an uninterrupted run, bit for bit (same thread
#     count; metrics are printed with 17 significant digits);
#  2. a checkpoint with a flipped byte is reported and skipped, resume falls
#     back to the previous one, and the losses still match;
#  3. bad training input stops with file:line messages (or is skipped and
#     counted with --skip-bad-records); a model without a tokenizer is refused;
#     --out onto a run is refused (exit 2, unchanged) unless --overwrite, which
#     starts a fresh run; a directory holding a user's file is never written;
#     .html and .md data (a file or a directory) train on their text without
#     markup, as `energon index` reads them;
#  4. (needs ../shared) LoRA on stories260K lowers the loss of a held-out text
#     it has never seen; the exported merged model scores exactly what base +
#     adapter scores;
#  5. (needs SmolLM2-135M-Instruct's Hugging Face directory at
#     ${ENERGON_SMOLLM2_DIR:-$HOME/.cache/energon/smollm2/hf}, made by
#     shared/models/smollm2/get.sh DIR --hf) chat records render with the
#     model's own template (--dump-data shows its default system prompt and
#     the assistant turns as the trained ids), a few LoRA steps give finite
#     losses (the first equal to transformers' loss on the same ids and mask,
#     when torch and transformers are installed) and a PEFT adapter, resume
#     renders identically, and `energon export` carries tokenizer.json,
#     tokenizer_config.json and chat_template.jinja.
#  6. --serve-url: a LoRA run hands its final adapter to a running `energon
#     serve` (POST /v1/adapters); the server is asked first (a dry run), so a
#     taken name (409), a run directory outside the server's --adapter-dir
#     (403) and a rank over its --max-lora-rank (400) exit 2 with the
#     server's message before anything is trained; a name taken during the
#     run and an unreachable server fail at the end with the server's or
#     curl's message and leave the adapter in place; --serve-url without
#     --lora-rank is a usage error before training.
set -u
ENERGON=$1
FIX=$2
SHARED=${3:-}
T=$(mktemp -d /tmp/en_ft_XXXXXX)
SPID= # the server of section 6
cleanup() {
    if [ -n "$SPID" ]; then kill -KILL "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null; fi
    rm -rf "$T"
}
trap cleanup EXIT
pass=0
fail=0
ok() { printf '  ok %s\n' "$1"; pass=$((pass + 1)); }
bad() { printf 'FAIL %s\n' "$1"; fail=$((fail + 1)); }

# step and loss (and val_loss) of every metrics line, for comparisons
losses() { sed -E 's/.*"step":([0-9]+),"loss":([^,]+),.*/\1 \2/' "$1"; }
val_losses() { grep -o '"step":[0-9]*\|"val_loss":[^,}]*' "$1" | paste -sd' ' | tr -d '"'; }

# A tiny model made from scratch: tokenizer trained here, `energon init`.
for i in $(seq 1 150); do
    echo "Record $i: the warehouse robot moves crate $((i % 17)) to shelf $((i % 5)) before noon."
done >"$T/corpus.txt"
"$ENERGON" tokenizer train --data "$T/corpus.txt" --vocab-size 300 --out "$T/tok.model" >/dev/null 2>&1 ||
    { echo "FAIL: tokenizer training"; exit 1; }
cat >"$T/cfg.json" <<'JSON'
{"model_type": "llama", "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
 "rms_norm_eps": 1e-5, "tie_word_embeddings": true}
JSON
"$ENERGON" init --config "$T/cfg.json" --tokenizer "$T/tok.model" --out "$T/base" --seed 3 2>"$T/init.log" ||
    { echo "FAIL: energon init"; cat "$T/init.log"; exit 1; }
ok "energon init made $(ls "$T/base" | tr '\n' ' ')"

ARGS=(--model "$T/base" --data "$T/corpus.txt" --doc-sep file --seq-len 32 --batch 2
      --steps 40 --lr 1e-3 --warmup 3 --weight-decay 0.1 --val-fraction 0 --save-every 4 --keep 3
      --threads 2 --seed 11)
# The corpus is one document; give it several with blank-line separation so
# the run has windows enough for a few epochs.
awk 'NR % 10 == 0 {print ""} {print}' "$T/corpus.txt" >"$T/docs.txt"
ARGS=(--model "$T/base" --data "$T/docs.txt" --doc-sep blank --seq-len 32 --batch 2
      --steps 40 --lr 1e-3 --warmup 3 --weight-decay 0.1 --save-every 4 --keep 3
      --threads 2 --seed 11 --eval-every 0)

# 1. uninterrupted reference run
"$ENERGON" finetune "${ARGS[@]}" --out "$T/ref" >"$T/ref.log" 2>&1 || { echo "FAIL: reference run"; tail "$T/ref.log"; exit 1; }
losses "$T/ref/metrics.jsonl" >"$T/ref.loss"
[ "$(wc -l <"$T/ref.loss")" -eq 40 ] && ok "reference run: 40 steps, loss $(head -1 "$T/ref.loss" | cut -d' ' -f2 | cut -c1-6) -> $(tail -1 "$T/ref.loss" | cut -d' ' -f2 | cut -c1-6)" || bad "reference run has $(wc -l <"$T/ref.loss") metric lines"

# killed at an arbitrary moment (when at least $K steps are logged), resumed
for K in 9 22; do
    R=$T/kill$K
    "$ENERGON" finetune "${ARGS[@]}" --out "$R" >"$R.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do
        n=$(cat "$R/metrics.jsonl" 2>/dev/null | wc -l)
        [ "$n" -ge "$K" ] && break
        sleep 0.02
    done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    at=$(cat "$R/metrics.jsonl" 2>/dev/null | wc -l)
    "$ENERGON" finetune --resume "$R" --threads 2 >"$R.resume.log" 2>&1 || { bad "resume after SIGKILL at step $at"; tail -3 "$R.resume.log"; continue; }
    losses "$R/metrics.jsonl" >"$R.loss"
    if cmp -s "$T/ref.loss" "$R.loss"; then
        ok "SIGKILL after $at logged steps, resumed ($(grep -o 'resuming from [^ ]*' "$R.resume.log" | sed 's|.*/||')): 40 losses bit-identical"
    else
        bad "SIGKILL at $at: losses differ from the uninterrupted run"; diff "$T/ref.loss" "$R.loss" | head -5
    fi
    cmp -s "$T/ref/adapter_model.safetensors" "$R/adapter_model.safetensors" 2>/dev/null || true
done

# 2. a corrupted newest checkpoint is skipped, the previous one used
R=$T/corrupt
"$ENERGON" finetune "${ARGS[@]}" --steps 40 --out "$R" >/dev/null 2>&1
ls -d "$R"/checkpoints/step-* >"$T/ckpts"
newest=$(tail -1 "$T/ckpts")
prev=$(tail -2 "$T/ckpts" | head -1)
f="$newest/optimizer.safetensors"
printf '\x55' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") / 2 )) conv=notrunc 2>/dev/null
truncate -s -8 "$prev/model.safetensors" 2>/dev/null
keepgood=$(tail -3 "$T/ckpts" | head -1)
"$ENERGON" finetune --resume "$R" --steps 40 --threads 2 >"$T/corrupt.log" 2>&1
if grep -q "$(basename "$newest")" "$T/corrupt.log" && grep -q "crc32\|checksum\|size" "$T/corrupt.log" &&
   grep -q "resuming from $keepgood" "$T/corrupt.log"; then
    ok "corrupt $(basename "$newest") (flipped byte) and $(basename "$prev") (truncated) rejected, resumed from $(basename "$keepgood")"
else
    bad "corrupted checkpoints were not handled as expected"; sed 's/^/  | /' "$T/corrupt.log" | head -8
fi
losses "$R/metrics.jsonl" >"$T/corrupt.loss"
cmp -s "$T/ref.loss" "$T/corrupt.loss" && ok "after the fallback the 40 losses still equal the reference" || bad "losses differ after the fallback"

# 3. bad input
expect() { # name rc needle -- cmd
    local name=$1 want=$2 needle=$3; shift 4
    "$@" >"$T/o" 2>"$T/e"; local rc=$?
    if [ "$rc" -eq "$want" ] && grep -qF -- "$needle" "$T/e"; then ok "$name: $(grep -F -- "$needle" "$T/e" | head -1 | cut -c1-130)"
    else bad "$name: exit $rc (want $want), stderr: $(head -3 "$T/e")"; fi
}
FT=(finetune --model "$T/base" --seq-len 64 --steps 2 --threads 2)
: >"$T/empty.jsonl"
expect "empty file" 1 "empty.jsonl" -- "$ENERGON" "${FT[@]}" --data "$T/empty.jsonl" --out "$T/x1"
printf '{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": \n' >"$T/badjson.jsonl"
expect "invalid JSON" 1 "badjson.jsonl:2:" -- "$ENERGON" "${FT[@]}" --data "$T/badjson.jsonl" --out "$T/x2"
printf '{"prompt": "a", "completion": "b"}\n{"prompt": 5, "completion": "b"}\n' >"$T/types.jsonl"
expect "wrong field type" 1 "types.jsonl:2:" -- "$ENERGON" "${FT[@]}" --data "$T/types.jsonl" --out "$T/x3"
printf '{"text": "fine"}\n{"text": "caf\xe9"}\n' >"$T/utf8.jsonl"
expect "non-UTF-8 bytes" 1 "utf8.jsonl:2:" -- "$ENERGON" "${FT[@]}" --data "$T/utf8.jsonl" --out "$T/x4"
printf 'good line\nbad \xff\xfe line\n' >"$T/utf8.txt"
expect "non-UTF-8 in .txt" 1 "utf8.txt:2:" -- "$ENERGON" "${FT[@]}" --data "$T/utf8.txt" --out "$T/x5"
for i in $(seq 1 30); do printf '{"prompt": "question %d about crates", "completion": "answer %d"}\n' "$i" "$i"; done >"$T/qa.jsonl"
cat "$T/qa.jsonl" "$T/types.jsonl" "$T/badjson.jsonl" >"$T/mixed.jsonl"
expect "--skip-bad-records counts" 0 "skipped 2 malformed records" -- "$ENERGON" "${FT[@]}" --data "$T/mixed.jsonl" --skip-bad-records --out "$T/x6"
long=$(for i in $(seq 1 60); do printf 'crate %d ' "$i"; done)
printf '{"prompt": "list the crates", "completion": "%s"}\n' "$long" >>"$T/qa.jsonl"
expect "record longer than --seq-len" 0 "1 records were longer than --seq-len 64" -- "$ENERGON" "${FT[@]}" --data "$T/qa.jsonl" --out "$T/x7"
mkdir -p "$T/notok"; cp "$T/base/config.json" "$T/base/model.safetensors" "$T/notok/"
expect "model without a tokenizer" 1 "no tokenizer.json or tokenizer.model" -- "$ENERGON" finetune --model "$T/notok" --data "$T/qa.jsonl" --out "$T/x8"
expect "missing data file" 1 "$T/nope.txt" -- "$ENERGON" "${FT[@]}" --data "$T/nope.txt" --out "$T/x9"
expect "bad --lora-targets" 2 "unknown LoRA target 'qq'" -- "$ENERGON" "${FT[@]}" --data "$T/qa.jsonl" --lora-rank 4 --lora-targets q,qq --out "$T/x10"
expect "resume of a non-run" 1 "not a run directory" -- "$ENERGON" finetune --resume "$T/base"
expect "unknown --chat-template" 2 "--chat-template: unknown chat template \"vicuna\"" -- "$ENERGON" "${FT[@]}" --data "$T/qa.jsonl" --chat-template vicuna --out "$T/x11"
expect "missing .jinja file" 1 "$T/nope.jinja" -- "$ENERGON" "${FT[@]}" --data "$T/qa.jsonl" --chat-template "$T/nope.jinja" --out "$T/x12"
expect "--chat-template with --resume" 2 "--resume takes the model" -- "$ENERGON" finetune --resume "$T/ref" --chat-template chatml

# 3b. --out onto a directory that is not empty: a run is refused unless
# --overwrite (then a fresh run: steps from 1, the old checkpoints gone); a
# user's own file is never written beside or removed, even with --overwrite.
tree_sum() { (cd "$1" && find . | sort && find . -type f | sort | xargs sha256sum); }
RA=(--model "$T/base" --data "$T/docs.txt" --doc-sep blank --seq-len 32 --batch 2 --lr 1e-3
    --threads 2 --seed 11 --eval-every 0)
R=$T/reuse
"$ENERGON" finetune "${RA[@]}" --steps 8 --save-every 4 --out "$R" >"$T/reuse.log" 2>&1 ||
    { bad "run for the --out checks"; tail -3 "$T/reuse.log"; }
tree_sum "$R" >"$T/reuse.before"
expect "--out onto a run" 2 "$R holds a run" -- "$ENERGON" finetune "${RA[@]}" --steps 6 --out "$R"
grep -qF -- "--resume $R, or give --overwrite" "$T/e" && tree_sum "$R" | cmp -s - "$T/reuse.before" &&
    ok "--out onto a run: it names --resume and --overwrite, and $(grep -c . "$T/reuse.before") entries and checksums are unchanged" ||
    bad "--out onto a run changed it or did not name --resume / --overwrite"
cp -r "$R" "$T/reuse_notes"
echo "my own notes" >"$T/reuse_notes/notes.txt"
tree_sum "$T/reuse_notes" >"$T/reuse_notes.before"
expect "--overwrite onto a run beside a user's file" 2 "holds notes.txt" -- \
    "$ENERGON" finetune "${RA[@]}" --steps 6 --overwrite --out "$T/reuse_notes"
tree_sum "$T/reuse_notes" | cmp -s - "$T/reuse_notes.before" &&
    ok "--overwrite refused beside notes.txt: nothing removed or changed" ||
    bad "--overwrite beside notes.txt changed the directory"
expect "--overwrite with --resume" 2 "give one of them" -- "$ENERGON" finetune --resume "$R" --overwrite
"$ENERGON" finetune "${RA[@]}" --steps 6 --save-every 3 --overwrite --out "$R" >"$T/reuse2.log" 2>&1 ||
    { bad "--overwrite run"; tail -3 "$T/reuse2.log"; }
steps=$(losses "$R/metrics.jsonl" | cut -d' ' -f1 | paste -sd' ')
ckpts=$(cd "$R/checkpoints" && ls | paste -sd' ')
if [ "$steps" = "1 2 3 4 5 6" ] && [ "$ckpts" = "step-00000003 step-00000006" ] &&
   grep -q '"steps": *6' "$R/run.json"; then
    ok "--overwrite: a fresh run (steps $steps; checkpoints $ckpts; the old step-00000008 gone)"
else
    bad "--overwrite: steps '$steps', checkpoints '$ckpts'"
fi
mkdir -p "$T/mine"
echo "my own notes" >"$T/mine/notes.txt"
sum=$(sha256sum <"$T/mine/notes.txt")
expect "--out onto a user's directory" 2 "$T/mine holds notes.txt" -- \
    "$ENERGON" finetune "${RA[@]}" --steps 2 --out "$T/mine"
expect "--overwrite onto a user's directory" 2 "$T/mine holds notes.txt" -- \
    "$ENERGON" finetune "${RA[@]}" --steps 2 --overwrite --out "$T/mine"
[ "$(ls -A "$T/mine")" = "notes.txt" ] && [ "$(sha256sum <"$T/mine/notes.txt")" = "$sum" ] &&
    ok "a user's directory: notes.txt untouched, nothing written beside it" ||
    bad "a user's directory was written into: $(ls -A "$T/mine" | paste -sd' ')"
mkdir -p "$T/empty_out"
"$ENERGON" finetune "${RA[@]}" --steps 2 --out "$T/empty_out" >/dev/null 2>&1 && [ -f "$T/empty_out/run.json" ] &&
    ok "an empty --out directory takes a new run" || bad "a run into an empty directory failed"

# 3c. .md and .html data read as `energon index` reads them: no tags in
# the trained text, a directory of them trains.
mkdir -p "$T/pages/sub"
cat >"$T/pages/guide.html" <<'HTML'
<!DOCTYPE html>
<html><head><title>Crate guide</title><style>p { color: red }</style>
<script>var hidden = "<b>script text</b>";</script></head>
<body><h1>Moving crates</h1>
<p>The <b>warehouse</b> robot moves crate 3 to <a href="/s">shelf 2</a> &amp; waits.</p>
<div>Record 7: the robot moves crate 7 before noon.</div></body></html>
HTML
printf '# Shelf rules\n\nThe robot moves crate 5 to shelf 1 before noon.\n' >"$T/pages/sub/rules.md"
"$ENERGON" finetune --model "$T/base" --data "$T/pages/guide.html" --data "$T/pages/sub/rules.md" \
    --seq-len 64 --dump-data 4 >"$T/pages.dump" 2>"$T/pages.err" || { bad "--dump-data of .html and .md"; head -3 "$T/pages.err"; }
# the windows' text (one token overlaps between windows), trained marks removed
text=$(grep -vE '^(window [0-9]|ids:|train:)' "$T/pages.dump" | sed 's/⟦//g; s/⟧//g' | tr '\n' ' ')
if printf '%s' "$text" | grep -qF 'The warehouse robot moves crate 3 to shelf 2' &&
   printf '%s' "$text" | grep -qF 'Moving crates' && printf '%s' "$text" | grep -qF 'Shelf rules' &&
   ! printf '%s' "$text" | grep -qE '</?(b|a|p|div|h1|title|html|head|body|script|style)[ >]|DOCTYPE|&amp;|script text|color: red|# Shelf'; then
    ok ".html and .md as data: --dump-data shows their text without tags, scripts, styles or '#'"
else
    bad ".html/.md text in --dump-data: $(head -c 300 "$T/pages.dump")"
fi
"$ENERGON" finetune --model "$T/base" --data "$T/pages" --seq-len 32 --batch 2 --steps 4 --threads 2 \
    --eval-every 0 --out "$T/pages_run" >"$T/pages_run.log" 2>&1 &&
    [ "$(wc -l <"$T/pages_run/metrics.jsonl")" -eq 4 ] && grep -q '"loss":[0-9]' "$T/pages_run/metrics.jsonl" &&
    ok "a directory of .html and .md trains: 4 steps, $(grep -o '[0-9]* records, [0-9]* tokens' "$T/pages_run.log" | head -1)" ||
    { bad "a run on a directory of .html and .md"; tail -3 "$T/pages_run.log"; }

# 4. LoRA on stories260K
S=$SHARED/models/stories260K
if [ -f "$S/stories260K.bin" ]; then
    "$ENERGON" convert llama2c --checkpoint "$S/stories260K.bin" --tokenizer "$S/tok512.model" --out "$T/s260" 2>/dev/null
    before=$("$ENERGON" eval --model "$T/s260" --data "$FIX/text/unseen_heldout.txt" --json 2>/dev/null)
    "$ENERGON" finetune --model "$T/s260" --data "$FIX/text/unseen_train.txt" --doc-sep blank \
        --seq-len 64 --batch 4 --steps 60 --lora-rank 8 --lora-alpha 16 --lora-targets q,k,v,o,gate,up,down \
        --lr 4e-3 --threads 2 --out "$T/lora" >"$T/lora.log" 2>&1 || { bad "LoRA run"; tail -3 "$T/lora.log"; }
    after=$("$ENERGON" eval --model "$T/s260" --adapter "$T/lora" --data "$FIX/text/unseen_heldout.txt" --json 2>/dev/null)
    "$ENERGON" export --model "$T/s260" --adapter "$T/lora" --out "$T/merged" 2>/dev/null
    merged=$("$ENERGON" eval --model "$T/merged" --data "$FIX/text/unseen_heldout.txt" --json 2>/dev/null)
    nb=$(echo "$before" | sed -E 's/.*"nll":([^,]*),.*/\1/')
    na=$(echo "$after" | sed -E 's/.*"nll":([^,]*),.*/\1/')
    nm=$(echo "$merged" | sed -E 's/.*"nll":([^,]*),.*/\1/')
    if awk -v b="$nb" -v a="$na" 'BEGIN { exit !(a < 0.8 * b) }'; then
        ok "LoRA on stories260K: held-out nll $nb -> $na (ppl $(awk -v x="$nb" 'BEGIN{printf "%.2f", exp(x)}') -> $(awk -v x="$na" 'BEGIN{printf "%.2f", exp(x)}'))"
    else
        bad "LoRA did not lower the held-out nll by 20%: $nb -> $na"
    fi
    if awk -v a="$na" -v m="$nm" 'BEGIN { d = a - m; if (d < 0) d = -d; exit !(d <= 1e-5 * a) }'; then
        ok "exported merged model: nll $nm equals base + adapter $na"
    else
        bad "merged model nll $nm differs from base + adapter $na"
    fi
    [ -f "$T/lora/loss.svg" ] && grep -q "<svg" "$T/lora/loss.svg" && ok "loss.svg written" || bad "no loss.svg"
    grep -q "no gradients or optimizer state for them" "$T/lora.log" && grep -q "peak memory" "$T/lora.log" &&
        ok "LoRA run reports frozen base without optimizer state, and peak memory" || bad "LoRA memory report missing"
else
    echo "  (skipping the stories260K LoRA checks: $S is absent)"
fi

# 5. SmolLM2-135M-Instruct: its own chat template, LoRA, export
H=${ENERGON_SMOLLM2_DIR:-$HOME/.cache/energon/smollm2/hf}
if [ -f "$H/model.safetensors" ] && [ -f "$H/tokenizer.json" ] && [ -f "$H/chat_template.jinja" ]; then
    cat >"$T/smol.jsonl" <<'JSONL'
{"messages": [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris is the capital of France."}]}
{"messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a prime number."}, {"role": "assistant", "content": "7 is a prime number."}, {"role": "user", "content": "And an even one?"}, {"role": "assistant", "content": "2 is the only even prime."}]}
{"messages": [{"role": "user", "content": [{"type": "text", "text": "Which colour is the sky "}, {"type": "text", "text": "on a clear day?"}]}, {"role": "assistant", "content": "The sky is blue on a clear day."}]}
{"prompt": "Two plus two is", "completion": " four."}
JSONL
    SM=(finetune --model "$H" --data "$T/smol.jsonl" --seq-len 96 --threads 2)
    "$ENERGON" "${SM[@]}" --dump-data 3 >"$T/smol.dump" 2>"$T/smol.dump.err" ||
        { bad "SmolLM2 --dump-data"; head -3 "$T/smol.dump.err"; }
    # window 0 is the first record: the template's default system prompt (the
    # record has none), and exactly the answer plus its end-of-turn is trained
    if grep -qxF 'You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>' "$T/smol.dump" &&
       grep -qxF '⟦Paris is the capital of France.<|im_end|>' "$T/smol.dump" &&
       grep -qxF '⟦2 is the only even prime.<|im_end|>' "$T/smol.dump" &&
       grep -q "chat template $H/chat_template.jinja" "$T/smol.dump.err" &&
       [ "$(grep -c '^window ' "$T/smol.dump")" -eq 3 ] && ! grep -q '⟦[^⟧]*<|im_start|>' "$T/smol.dump"; then
        ok "SmolLM2 records rendered with the model's chat_template.jinja: $(head -1 "$T/smol.dump")"
    else
        bad "SmolLM2 records not rendered with the model's own template"; head -12 "$T/smol.dump" | sed 's/^/  | /'
    fi
    # --chat-template chatml forces the built-in: no default system prompt
    "$ENERGON" "${SM[@]}" --chat-template chatml --dump-data 1 >"$T/smol.chatml" 2>/dev/null
    if ! grep -q "named SmolLM" "$T/smol.chatml" && grep -qxF 'text: <|im_start|>user' "$T/smol.chatml"; then
        ok "--chat-template chatml overrides the model's template"
    else
        bad "--chat-template chatml did not override"; head -4 "$T/smol.chatml" | sed 's/^/  | /'
    fi
    # a few LoRA steps; batch 3 holds every window, so step 1 is the base model's loss
    "$ENERGON" "${SM[@]}" --batch 3 --steps 3 --lora-rank 8 --lr 1e-3 --seed 5 --out "$T/smol" \
        >"$T/smol.log" 2>&1 || { bad "SmolLM2 LoRA run"; tail -3 "$T/smol.log"; }
    sl=$(losses "$T/smol/metrics.jsonl" 2>/dev/null | cut -d' ' -f2 | paste -sd' ')
    if [ "$(echo "$sl" | wc -w)" -eq 3 ] && awk -v l="$sl" 'BEGIN { n = split(l, a, " "); for (i = 1; i <= n; i++) if (!(a[i] + 0 > 0 && a[i] + 0 < 20)) exit 1 }' &&
       [ -f "$T/smol/adapter_model.safetensors" ] && grep -q '"r": 8' "$T/smol/adapter_config.json"; then
        ok "SmolLM2 LoRA rank 8, 3 steps: losses $sl; PEFT adapter written"
    else
        bad "SmolLM2 LoRA run: losses '$sl', adapter: $(ls "$T/smol" 2>&1 | paste -sd' ')"
    fi
    grep -q '"chat_template": "model"' "$T/smol/run.json" && ok "run.json records the model's own template" ||
        bad "run.json chat_template: $(grep chat_template "$T/smol/run.json")"
    "$ENERGON" finetune --resume "$T/smol" --dump-data 3 >"$T/smol.resume.dump" 2>/dev/null
    cmp -s "$T/smol.dump" "$T/smol.resume.dump" && ok "--resume renders the records identically" ||
        bad "--resume renders differently"
    if python3 -c 'import torch, transformers' 2>/dev/null; then
        want=$(python3 - "$H" "$T/smol.dump" <<'PY' 2>"$T/py.err"
import re, sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
s, n = 0.0, 0
for block in open(sys.argv[2], encoding="utf-8").read().split("\nwindow ")[0:]:
    ids = [int(x) for x in re.search(r"\nids: ([0-9 ]+)\n", block).group(1).split()]
    train = [int(x) for x in re.search(r"\ntrain: ([01 ]+)\n", block).group(1).split()]
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    for t in range(len(ids) - 1):
        if train[t + 1]:
            s -= lp[t, ids[t + 1]].item()
            n += 1
print(f"{s / n:.9f} {n}")
PY
)
        got=$(head -1 "$T/smol/metrics.jsonl" | sed -E 's/.*"loss":([^,]+),.*"trained_tokens":([0-9]+),.*/\1 \2/')
        if [ -n "$want" ] && awk -v w="$want" -v g="$got" 'BEGIN { split(w, a, " "); split(g, b, " "); d = a[1] - b[1]; if (d < 0) d = -d; exit !(a[2] == b[2] && d <= 1e-4 * a[1]) }'; then
            ok "SmolLM2 step-1 loss $got (loss, trained ids) equals transformers' $want on the dumped ids and mask"
        else
            bad "SmolLM2 step-1 loss $got differs from transformers' '$want' $(tail -1 "$T/py.err")"
        fi
    else
        echo "  (skipping the transformers loss check: python3 cannot import torch and transformers)"
    fi
    "$ENERGON" export --model "$H" --adapter "$T/smol" --out "$T/smol_merged" 2>"$T/smol_export.log" ||
        { bad "export of the SmolLM2 run"; tail -2 "$T/smol_export.log"; }
    missing=""
    for f in tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json; do
        cmp -s "$H/$f" "$T/smol_merged/$f" || missing="$missing $f"
    done
    [ -z "$missing" ] && ok "export carries tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json unchanged" ||
        bad "export lacks or changed:$missing"
    "$ENERGON" finetune --model "$T/smol_merged" --data "$T/smol.jsonl" --seq-len 96 --dump-data 3 >"$T/merged.dump" 2>/dev/null
    cmp -s "$T/smol.dump" "$T/merged.dump" && ok "the exported model renders and tokenizes the records as the base does" ||
        bad "the exported model renders differently from the base"
else
    echo "  (skipping the SmolLM2 checks: no Hugging Face SmolLM2 directory at $H; make one with shared/models/smollm2/get.sh $H --hf, or set ENERGON_SMOLLM2_DIR)"
fi

# 6. --serve-url: hand the final adapter to a running server
# The server loads from $T/served; its API key is required, so a success also
# shows that --api-key is sent. Loopback only, never through a proxy.
export NO_PROXY=127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY} no_proxy=127.0.0.1,localhost${no_proxy:+,$no_proxy}
KEY=ft-handoff-key
mkdir -p "$T/served" "$T/outside"
HO=(finetune --model "$T/base" --data "$T/docs.txt" --doc-sep blank --seq-len 32 --batch 2
    --steps 3 --lora-rank 4 --threads 2 --eval-every 0 --save-every 0 --api-key "$KEY")
expect "--serve-url without --lora-rank" 2 "--serve-url needs --lora-rank" -- \
    "$ENERGON" finetune --model "$T/base" --data "$T/docs.txt" --steps 3 --out "$T/served/full" \
    --serve-url http://127.0.0.1:1
[ ! -e "$T/served/full" ] && ok "  ... refused before training: no run directory made" ||
    bad "--serve-url without --lora-rank made $T/served/full"
expect "--serve-url without http(s)://" 2 "must start with http:// or https://" -- \
    "$ENERGON" "${HO[@]}" --out "$T/served/u" --serve-url 127.0.0.1:8080
expect "bad --serve-name" 2 "--serve-name: 'a b' must be 1 to 127 characters" -- \
    "$ENERGON" "${HO[@]}" --out "$T/served/n" --serve-url http://127.0.0.1:1 --serve-name "a b"
expect "--serve-name without --serve-url" 2 "go with --serve-url" -- \
    "$ENERGON" "${HO[@]}" --out "$T/served/n2" --serve-name x
if ! command -v curl >/dev/null; then
    echo "  (skipping the --serve-url hand-off checks: no curl command to query the server)"
else
    "$ENERGON" serve --model "$T/base" --port 0 --model-name base --threads 1 --api-key "$KEY" \
        --adapter-dir "$T/served" >"$T/serve.log" 2>&1 &
    SPID=$!
    SURL=
    for _ in $(seq 1 300); do
        kill -0 "$SPID" 2>/dev/null || break
        [ -z "$SURL" ] && SURL=$(grep -o 'listening on http://[^ ]*' "$T/serve.log" | head -1 | sed 's/listening on //')
        [ -n "$SURL" ] && curl -sf "$SURL/health" >/dev/null 2>&1 && break
        sleep 0.1
    done
    if [ -z "$SURL" ] || ! curl -sf "$SURL/health" >/dev/null 2>&1; then
        bad "the server for --serve-url did not become healthy"; sed 's/^/  | /' "$T/serve.log" | tail -5
    else
        # (a) handed over: the server lists it under the base
        "$ENERGON" "${HO[@]}" --out "$T/served/ho1" --serve-url "$SURL/" >"$T/ho1.log" 2>&1
        rc=$?
        models=$(curl -s -H "Authorization: Bearer $KEY" "$SURL/v1/models")
        entry=$(echo "$models" | grep -o '{[^{}]*"id":"ho1"[^{}]*}')
        if [ "$rc" -eq 0 ] && grep -qF "adapter 'ho1' loaded by $SURL (rank 4)" "$T/ho1.log" &&
           echo "$entry" | grep -qF '"parent":"base"'; then
            ok "--serve-url: $(grep -F "loaded by" "$T/ho1.log"); GET /v1/models lists it, parent base"
        else
            bad "--serve-url hand-off: exit $rc, $(tail -1 "$T/ho1.log"); /v1/models: $models"
        fi
        # (b) the name is taken: the server's 409, asked before training
        # (a dry run): exit 2, nothing trained
        "$ENERGON" "${HO[@]}" --out "$T/served/ho2" --serve-url "$SURL" --serve-name ho1 \
            >"$T/ho2.log" 2>&1
        rc=$?
        if [ "$rc" -eq 2 ] && grep -q "would refuse the adapter (409 adapter_exists)" "$T/ho2.log" &&
           [ ! -e "$T/served/ho2" ]; then
            ok "taken --serve-name, asked first: $(grep -F 409 "$T/ho2.log" | cut -c1-200); nothing trained"
        else
            bad "taken --serve-name: exit $rc, $(tail -1 "$T/ho2.log"), $(ls "$T/served/ho2" 2>&1 | paste -sd' ')"
        fi
        # (c) a run directory outside --adapter-dir: 403 before training
        "$ENERGON" "${HO[@]}" --out "$T/outside/ho3" --serve-url "$SURL" >"$T/ho3.log" 2>&1
        rc=$?
        if [ "$rc" -eq 2 ] && grep -q "would refuse the adapter (403 path_not_allowed)" "$T/ho3.log" &&
           [ ! -e "$T/outside/ho3" ]; then
            ok "run outside --adapter-dir, asked first: $(grep -F 403 "$T/ho3.log" | cut -c1-200)"
        else
            bad "run outside --adapter-dir: exit $rc, $(tail -1 "$T/ho3.log")"
        fi
        # (d) --lora-rank over the server's --max-lora-rank (64): 400 before training
        "$ENERGON" "${HO[@]}" --lora-rank 128 --out "$T/served/ho5" --serve-url "$SURL" >"$T/ho5.log" 2>&1
        rc=$?
        if [ "$rc" -eq 2 ] && grep -q "would refuse the adapter (400 invalid_adapter).*--max-lora-rank 64" \
               "$T/ho5.log" && [ ! -e "$T/served/ho5" ]; then
            ok "--lora-rank 128 over --max-lora-rank, asked first: $(grep -F 400 "$T/ho5.log" | cut -c1-200)"
        else
            bad "--lora-rank over --max-lora-rank: exit $rc, $(tail -1 "$T/ho5.log")"
        fi
        # (e) the name taken while the run trains (after the dry run): the
        # final load's 409, exit 1, the adapter kept. The run is long (200
        # steps) and the name is taken once its first step is logged, so
        # that the taker always comes first (with 3 steps the run sometimes
        # ended before the taker's load, and exited 0).
        HO6=("${HO[@]}")
        for k in "${!HO6[@]}"; do [ "${HO6[$k]}" = --steps ] && HO6[$((k + 1))]=200; done
        ( for _ in $(seq 1 1200); do
              [ -s "$T/served/ho6/metrics.jsonl" ] && break
              sleep 0.05
          done
          curl -s -H "Authorization: Bearer $KEY" -d '{"name":"ho6","path":"ho1"}' \
              "$SURL/v1/adapters" >/dev/null ) &
        taker=$!
        "$ENERGON" "${HO6[@]}" --out "$T/served/ho6" --serve-url "$SURL" >"$T/ho6.log" 2>&1
        rc=$?
        wait "$taker"
        if [ "$rc" -eq 1 ] && grep -q "refused the adapter (409" "$T/ho6.log" &&
           [ -f "$T/served/ho6/adapter_model.safetensors" ]; then
            ok "name taken during training: $(grep -F 409 "$T/ho6.log" | cut -c1-200); adapter kept"
        else
            bad "name taken during training: exit $rc, $(tail -1 "$T/ho6.log")"
        fi
    fi
    kill -KILL "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null; SPID=
fi
# (f) nothing listens on port 1: a note before training (the server may start
# while the run trains), then curl's error at the end, naming the URL
"$ENERGON" "${HO[@]}" --out "$T/served/ho4" --serve-url http://127.0.0.1:1 >"$T/ho4.log" 2>&1
rc=$?
if [ "$rc" -eq 1 ] && grep -qF "no answer yet from http://127.0.0.1:1/v1/adapters" "$T/ho4.log" &&
   grep -qF "no answer from http://127.0.0.1:1/v1/adapters" "$T/ho4.log" &&
   [ -f "$T/served/ho4/adapter_model.safetensors" ]; then
    ok "unreachable --serve-url: $(grep -F "no answer" "$T/ho4.log" | cut -c1-220)"
else
    bad "unreachable --serve-url: exit $rc, $(tail -1 "$T/ho4.log")"
fi

echo "test_finetune: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
