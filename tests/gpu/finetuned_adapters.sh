#!/usr/bin/env bash
# tests/gpu/finetuned_adapters.sh - on a GPU machine: tests/serve/
# finetuned_adapters.py against `energon serve --device cuda`, with
# `energon generate --device cuda` as the reference. The base is a random
# model made here (examples/company's shape, tokenizer trained on its
# handbook: ../shared is not on a device machine); three LoRA adapters are
# trained on the CPU by `energon finetune` (the third handed to the running
# server with --serve-url), as test_serve.sh does with stories260K.
# Builds into build-gpu unless EN_BUILD names a built tree. Python: the
# standard library only.
set -uo pipefail
HERE=$(cd "$(dirname "$0")/../.." && pwd)
OUTD=${OUT:-/tmp}/finetuned-adapters
mkdir -p "$OUTD"
B=${EN_BUILD:-$HERE/build-gpu}
export LD_LIBRARY_PATH=${EN_LD:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [ -z "${EN_BUILD:-}" ]; then
    cmake -S "$HERE" -B "$B" -DCMAKE_BUILD_TYPE=Release -DENERGON_WERROR=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 ${EN_EXTRA_CMAKE:-} >"$OUTD/cmake.log" 2>&1 ||
        { tail -30 "$OUTD/cmake.log"; exit 1; }
    cmake --build "$B" -j "$(nproc)" --target energon >"$OUTD/build.log" 2>&1 ||
        { tail -30 "$OUTD/build.log"; exit 1; }
fi
E=$B/energon
M=$OUTD/model FT=$OUTD/ft
mkdir -p "$M" "$FT"
sed -e 's/"tie_word_embeddings": true/"tie_word_embeddings": false/' \
    -e 's/"max_position_embeddings": [0-9]*/"max_position_embeddings": 512/' \
    "$HERE/examples/company/base_model.json" >"$OUTD/config.json"
{ "$E" tokenizer train --data "$HERE/examples/company/handbook.txt" --vocab-size 512 \
      --out "$OUTD/tok.model" &&
  "$E" init --config "$OUTD/config.json" --tokenizer "$OUTD/tok.model" --out "$M" --seed 1; } \
    >"$OUTD/setup.log" 2>&1 || { tail -5 "$OUTD/setup.log"; exit 1; }
ft() { # NAME DATA ARGS...
    local name=$1 data=$2
    shift 2
    "$E" finetune --model "$M" --data "$HERE/examples/company/$data" --out "$FT/$name" \
        --threads 4 --seq-len 64 --batch 2 --save-every 1000 "$@" >>"$OUTD/ft.log" 2>&1
}
ft dept-handbook handbook.txt --lora-rank 8 --steps 40 --lr 3e-3 &&
    ft dept-policies policies.txt --lora-rank 8 --steps 40 --lr 3e-3 --seed 2 &&
    ft big handbook.txt --lora-rank 64 --lora-targets q,k,v,o,gate,up,down --steps 2 &&
    ft over handbook.txt --lora-rank 96 --steps 2 || { tail -5 "$OUTD/ft.log"; exit 1; }
PORT=8811
"$E" serve --model "$M" --device cuda --port $PORT --model-name base --max-lora-rank 64 \
    --adapter "dept-handbook=$FT/dept-handbook" --adapter "dept-policies=$FT/dept-policies" \
    --adapter-dir "$FT" >"$OUTD/serve.log" 2>&1 &
SPID=$!
trap 'kill $SPID 2>/dev/null' EXIT
for _ in $(seq 1 600); do
    env -u LD_LIBRARY_PATH curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    sleep 0.1
done
ft dept-products products.txt --lora-rank 8 --steps 40 --lr 3e-3 --seed 3 \
    --serve-url "http://127.0.0.1:$PORT" || { tail -3 "$OUTD/ft.log"; exit 1; }
cd "$HERE/tests/serve" &&
    env -u LD_LIBRARY_PATH EN_URL="http://127.0.0.1:$PORT" EN_SERVER_PID=$SPID EN_MODEL_DIR="$M" \
        EN_MODEL_NAME=base EN_ENERGON="$E" EN_FT_DIR="$FT" EN_FT_HANDED=1 EN_DEVICE=cuda \
        EN_FOREIGN_ADAPTER="$HERE/tests/fixtures/grad/llama_gqa_tied_lora_adapter" \
        EN_GEN_LD="${EN_LD:-}" python3 -u finetuned_adapters.py
