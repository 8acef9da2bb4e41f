#!/usr/bin/env bash
# test_finetune_tools.sh ENERGON FIXTURES SHARED - `energon finetune` on chat
# records with tools (issue 16; the record format is in docs/tokenizers.md):
#  1. --dump-data of records with "tools", assistant "tool_calls" (arguments
#     as JSON text and as objects, content left out, null or text) and "tool"
#     results, checked in Python against the records themselves: every call
#     is trained as a <tool_call>\n{json}\n</tool_call> block whose JSON is
#     the record's call (name and parsed arguments), in order; every tool
#     result is untrained, in a <tool_response> block of a user turn; the
#     tools are in the untrained system text; nothing else of a tool turn is
#     trained. With the model's own template (SmolLM2's, which knows no
#     tools: energon's default format), the built-in chatml, and Qwen2.5's
#     template (hermes: the template renders the same blocks itself);
#  2. a few training steps: the reported record count, finite losses;
#  3. bad records (an unknown tool_call_id, "tools" not a list, arguments
#     that are not a JSON object) stop with FILE:LINE and the field, exit 1;
#     --skip-bad-records skips and counts them.
# A tiny model made here with the SmolLM2 tokenizer (SHARED/models/smollm2/
# tokenizer); skipped (77) without it or without python3.
set -u
ENERGON=$1
SHARED=${3:-}
TOK=$SHARED/models/smollm2/tokenizer
QWEN=$SHARED/models/real-tokenizers/templates/qwen2.5-instruct.jinja
if [ ! -f "$TOK/tokenizer.json" ]; then
    echo "SKIP: no SmolLM2 tokenizer at $TOK"
    exit 77
fi
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
T=$(mktemp -d /tmp/en_ftt_XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
ok() { printf '  ok %s\n' "$1"; pass=$((pass + 1)); }
bad() { printf 'FAIL %s\n' "$1"; fail=$((fail + 1)); }

cat >"$T/cfg.json" <<'JSON'
{"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
 "rms_norm_eps": 1e-5, "tie_word_embeddings": true}
JSON
"$ENERGON" init --config "$T/cfg.json" --tokenizer "$TOK" --out "$T/base" --seed 3 \
    >"$T/init.log" 2>&1 || { echo "FAIL: energon init"; cat "$T/init.log"; exit 1; }

# The records. Written by Python so that the JSON is right; calls are
# (id, name, arguments, given as JSON text or as an object).
python3 - "$T/tools.jsonl" <<'PY'
import json, sys
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers.",
     "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}}}}}]
def call(cid, name, args, text):
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args) if text else args}}
def u(s): return {"role": "user", "content": s}
def a(s): return {"role": "assistant", "content": s}
def t(cid, s): return {"role": "tool", "tool_call_id": cid, "content": s}
R = [
    {"tools": TOOLS, "messages": [
        u("Weather in Paris?"),
        {"role": "assistant", "tool_calls": [call("c1", "get_weather", {"city": "Paris"}, True)]},
        t("c1", "sunny, 21 C"), a("It is sunny and 21 C in Paris.")]},
    {"tools": TOOLS, "messages": [
        {"role": "system", "content": "Be brief."}, u("Weather in Oslo, and 2 + 3?"),
        {"role": "assistant", "content": None, "tool_calls": [
            call("c2", "get_weather", {"city": "Oslo"}, False),
            call("c3", "add", {"a": 2, "b": 3}, True)]},
        t("c2", "rain, 4 C"), t("c3", "5"), a("Rain and 4 C; 2 + 3 = 5.")]},
    {"tools": TOOLS, "messages": [
        u("Is Rome warm?"),
        {"role": "assistant", "content": "Let me check.",
         "tool_calls": [call("c4", "get_weather", {"city": "Rome"}, False)]},
        t("c4", "hot, 33 C"), a("Yes, 33 C.")]},
    {"messages": [
        u("Add 40 and 2."),
        {"role": "assistant", "tool_calls": [call("c5", "add", {"a": 40, "b": 2}, False)]},
        t("c5", "42"), a("42.")]},
    {"messages": [u("Say hello."), a("Hello!")]},
    {"tools": TOOLS, "messages": [u("What is a crate?"), a("A wooden box.")]},
]
with open(sys.argv[1], "w") as f:
    for r in R:
        f.write(json.dumps(r) + "\n")
PY

# The checks of section 1 on a --dump-data output (see the top).
cat >"$T/check.py" <<'PY'
import json, re, sys
records = [json.loads(l) for l in open(sys.argv[1])]
dump = open(sys.argv[2], encoding="utf-8").read()
texts = [m.group(1) for m in re.finditer(r"\ntext: (.*?)\n\n(?=window |\Z)", "\n" + dump, re.S)]
trained = "".join(s for t in texts for s in re.findall("\u27e6(.*?)\u27e7", t, re.S))
untrained = "".join(re.sub("\u27e6.*?\u27e7", "\x00", t, flags=re.S) for t in texts)
want = [{"name": c["function"]["name"],
         "arguments": c["function"]["arguments"] if isinstance(c["function"]["arguments"], dict)
         else json.loads(c["function"]["arguments"])}
        for r in records for m in r["messages"] for c in m.get("tool_calls", [])]
def blocks(s):
    out = []
    for b in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", s, re.S):
        try:
            out.append(json.loads(b))
        except ValueError:
            out.append("not JSON: " + b)  # the instructions' example in the system text
    return out
got = blocks(trained)
problems = []
if got != want:
    problems.append(f"trained calls {got} != the records' {want}")
if any(not isinstance(b, str) for b in blocks(untrained)):
    problems.append("an untrained call block")
for r in records:
    for m in r["messages"]:
        block = "<tool_response>\n" + str(m.get("content")) + "\n</tool_response>"
        if m["role"] == "tool" and ("<|im_start|>user\n" + block not in untrained and
                                    "</tool_response>\n" + block not in untrained):
            problems.append(f"tool result {m['content']!r} not in an untrained user turn")
    for tool in r.get("tools", []):
        if json.dumps(tool) not in untrained:
            problems.append(f"tool {tool['function']['name']} not in the untrained system text")
for s in ("Let me check.", "It is sunny and 21 C in Paris.", "Hello!", "A wooden box."):
    if s not in trained:
        problems.append(f"{s!r} not trained")
if "<tool_response>" in trained or "<tools>" in trained:
    problems.append("tool text trained")
print("; ".join(problems) if problems else f"{len(got)} calls trained as the records' calls, "
      f"{len(texts)} windows")
sys.exit(1 if problems else 0)
PY

FT=(finetune --model "$T/base" --seq-len 512 --threads 2)
# 1. what is trained, by template
for tmpl in model chatml "$QWEN"; do
    extra=()
    [ "$tmpl" != model ] && extra=(--chat-template "$tmpl")
    what=${tmpl##*/}
    if [ "$tmpl" = "$QWEN" ] && [ ! -f "$QWEN" ]; then
        echo "  (skipping the Qwen2.5 template: $QWEN is absent)"
        continue
    fi
    "$ENERGON" "${FT[@]}" --data "$T/tools.jsonl" "${extra[@]}" --dump-data 6 \
        >"$T/dump" 2>"$T/dump.err" ||
        { bad "$what: --dump-data: $(tail -1 "$T/dump.err")"; continue; }
    if out=$(python3 "$T/check.py" "$T/tools.jsonl" "$T/dump" 2>&1); then
        ok "$what template: $out; results and tools untrained"
    else
        bad "$what template: $out"
        head -c 3000 "$T/dump" | sed 's/^/  | /'
    fi
done

# 2. a few steps
"$ENERGON" "${FT[@]}" --data "$T/tools.jsonl" --batch 2 --steps 3 --lr 1e-3 --seed 5 \
    --eval-every 0 --out "$T/run" >"$T/run.log" 2>&1 ||
    bad "training run: $(tail -2 "$T/run.log")"
losses=$(sed -E 's/.*"loss":([^,]+),.*/\1/' "$T/run/metrics.jsonl" 2>/dev/null | paste -sd' ')
if grep -q "train: 6 records" "$T/run.log" && [ "$(echo "$losses" | wc -w)" -eq 3 ] &&
   awk -v l="$losses" 'BEGIN { n = split(l, a, " ")
       for (i = 1; i <= n; i++) if (!(a[i] + 0 > 0 && a[i] + 0 < 30)) exit 1 }'; then
    stats=$(grep -o 'train: 6 records, [0-9]* tokens ([0-9]* trained)' "$T/run.log" | head -1)
    ok "3 steps on the tools records: $stats, losses $losses"
else
    bad "training run: losses '$losses'; $(grep 'records,' "$T/run.log" | head -1)"
fi

# 3. bad records
expect() { # name rc needle -- cmd
    local name=$1 want=$2 needle=$3; shift 4
    "$@" >"$T/o" 2>"$T/e"; local rc=$?
    if [ "$rc" -eq "$want" ] && grep -qF -- "$needle" "$T/e"; then
        ok "$name: $(grep -F -- "$needle" "$T/e" | head -1 | sed "s|$T/||" | cut -c1-150)"
    else
        bad "$name: exit $rc (want $want), stderr: $(head -3 "$T/e")"
    fi
}
# a good record, then variants of it made bad
head -1 "$T/tools.jsonl" >"$T/good.jsonl"
variant() { # what out
    python3 - "$T/good.jsonl" "$1" >"$2" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read())
if sys.argv[2] == "id":
    r["messages"][2]["tool_call_id"] = "c9"
elif sys.argv[2] == "tools":
    r["tools"] = {"list": r["tools"]}
else:
    r["messages"][1]["tool_calls"][0]["function"]["arguments"] = "Paris"
print(json.dumps(r))
PY
}
variant id "$T/badid.line"
variant tools "$T/badtools.line"
variant args "$T/badargs.line"
cat "$T/good.jsonl" "$T/badid.line" >"$T/badid.jsonl"
expect "unknown tool_call_id" 1 \
    "badid.jsonl:2: messages[2].tool_call_id 'c9' is not the id of a call" -- \
    "$ENERGON" "${FT[@]}" --data "$T/badid.jsonl" --out "$T/x1"
cp "$T/badtools.line" "$T/badtools.jsonl"
expect "tools not a list" 1 "badtools.jsonl:1: tools must be a list of function tools" -- \
    "$ENERGON" "${FT[@]}" --data "$T/badtools.jsonl" --out "$T/x2"
cat "$T/good.jsonl" "$T/good.jsonl" "$T/badargs.line" >"$T/badargs.jsonl"
expect "arguments not a JSON object" 1 \
    "badargs.jsonl:3: messages[1].tool_calls[0].function.arguments must be a JSON object" -- \
    "$ENERGON" "${FT[@]}" --data "$T/badargs.jsonl" --out "$T/x3"
cat "$T/tools.jsonl" "$T/badid.line" "$T/badtools.line" "$T/badargs.line" >"$T/mixed.jsonl"
expect "--skip-bad-records" 0 \
    "skipped 3 malformed records (first: $T/mixed.jsonl:7: messages[2].tool_call_id" -- \
    "$ENERGON" "${FT[@]}" --data "$T/mixed.jsonl" --skip-bad-records --steps 1 --out "$T/x4"

echo "test_finetune_tools: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
