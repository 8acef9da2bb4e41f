#!/usr/bin/env bash
# test_smollm2_gguf.sh ENERGON FIXTURES
# SmolLM2-135M-Instruct read straight from its GGUF file (--model FILE.gguf:
# tokenizer and chat template from the metadata), against transformers on
# the Hugging Face directory it makes of the same file
# (tests/fixtures/chat/*.json, written by tests/gen/):
#   - `generate --chat --weights f32` (the tensors dequantised on load)
#     greedy ids = transformers' greedy answer;
#   - `eval` mean NLL of a text within 1e-4 of transformers' (the GGUF with
#     its quantised tensors kept, its prompt-sized products on dequantised
#     panels with float32 activations (EN_QUANT_SIMD=avx2), and the
#     directory); where the CPU runs quantised prompts on its int8 kernels
#     (AVX-512 VNNI: activations quantised to q8), the default eval within
#     2% of it;
#   - `serve --model FILE.gguf --weights f32` answers the official openai client with
#     transformers' greedy text, streamed and not;
#   - a LoRA fine-tune on a small chat .jsonl with the GGUF (quantised
#     tensors kept: LoRA over a frozen quantised base) as base lowers the
#     held-out loss, and its adapter, loaded by PEFT on the directory, gives
#     the NLL energon gives with it (within 1e-4).
# Needs ~/.cache/energon/smollm2/{SmolLM2-135M-Instruct.Q4_1.gguf,hf} made by
# ../shared/models/smollm2/get.sh ~/.cache/energon/smollm2 --hf; skipped
# (exit 77) with a message when absent. The PEFT check also needs torch and
# peft (skipped with a message without them).
set -u
abspath() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
ENERGON=$(abspath "$1")
FX=$(abspath "${2:-tests/fixtures}")
ROOT=$(dirname "$(cd "$(dirname "$0")" && pwd)")
D=${ENERGON_SMOLLM2_CACHE:-$HOME/.cache/energon/smollm2}
G=$D/SmolLM2-135M-Instruct.Q4_1.gguf
M=$D/hf
if [ ! -f "$G" ] || [ ! -f "$M/model.safetensors" ]; then
    echo "SKIP test_smollm2_gguf: need $G and $M (make them with" \
         "../shared/models/smollm2/get.sh $D --hf)"
    exit 77
fi
PY=${EN_TEST_PYTHON:-$ROOT/.venv-test/bin/python} # the openai client (scripts/install-deps)
PYT=${EN_TORCH_PYTHON:-python3}                     # torch, transformers, peft, if any
if ! [ -x "$PY" ] || ! "$PY" -c 'import openai' 2>/dev/null; then
    echo "SKIP test_smollm2_gguf: the openai Python client is missing ($PY); run scripts/install-deps"
    exit 77
fi
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
T=$(mktemp -d /tmp/en_smol_gguf_XXXXXX)
SPID=
cleanup() { [ -n "$SPID" ] && kill "$SPID" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
GREEDY=$FX/chat/smollm2_greedy.json

# ---- generate --chat from the GGUF file = transformers greedy
for c in 0 1; do
    "$PY" -c 'import json,sys
m=json.load(open(sys.argv[1]))["cases"][int(sys.argv[2])]["messages"]
open(sys.argv[3], "w").write(m[-1]["content"])
open(sys.argv[4], "w").write(m[0]["content"] if m[0]["role"] == "system" else "")' \
        "$GREEDY" "$c" "$T/prompt" "$T/system"
    prompt=$(cat "$T/prompt")
    system=$(cat "$T/system")
    sys_arg=()
    [ -n "$system" ] && sys_arg=(--system "$system")
    # --weights f32: the GGUF's tensors dequantised, as transformers reads
    # them (by default its quantised tensors run on the int8 kernels, which
    # also quantise the activations: bench/perplexity.sh measures that)
    "$ENERGON" generate --model "$G" --weights f32 --chat "${sys_arg[@]}" --prompt "$prompt" --temperature 0 \
        --max-tokens 48 --json --threads 2 >"$T/gen$c.json" 2>"$T/gen$c.err"
    if "$PY" - "$T/gen$c.json" "$GREEDY" "$c" <<'EOF'
import json, sys
got = json.load(open(sys.argv[1]))
case = json.load(open(sys.argv[2]))["cases"][int(sys.argv[3])]
want = case["answer_ids"][:-1] if case["stopped"] else case["answer_ids"]
sys.exit(0 if got["ids"] == want and got["text"] == case["answer"] else 1)
EOF
    then ok "generate --model FILE.gguf --chat case $c = transformers greedy ($(head -c 80 "$T/gen$c.json"))"
    else bad "generate --model FILE.gguf case $c: $(cat "$T/gen$c.json")"; tail -3 "$T/gen$c.err"; fi
done

# ---- eval NLL against transformers
want=$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["scored"], d["nll"])' "$FX/chat/smollm2_eval.json")
for src in "$G" "$M"; do
    got=$(EN_QUANT_SIMD=avx2 "$ENERGON" eval --model "$src" --data "$FX/text/smollm2_eval.txt" \
          --json --threads 2 2>/dev/null |
          "$PY" -c 'import json,sys; d=json.load(sys.stdin); print(d["tokens"], d["nll"])')
    if awk -v w="$want" -v g="$got" 'BEGIN { split(w, a, " "); split(g, b, " "); d = (a[2] - b[2]) / a[2]; if (d < 0) d = -d; exit !(a[1] == b[1] && d <= 1e-4) }'; then
        ok "eval --model $(basename "$src"): tokens, nll $got = transformers' $want"
    else
        bad "eval --model $src: '$got', transformers '$want'"
    fi
done

got=$("$ENERGON" eval --model "$G" --data "$FX/text/smollm2_eval.txt" --json --threads 2 2>/dev/null |
      "$PY" -c 'import json,sys; d=json.load(sys.stdin); print(d["tokens"], d["nll"])')
if awk -v w="$want" -v g="$got" 'BEGIN { split(w, a, " "); split(g, b, " "); d = (a[2] - b[2]) / a[2]; if (d < 0) d = -d; exit !(a[1] == b[1] && d <= 2e-2) }'; then
    ok "eval --model FILE.gguf, default kernels: nll $got within 2% of transformers' $want"
else
    bad "eval --model $G, default kernels: '$got', transformers '$want'"
fi

# ---- serve --model FILE.gguf with the openai client
"$ENERGON" serve --model "$G" --weights f32 --port 0 --threads 2 --model-name smollm2 >"$T/serve.log" 2>&1 &
SPID=$!
URL=
for _ in $(seq 1 600); do
    URL=$(grep -o 'listening on http://[^ ]*' "$T/serve.log" | head -1 | sed 's/listening on //')
    [ -n "$URL" ] && break
    kill -0 "$SPID" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$URL" ]; then
    bad "serve --model FILE.gguf did not start"; tail -5 "$T/serve.log"
else
    if "$PY" - "$URL" "$GREEDY" <<'EOF'
import json, sys
import openai
url, fx = sys.argv[1], json.load(open(sys.argv[2]))
c = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=300)
fails = 0
for i, case in enumerate(fx["cases"][:2]):
    r = c.chat.completions.create(model="smollm2", messages=case["messages"], temperature=0, max_tokens=48)
    good = r.choices[0].message.content == case["answer"] and r.choices[0].finish_reason == "stop"
    parts = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="smollm2", messages=case["messages"], temperature=0, max_tokens=48, stream=True) if ch.choices]
    good = good and "".join(parts) == case["answer"]
    print("ok  " if good else "BAD ", i, repr(r.choices[0].message.content))
    fails += not good
sys.exit(1 if fails else 0)
EOF
    then ok "serve --model FILE.gguf: openai client, streamed and not, = transformers greedy"
    else bad "serve --model FILE.gguf with the openai client"; tail -5 "$T/serve.log"; fi
    grep -q "tokenizer.chat_template" "$T/serve.log" && ok "serve uses the GGUF's chat template" ||
        bad "serve template: $(grep -m1 template "$T/serve.log")"
    kill -TERM "$SPID"; wait "$SPID"; SPID=
fi

# ---- LoRA on the GGUF base: held-out loss goes down; PEFT loads the adapter
cap() { echo "{\"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of $1?\"}, {\"role\": \"assistant\", \"content\": \"The capital of $1 is $2.\"}]}"; }
{ cap France Paris; cap Italy Rome; cap Spain Madrid; cap Japan Tokyo; cap Egypt Cairo; cap Peru Lima; } >"$T/train.jsonl"
{ cap Germany Berlin; cap Kenya Nairobi; cap Canada Ottawa; } >"$T/val.jsonl"
"$ENERGON" finetune --model "$G" --data "$T/train.jsonl" --val-data "$T/val.jsonl" --seq-len 64 \
    --threads 2 --batch 6 --steps 8 --eval-every 1 --lora-rank 8 --lr 2e-3 --seed 3 \
    --out "$T/run" >"$T/ft.log" 2>&1 || { bad "finetune --model FILE.gguf"; tail -5 "$T/ft.log"; }
vl=$("$PY" -c 'import json,sys
v=[json.loads(l)["val_loss"] for l in open(sys.argv[1]) if "val_loss" in l]
print(" ".join("%.4f" % x for x in v))' "$T/run/metrics.jsonl" 2>/dev/null)
if [ -n "$vl" ] && awk -v l="$vl" 'BEGIN { n = split(l, a, " "); exit !(n >= 2 && a[n] < a[1] * 0.9) }'; then
    ok "LoRA on FILE.gguf: held-out loss $vl"
else
    bad "LoRA on FILE.gguf: held-out losses '$vl'"; tail -3 "$T/ft.log"
fi
if "$PYT" -c 'import torch, transformers, peft' 2>/dev/null; then
    got=$(EN_QUANT_SIMD=avx2 "$ENERGON" eval --model "$G" --adapter "$T/run" \
          --data "$FX/text/smollm2_eval.txt" --json --threads 2 2>/dev/null |
          "$PY" -c 'import json,sys; print(json.load(sys.stdin)["nll"])')
    want=$("$PYT" - "$M" "$T/run" "$FX/chat/smollm2_eval.json" <<'EOF' 2>"$T/peft.err"
import json, sys, torch
from transformers import AutoModelForCausalLM
from peft import PeftModel
base = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
model = PeftModel.from_pretrained(base, sys.argv[2]).eval()
ids = json.load(open(sys.argv[3]))["ids"]
with torch.no_grad():
    lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
print(float(-lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].mean()))
EOF
)
    if [ -n "$want" ] && awk -v w="$want" -v g="$got" 'BEGIN { d = (w - g) / w; if (d < 0) d = -d; exit !(d <= 1e-4) }'; then
        ok "the adapter in PEFT on the transformers directory: nll $want = energon's $got"
    else
        bad "PEFT nll '$want' vs energon '$got'"; tail -3 "$T/peft.err"
    fi
else
    echo "  (skipping the PEFT check: torch, transformers or peft is not installed)"
fi

echo "test_smollm2_gguf: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
