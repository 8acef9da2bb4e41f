#!/usr/bin/env bash
# test_convert_gguf.sh ENERGON FIXTURES SHARED
# `energon convert gguf` on SmolLM2-135M-Instruct.Q4_1.gguf, against the
# Hugging Face directory transformers made of the same file:
#   - every tensor bit-identical (python3's standard library reads both
#     safetensors files; this check is skipped without python3);
#   - `energon tokenizer encode` the same ids on both directories and on the
#     .gguf itself (--model FILE.gguf: the tokenizer built in memory from its
#     metadata), `render` the same prompt (the .gguf's tokenizer.chat_template
#     too), and greedy `generate --chat` the fixture's ids
#     (tests/fixtures/chat/smollm2_greedy.json case 0);
#   - stories260K.gguf (SentencePiece-style vocabulary): greedy generate and
#     encode equal to the llama2c conversion of the same model;
#   - clear errors and exit 1 for another architecture and a truncated file.
# The GGUF comes from $ENERGON_SMOLLM2_GGUF (default
# ~/.cache/energon/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf), the reference
# directory from $ENERGON_SMOLLM2_DIR (default ~/.cache/energon/smollm2/hf);
# without them the test is skipped (exit 77).
set -u
abspath() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
ENERGON=$(abspath "$1")
SHARED=$(abspath "${3:-.}")
G=${ENERGON_SMOLLM2_GGUF:-$HOME/.cache/energon/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
M=${ENERGON_SMOLLM2_DIR:-$HOME/.cache/energon/smollm2/hf}
if ! [ -f "$G" ] || ! [ -f "$M/model.safetensors" ] || ! [ -f "$M/tokenizer.json" ]; then
    echo "SKIP test_convert_gguf: need $G and the transformers directory $M (make both with" \
         "../shared/models/smollm2/get.sh ~/.cache/energon/smollm2 --hf, or set" \
         "ENERGON_SMOLLM2_GGUF / ENERGON_SMOLLM2_DIR)"
    exit 77
fi
T=$(mktemp -d /tmp/en_convert_gguf_XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
O=$T/out

# ---- convert
if "$ENERGON" convert gguf --gguf "$G" --out "$O" 2>"$T/conv.err"; then
    ok "convert gguf"
else
    bad "convert gguf"; cat "$T/conv.err"
fi
for f in config.json model.safetensors tokenizer.json tokenizer_config.json \
         generation_config.json chat_template.jinja; do
    [ -f "$O/$f" ] || bad "missing $f"
done
grep -q '"tie_word_embeddings": true' "$O/config.json" && grep -q '"rope_theta": 100000' "$O/config.json" \
    && grep -q '"num_key_value_heads": 3' "$O/config.json" && ok "config.json" || bad "config.json"
cmp -s "$O/chat_template.jinja" "$M/chat_template.jinja" && ok "chat_template.jinja" || bad "chat_template.jinja"

# ---- tensors bit-identical
if command -v python3 >/dev/null; then
    if python3 - "$O/model.safetensors" "$M/model.safetensors" <<'PYEOF'
import json, struct, sys
def load(p):
    data = open(p, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    h = json.loads(data[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
print("%d tensors, %d differ %s" % (len(a), len(diff), diff[:4]))
sys.exit(1 if diff or not a else 0)
PYEOF
    then ok "tensors bit-identical to transformers'"; else bad "tensors differ"; fi
else
    echo "skip tensor comparison: no python3"
fi

# ---- tokenizer and chat template: the same as the transformers directory
for text in "Hello world" $'  The quick brown fox, isn\'t it?\n123 4567 ünïcödé 日本語' \
            $'<|im_start|>user\nhi<|im_end|>' $'def f(x):\n\treturn x**2  # ok\n\n'; do
    a=$("$ENERGON" tokenizer encode --model "$O" --text "$text" --bos 2>&1)
    b=$("$ENERGON" tokenizer encode --model "$M" --text "$text" --bos 2>&1)
    c=$("$ENERGON" tokenizer encode --model "$G" --text "$text" --bos 2>&1)
    [ -n "$a" ] && [ "$a" = "$b" ] && ok "encode '$text' ($a)" || bad "encode '$text': '$a' vs '$b'"
    [ "$c" = "$b" ] && ok "encode --model FILE.gguf '$text'" || bad "encode --model FILE.gguf '$text': '$c' vs '$b'"
done
cat >"$T/msgs.json" <<'JEOF'
[{"role": "system", "content": "You are terse."},
 {"role": "user", "content": "Name a colour."},
 {"role": "assistant", "content": "Blue."},
 {"role": "user", "content": "Another?"}]
JEOF
"$ENERGON" tokenizer render --model "$O" --messages "$T/msgs.json" --add-generation-prompt >"$T/r1.txt" 2>&1
"$ENERGON" tokenizer render --model "$M" --messages "$T/msgs.json" --add-generation-prompt >"$T/r2.txt" 2>&1
[ -s "$T/r1.txt" ] && cmp -s "$T/r1.txt" "$T/r2.txt" && ok "render" || { bad "render"; diff "$T/r1.txt" "$T/r2.txt" | head; }
"$ENERGON" tokenizer render --model "$G" --messages "$T/msgs.json" --add-generation-prompt >"$T/r3.txt" 2>&1
cmp -s "$T/r3.txt" "$T/r2.txt" && ok "render --model FILE.gguf" || { bad "render --model FILE.gguf"; diff "$T/r3.txt" "$T/r2.txt" | head; }
FX=$(abspath "${2:-tests/fixtures}")
"$ENERGON" tokenizer encode --model "$FX/gguf/all_types.gguf" --text hi >"$T/e.out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "all_types.gguf: no tokenizer in the metadata (tokenizer.ggml.model missing)" "$T/e.out" \
    && ok "GGUF without a tokenizer: $(cat "$T/e.out")" || bad "GGUF without a tokenizer (rc $rc): $(cat "$T/e.out")"

# ---- greedy generation = transformers' (fixture case 0)
"$ENERGON" generate --model "$O" --chat --prompt "What is the capital of France?" --temperature 0 \
    --max-tokens 48 --json --threads 2 >"$T/gen.json" 2>"$T/gen.err"
grep -q '"ids":\[504,3575,282,4649,314,7042,30\]' "$T/gen.json" && grep -q '"finish_reason":"stop"' "$T/gen.json" \
    && ok "generate --chat greedy = transformers" || { bad "generate: $(cat "$T/gen.json")"; cat "$T/gen.err"; }

# ---- bad input: clear error, exit 1
expect_error() { # NAME PATTERN FILE
    "$ENERGON" convert gguf --gguf "$3" --out "$T/bad" >"$T/e.out" 2>&1
    rc=$?
    if [ $rc -eq 1 ] && grep -q -- "$2" "$T/e.out"; then ok "$1: $(head -c 200 "$T/e.out")"
    else bad "$1 (rc $rc): $(cat "$T/e.out")"; fi
}
# a minimal GGUF v3: no tensors, one key general.architecture = "gemma"
{
    printf 'GGUF\x03\x00\x00\x00'
    printf '\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00'
    printf '\x14\x00\x00\x00\x00\x00\x00\x00general.architecture\x08\x00\x00\x00'
    printf '\x05\x00\x00\x00\x00\x00\x00\x00gemma'
} >"$T/gemma.gguf"
expect_error "another architecture" "general.architecture 'gemma' is not supported" "$T/gemma.gguf"
head -c 3000000 "$G" >"$T/trunc.gguf"
expect_error "truncated file" "trunc.gguf" "$T/trunc.gguf"
expect_error "missing file" "nonexistent.gguf" "$T/nonexistent.gguf"

# ---- stories260K: a SentencePiece-style vocabulary, against `convert llama2c`
SD=$SHARED/models/stories260K
if [ -f "$SD/stories260K.gguf" ] && [ -f "$SD/stories260K.bin" ] && [ -f "$SD/tok512.model" ]; then
    "$ENERGON" convert gguf --gguf "$SD/stories260K.gguf" --out "$T/s1" 2>"$T/s1.err" || { bad "convert stories260K.gguf"; cat "$T/s1.err"; }
    "$ENERGON" convert llama2c --checkpoint "$SD/stories260K.bin" --tokenizer "$SD/tok512.model" \
        --out "$T/s2" 2>"$T/s2.err" || { bad "convert llama2c"; cat "$T/s2.err"; }
    for p in "Once upon a time" "Lily and Tom went to the park. They saw"; do
        a=$("$ENERGON" generate --model "$T/s1" --prompt "$p" --temperature 0 --max-tokens 40 --json 2>/dev/null)
        b=$("$ENERGON" generate --model "$T/s2" --prompt "$p" --temperature 0 --max-tokens 40 --json 2>/dev/null)
        [ -n "$a" ] && [ "$a" = "$b" ] && ok "stories260K greedy '$p' = llama2c conversion" || bad "stories260K greedy '$p': $a vs $b"
    done
    for text in "Once upon a time, there was a little girl." $'She said: "No!"\nThe end. 123' "ünï 日本"; do
        a=$("$ENERGON" tokenizer encode --model "$T/s1" --text "$text" --bos 2>&1)
        b=$("$ENERGON" tokenizer encode --model "$T/s2" --text "$text" --bos 2>&1)
        c=$("$ENERGON" tokenizer encode --model "$SD/stories260K.gguf" --text "$text" --bos 2>&1)
        [ -n "$a" ] && [ "$a" = "$b" ] && ok "stories260K encode '$text' ($a)" || bad "stories260K encode '$text': '$a' vs '$b'"
        [ "$c" = "$b" ] && ok "stories260K encode --model FILE.gguf" || bad "stories260K encode --model FILE.gguf '$text': '$c' vs '$b'"
    done
else
    echo "skip stories260K: not in $SD"
fi
"$ENERGON" convert gguf --out "$T/x" >/dev/null 2>&1
[ $? -eq 2 ] && ok "missing --gguf is a usage error" || bad "missing --gguf exit code"

echo "test_convert_gguf: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
