#!/usr/bin/env bash
# test_cli_errors.sh ENERGON FIXTURES SHARED
# Bad input to the energon command line: every case must exit with the
# documented code (2 for usage, 1 for bad data), never die from a signal,
# and print a message that names the flag, file or field at fault.
set -u
ENERGON=$1
FIX=$2
SHARED=${3:-}
T=$(mktemp -d /tmp/en_cli_XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0

# expect NAME WANT_RC NEEDLE -- command...
expect() {
    local name=$1 want=$2 needle=$3
    shift 4
    "$@" >"$T/out" 2>"$T/err" </dev/null
    local rc=$?
    if [ "$rc" -ne "$want" ]; then
        echo "FAIL $name: exit $rc, want $want"; sed 's/^/  | /' "$T/err" | head -5; fail=$((fail + 1)); return
    fi
    if ! grep -qF -- "$needle" "$T/err"; then
        echo "FAIL $name: stderr lacks '$needle':"; sed 's/^/  | /' "$T/err" | head -5; fail=$((fail + 1)); return
    fi
    printf '  ok %-34s %s\n' "$name" "$(head -c 150 "$T/err" | head -n 1)"
    pass=$((pass + 1))
}

# A small model with a tokenizer: a fixture model (llama_bf16, vocab 320) plus a
# SentencePiece model of 300 pieces trained here.
M=$T/model
mkdir -p "$M"
cp "$FIX/hf/llama_bf16/config.json" "$FIX/hf/llama_bf16/model.safetensors" "$M/"
for i in $(seq 1 200); do
    echo "Line $i: the quick brown fox jumps over the lazy dog; énergie, naïve café $((i * 7))."
done >"$T/train.txt"
if ! "$ENERGON" tokenizer train --data "$T/train.txt" --vocab-size 320 --out "$M/tokenizer.model" >"$T/tr.log" 2>&1; then
    echo "FAIL: could not train the test tokenizer"; cat "$T/tr.log"; exit 1
fi

# usage errors
expect "no command" 2 "usage" -- "$ENERGON"
expect "unknown command" 2 "unknown command 'frobnicate'" -- "$ENERGON" frobnicate
expect "generate without --model" 2 "--model" -- "$ENERGON" generate --prompt hi
expect "generate without --prompt" 2 "--prompt" -- "$ENERGON" generate --model "$M"
expect "unknown flag" 2 "unknown argument '--bogus'" -- "$ENERGON" generate --model "$M" --prompt hi --bogus
expect "flag without value" 2 "--max-tokens needs a value" -- "$ENERGON" generate --model "$M" --prompt hi --max-tokens
expect "temperature not a number" 2 "--temperature: 'warm' is not a number" -- "$ENERGON" generate --model "$M" --prompt hi --temperature warm
expect "top-p out of range" 2 "--top-p: 2 is out of range" -- "$ENERGON" generate --model "$M" --prompt hi --top-p 2
expect "negative max-tokens" 2 "--max-tokens: -5 is out of range" -- "$ENERGON" generate --model "$M" --prompt hi --max-tokens -5
expect "bad device" 2 "--device: 'tpu'" -- "$ENERGON" generate --model "$M" --prompt hi --device tpu
expect "bench unknown mode" 2 "unknown benchmark 'train2'" -- "$ENERGON" bench train2 --model "$M"

# --device cuda: this build may or may not have CUDA compiled in, and these
# machines have no GPU; either way the answer is a clear refusal, never a
# silent fallback to the CPU. (Skipped where a GPU is visible: there they work.)
if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "  (skipping the --device cuda refusals: a GPU is visible)"
else
    expect "device cuda without a GPU" 1 "CUDA" -- "$ENERGON" generate --model "$M" --prompt hi --device cuda
    expect "finetune --device cuda without a GPU" 1 "CUDA" -- "$ENERGON" finetune --model "$M" --data "$T/train.txt" --steps 1 --out "$T/ft_cuda" --device cuda
fi
expect "finetune bad device" 2 "--device: 'tpu' is not one of cpu, cuda" -- "$ENERGON" finetune --model "$M" --data "$T/train.txt" --steps 1 --out "$T/ft_tpu" --device tpu
expect "finetune bf16 on the CPU" 2 "--precision bf16 needs --device cuda" -- "$ENERGON" finetune --model "$M" --data "$T/train.txt" --steps 1 --out "$T/ft_bf16" --precision bf16
expect "finetune bad precision" 2 "--precision: 'fp8' is not one of fp32, tf32, bf16" -- "$ENERGON" finetune --model "$M" --data "$T/train.txt" --steps 1 --out "$T/ft_fp8" --device cuda --precision fp8

# bad models
expect "missing model dir" 1 "$T/nope/config.json: cannot open" -- "$ENERGON" generate --model "$T/nope" --prompt hi
B=$T/trunc; mkdir -p "$B"; cp "$M"/* "$B/"
head -c 5000 "$M/model.safetensors" >"$B/model.safetensors"
expect "truncated safetensors" 1 "$B/model.safetensors: tensor" -- "$ENERGON" generate --model "$B" --prompt hi
B=$T/noweights; mkdir -p "$B"; cp "$M/config.json" "$M/tokenizer.model" "$B/"
expect "missing safetensors" 1 "no model.safetensors" -- "$ENERGON" generate --model "$B" --prompt hi
B=$T/badtype; mkdir -p "$B"; cp "$M"/* "$B/"
sed -i 's/"model_type": *"llama"/"model_type": "bloom"/' "$B/config.json"
expect "unknown model_type" 1 "unknown model_type 'bloom'" -- "$ENERGON" generate --model "$B" --prompt hi
B=$T/notok; mkdir -p "$B"; cp "$M/config.json" "$M/model.safetensors" "$B/"
expect "no tokenizer" 1 "$B: no tokenizer.json or tokenizer.model" -- "$ENERGON" generate --model "$B" --prompt hi
B=$T/badjson; mkdir -p "$B"; cp "$M"/* "$B/"; echo '{"model": {"type": "BPE", "vocab": {"a": 0' >"$B/tokenizer.json"
expect "truncated tokenizer.json" 1 "$B/tokenizer.json" -- "$ENERGON" generate --model "$B" --prompt hi
printf 'Hi\n{%% if %%}x{%% endif %%}\n' >"$T/bad.jinja"
expect "template syntax error" 1 "$T/bad.jinja:2:" -- "$ENERGON" generate --model "$M" --chat --chat-template "$T/bad.jinja" --prompt hi
expect "unknown template name" 2 "--chat-template: unknown chat template" -- "$ENERGON" generate --model "$M" --chat --chat-template vicuna --prompt hi
expect "template without --chat" 2 "--chat-template needs --chat" -- "$ENERGON" generate --model "$M" --chat-template plain --prompt hi
B=$T/badtok; mkdir -p "$B"; cp "$M"/* "$B/"; echo "not a model" >"$B/tokenizer.model"
expect "garbage tokenizer" 1 "$B/tokenizer.model" -- "$ENERGON" generate --model "$B" --prompt hi

B=$T/shards; cp -r "$FIX/hf/llama_sharded" "$B"; cp "$M/tokenizer.model" "$B/"
rm "$B/model-00003-of-00006.safetensors"
expect "sharded: a shard is missing" 1 "$B/model-00003-of-00006.safetensors: cannot open" -- "$ENERGON" generate --model "$B" --prompt hi
B=$T/badindex; cp -r "$FIX/hf/llama_sharded" "$B"
echo '{"weight_map": {"model.norm.weight": "../../etc/passwd"}}' >"$B/model.safetensors.index.json"
expect "sharded: index escapes the dir" 1 "must be a plain file name" -- "$ENERGON" generate --model "$B" --prompt hi
echo '{"weight_map": {"model.norm.weight": "pytorch_model-00001-of-00002.bin"}}' >"$B/model.safetensors.index.json"
expect "sharded: index names a .bin shard" 1 "weight_map['model.norm.weight']: shard name 'pytorch_model-00001-of-00002.bin' must end in .safetensors" -- "$ENERGON" generate --model "$B" --prompt hi
echo '{"weight_map": {"a": "model-00001-of-00006.safetensors", "a": "model-00002-of-00006.safetensors"}}' >"$B/model.safetensors.index.json"
expect "sharded: a tensor named twice" 1 "duplicate object key" -- "$ENERGON" generate --model "$B" --prompt hi

# bad prompts
expect "non-UTF-8 prompt" 1 "--prompt: " -- "$ENERGON" generate --model "$M" --prompt "$(printf 'caf\xe9 au lait')"
long=$(for i in $(seq 1 40); do printf 'the quick brown fox '; done)
expect "prompt longer than context" 1 "the context holds 16" -- "$ENERGON" generate --model "$M" --prompt "$long" --ctx 16
expect "ctx beyond the model" 1 "exceeds the model's max_position_embeddings" -- "$ENERGON" generate --model "$M" --prompt hi --ctx 100000

# eval input
expect "eval missing data" 1 "$T/missing.txt: cannot open" -- "$ENERGON" eval --model "$M" --data "$T/missing.txt"
printf 'ok text \xff\xfe bad bytes\n' >"$T/bad.txt"
expect "eval non-UTF-8 data" 1 "$T/bad.txt" -- "$ENERGON" eval --model "$M" --data "$T/bad.txt"
printf 'not gzip at all, but named .gz' >"$T/fake.gz"
printf '\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage' >"$T/corrupt.gz"
expect "eval corrupt gzip" 1 "$T/corrupt.gz" -- "$ENERGON" eval --model "$M" --data "$T/corrupt.gz"
: >"$T/empty.txt"
expect "eval empty file" 1 "$T/empty.txt: no text to score" -- "$ENERGON" eval --model "$M" --data "$T/empty.txt"

# llama2c conversion input
head -c 1000 "$FIX/hf/llama_bf16/model.safetensors" >"$T/junk.bin"
expect "convert junk checkpoint" 1 "$T/junk.bin" -- "$ENERGON" convert llama2c --checkpoint "$T/junk.bin" --tokenizer "$M/tokenizer.model" --out "$T/conv"
# a model that does not fit in memory is refused before loading, with the sizes
expect "weights over the memory limit" 1 "the weights need 196.25 KiB as bf16 but only 1000 bytes" -- env EN_MEMORY_LIMIT=1000 "$ENERGON" generate --model "$M" --prompt hi
expect "q4 weights over the limit" 1 "free memory or use a smaller model" -- env EN_MEMORY_LIMIT=1000 "$ENERGON" generate --model "$M" --prompt hi --weights q4
expect "serve --omp-wait bad" 2 "--omp-wait: 'sometimes' is not auto, spin or passive" -- "$ENERGON" serve --model "$M" --omp-wait sometimes
expect "serve --request-timeout 0" 2 "--request-timeout: 0 is out of range [1, 86400]" -- "$ENERGON" serve --model "$M" --request-timeout 0
expect "serve --max-client-connections -1" 2 "--max-client-connections: -1 is out of range [1, 65536]" -- "$ENERGON" serve --model "$M" --max-client-connections -1
expect "serve --http-threads 100" 2 "--http-threads: 100 is out of range [1, 64]" -- "$ENERGON" serve --model "$M" --http-threads 100
expect "serve --index missing" 2 "--index: $T/none.db" -- "$ENERGON" serve --model "$M" --index "$T/none.db"
printf 'not a database' >"$T/notindex.db"
expect "serve --index not an index" 2 "--index: $T/notindex.db is not an energon index" -- "$ENERGON" serve --model "$M" --index "$T/notindex.db"
if [ -f "$SHARED/models/stories260K/stories260K.bin" ]; then
    head -c 500000 "$SHARED/models/stories260K/stories260K.bin" >"$T/s260.bin"
    expect "convert truncated stories260K" 1 "the header implies 1056540" -- "$ENERGON" convert llama2c --checkpoint "$T/s260.bin" --tokenizer "$SHARED/models/stories260K/tok512.model" --out "$T/conv"
    expect "convert with wrong tokenizer" 1 "has 320 pieces but the checkpoint's vocab_size is 512" -- "$ENERGON" convert llama2c --checkpoint "$SHARED/models/stories260K/stories260K.bin" --tokenizer "$M/tokenizer.model" --out "$T/conv"
else
    echo "  (skipping the stories260K conversion cases: $SHARED/models is absent)"
fi

# The good paths still work: gzip input equals plain input.
"$ENERGON" eval --model "$M" --data "$T/train.txt" --json >"$T/plain.json" 2>/dev/null
gzip -c "$T/train.txt" >"$T/train.txt.gz"
"$ENERGON" eval --model "$M" --data "$T/train.txt.gz" --json >"$T/gz.json" 2>/dev/null
if [ -s "$T/plain.json" ] && cmp -s "$T/plain.json" "$T/gz.json"; then
    echo "  ok eval of .gz equals plain text     $(cat "$T/gz.json")"; pass=$((pass + 1))
else
    echo "FAIL eval .gz vs plain: $(cat "$T/plain.json") vs $(cat "$T/gz.json")"; fail=$((fail + 1))
fi

echo "test_cli_errors: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
