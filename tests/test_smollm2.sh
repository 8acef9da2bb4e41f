#!/usr/bin/env bash
# test_smollm2.sh ENERGON FIXTURES SHARED
# A real instruct model with a tokenizer.json and a Jinja chat template,
# SmolLM2-135M-Instruct, through the commands a user runs, against
# transformers (tests/fixtures/chat/*.json, written by tests/gen/):
#   - `energon tokenizer encode` and `render` give transformers' ids and prompt;
#   - `energon generate --chat` (temperature 0) gives transformers' greedy
#     answer ids and stops at <|im_end|> (generation_config's eos_token_id);
#   - `energon serve` answers the official openai client, streamed and not,
#     with the same text and finish_reason "stop", answers a bad request with
#     400, and keeps serving.
# The model's Hugging Face directory is made by
# ../shared/models/smollm2/get.sh DIR --hf (torch, transformers); it is read
# from $ENERGON_SMOLLM2_DIR, default ~/.cache/energon/smollm2/hf. Without it
# the test is skipped (exit 77) and says how to make it. (Fine-tuning this
# model is in test_finetune.sh.)
set -u
abspath() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
ENERGON=$(abspath "$1")
FIX=$(abspath "$2")
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PY=${EN_TEST_PYTHON:-$ROOT/.venv-test/bin/python}
M=${ENERGON_SMOLLM2_DIR:-$HOME/.cache/energon/smollm2/hf}
if ! [ -f "$M/model.safetensors" ] || ! [ -f "$M/tokenizer.json" ]; then
    echo "SKIP test_smollm2: no SmolLM2-135M-Instruct at $M (make it with" \
         "../shared/models/smollm2/get.sh ~/.cache/energon/smollm2 --hf, or set ENERGON_SMOLLM2_DIR)"
    exit 77
fi
if ! [ -x "$PY" ] || ! "$PY" -c 'import openai' 2>/dev/null; then
    echo "SKIP test_smollm2: the openai Python client is missing ($PY); run scripts/install-deps"
    exit 77
fi
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
T=$(mktemp -d /tmp/en_smollm2_XXXXXX)
SPID=
cleanup() {
    [ -n "$SPID" ] && kill -KILL "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
GREEDY=$FIX/chat/smollm2_greedy.json
# field CASE KEY: a value of the greedy fixture, as JSON
field() { "$PY" -c 'import json,sys; c=json.load(open(sys.argv[1]))["cases"][int(sys.argv[2])]; print(json.dumps(c[sys.argv[3]]))' "$GREEDY" "$1" "$2"; }

# ---- tokenizer encode / render against transformers
want=$("$PY" -c 'import json,sys; t=json.load(open(sys.argv[1]))["texts"][2]; print(" ".join(map(str, t["ids_special"])))' "$FIX/chat/smollm2.json")
text=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["texts"][2]["text"])' "$FIX/chat/smollm2.json")
got=$("$ENERGON" tokenizer encode --model "$M" --text "$text" --bos 2>&1)
[ "$got" = "$want" ] && ok "tokenizer encode = transformers ($got)" || bad "tokenizer encode: '$got', want '$want'"
"$PY" -c 'import json,sys; c=json.load(open(sys.argv[1]))["chat"][1]; json.dump(c["messages"], open(sys.argv[2],"w")); open(sys.argv[3],"w").write(c["text"])' \
    "$FIX/chat/smollm2.json" "$T/msgs.json" "$T/want.txt"
"$ENERGON" tokenizer render --model "$M" --messages "$T/msgs.json" --add-generation-prompt >"$T/got.txt" 2>"$T/render.err"
cmp -s "$T/got.txt" "$T/want.txt" && ok "tokenizer render = apply_chat_template" || { bad "tokenizer render differs"; diff "$T/got.txt" "$T/want.txt" | head; cat "$T/render.err"; }

# ---- generate --chat, greedy, against transformers' greedy answer
for c in 0 1; do
    sys_arg=()
    prompt=$("$PY" -c 'import json,sys; m=json.load(open(sys.argv[1]))["cases"][int(sys.argv[2])]["messages"]; print(m[-1]["content"])' "$GREEDY" "$c")
    system=$("$PY" -c 'import json,sys; m=json.load(open(sys.argv[1]))["cases"][int(sys.argv[2])]["messages"]; print(m[0]["content"] if m[0]["role"]=="system" else "")' "$GREEDY" "$c")
    [ -n "$system" ] && sys_arg=(--system "$system")
    "$ENERGON" generate --model "$M" --chat "${sys_arg[@]}" --prompt "$prompt" --temperature 0 \
        --max-tokens 48 --json --threads 2 >"$T/gen$c.json" 2>"$T/gen$c.err"
    if "$PY" - "$T/gen$c.json" "$GREEDY" "$c" <<'EOF'
import json, sys
got = json.load(open(sys.argv[1]))
case = json.load(open(sys.argv[2]))["cases"][int(sys.argv[3])]
want_ids = case["answer_ids"][:-1] if case["stopped"] else case["answer_ids"]
ok = got["ids"] == want_ids and got["text"] == case["answer"] and got["finish_reason"] == ("stop" if case["stopped"] else "length") \
     and got["prompt_tokens"] == len(case["prompt_ids"])
print(("" if ok else "MISMATCH ") + json.dumps(got)[:300])
sys.exit(0 if ok else 1)
EOF
    then ok "generate --chat case $c = transformers greedy"; else bad "generate --chat case $c"; cat "$T/gen$c.err"; fi
done

# ---- serve with the openai client
# start_server LOG [ARGS...]: serve SmolLM2 in the background; sets SPID, and
# URL once the "listening on" line is out (empty if it never came).
start_server() {
    local log=$1
    shift
    "$ENERGON" serve --model "$M" --port 0 --threads 2 --model-name smollm2 "$@" >"$log" 2>&1 &
    SPID=$!
    URL=
    for _ in $(seq 1 600); do
        URL=$(grep -o 'listening on http://[^ ]*' "$log" | head -1 | sed 's/listening on //')
        [ -n "$URL" ] && break
        kill -0 "$SPID" 2>/dev/null || break
        sleep 0.1
    done
}
start_server "$T/serve.log"
if [ -z "$URL" ]; then
    bad "serve did not start"; cat "$T/serve.log"
else
    grep -q "chat template .*chat_template.jinja" "$T/serve.log" && ok "serve uses the model's chat_template.jinja" || bad "serve template: $(grep listening "$T/serve.log")"
    if "$PY" - "$URL" "$GREEDY" <<'EOF'
import json, sys, urllib.request, urllib.error
import openai
url, fx = sys.argv[1], json.load(open(sys.argv[2]))
c = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=300)
fails = 0
for i, case in enumerate(fx["cases"][:2]):
    r = c.chat.completions.create(model="smollm2", messages=case["messages"], temperature=0, max_tokens=48)
    got = r.choices[0].message.content
    good = got == case["answer"] and r.choices[0].finish_reason == "stop" and r.usage.prompt_tokens == len(case["prompt_ids"])
    print("ok  " if good else "BAD ", "chat", i, repr(got), r.choices[0].finish_reason, r.usage)
    fails += not good
    parts, finish = [], None
    for ch in c.chat.completions.create(model="smollm2", messages=case["messages"], temperature=0, max_tokens=48, stream=True):
        if ch.choices and ch.choices[0].delta.content:
            parts.append(ch.choices[0].delta.content)
        if ch.choices and ch.choices[0].finish_reason:
            finish = ch.choices[0].finish_reason
    good = "".join(parts) == case["answer"] and finish == "stop"
    print("ok  " if good else "BAD ", "stream", i, repr("".join(parts)), finish)
    fails += not good
# a bad request: 400 naming the field, and the server goes on
try:
    c.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": {"x": 1}}], max_tokens=4)
    print("BAD  no error for an object content"); fails += 1
except openai.BadRequestError as e:
    print("ok   400:", str(e)[:160])
r = c.chat.completions.create(model="smollm2", messages=fx["cases"][0]["messages"], temperature=0, max_tokens=48)
fails += r.choices[0].message.content != fx["cases"][0]["answer"]
sys.exit(1 if fails else 0)
EOF
    then ok "serve: openai client, streamed and not, = transformers greedy; 400 on bad input"; else bad "serve with the openai client"; tail -20 "$T/serve.log"; fi
    kill -TERM "$SPID"; wait "$SPID"; rc=$?; SPID=
    [ $rc -eq 0 ] && ok "serve exits 0 on SIGTERM" || bad "serve exit $rc"
fi
# ---- a template that raises: 400 with its message, and the server goes on
cat >"$T/strict.jinja" <<'JINJA'
{%- for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported by this template') }}{% endif %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}
JINJA
start_server "$T/serve2.log" --chat-template "$T/strict.jinja"
if [ -n "$URL" ] && "$PY" - "$URL" <<'EOF'
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", timeout=300)
try:
    c.chat.completions.create(model="smollm2", max_tokens=4,
                              messages=[{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}])
    print("BAD  no error"); sys.exit(1)
except openai.BadRequestError as e:
    print("ok   400:", str(e)[:200])
    if "System role not supported by this template" not in str(e): sys.exit(1)
r = c.chat.completions.create(model="smollm2", max_tokens=8, temperature=0,
                              messages=[{"role": "user", "content": "What is the capital of France?"}])
print("ok   then:", repr(r.choices[0].message.content))
sys.exit(0 if r.choices[0].message.content else 1)
EOF
then ok "serve: a template that raises gives 400 with its message, then serves"; else bad "serve with a raising template"; tail "$T/serve2.log"; fi
if [ -n "$SPID" ]; then kill -TERM "$SPID"; wait "$SPID"; SPID=; fi

echo "test_smollm2: $pass passed, $fail failed"
[ $fail -eq 0 ]
