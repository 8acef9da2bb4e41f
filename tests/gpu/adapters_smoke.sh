#!/usr/bin/env bash
# tests/gpu/adapters_smoke.sh - on a GPU machine: build, the CUDA op and
# training tests, then `energon serve --device cuda` with a named PEFT
# adapter (tests/fixtures/grad/llama_gqa_tied_lora_adapter) beside the base
# and a second adapter loaded over HTTP: the top log-probabilities of the
# base and of the adapter through /v1/completions against the same server
# on the CPU (within 1e-3), and 12 mixed concurrent requests equal alone.
set -uo pipefail
HERE=$(cd "$(dirname "$0")/../.." && pwd)
OUTD=${OUT:-/tmp}/adapters-smoke
mkdir -p "$OUTD"
B=$HERE/build-gpu
cmake -S "$HERE" -B "$B" -DCMAKE_BUILD_TYPE=Release -DENERGON_WERROR=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 ${EN_EXTRA_CMAKE:-} >"$OUTD/cmake.log" 2>&1 ||
    { tail -30 "$OUTD/cmake.log"; exit 1; }
export LD_LIBRARY_PATH=${EN_LD:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cmake --build "$B" -j "$(nproc)" >"$OUTD/build.log" 2>&1 || { tail -30 "$OUTD/build.log"; exit 1; }
echo "build ok"
for t in test_cuda_ops test_cuda_train; do
    timeout 200 "$B/tests/$t" >"$OUTD/$t.log" 2>&1; echo "$t rc=$? $(tail -1 "$OUTD/$t.log")"
done
M=$OUTD/model
mkdir -p "$M" "$OUTD/ads"
cp "$HERE/tests/fixtures/hf/llama_gqa_tied/config.json" "$HERE/tests/fixtures/hf/llama_gqa_tied/model.safetensors" "$M/"
cp -r "$HERE/tests/fixtures/grad/llama_gqa_tied_lora_adapter" "$OUTD/ads/a2"
"$B/energon" tokenizer train --data "$HERE/examples/company/handbook.txt" --vocab-size 333 --out "$M/tokenizer.model" >/dev/null
start() { # device port
    "$B/energon" serve --model "$M" --device "$1" --port "$2" --quiet --ctx 128 --model-name base \
        --adapter "a1=$HERE/tests/fixtures/grad/llama_gqa_tied_lora_adapter" --adapter-dir "$OUTD/ads" \
        >"$OUTD/serve-$1.log" 2>&1 &
    for _ in $(seq 1 300); do env -u LD_LIBRARY_PATH curl -sf "http://127.0.0.1:$2/health" >/dev/null && return 0; sleep 0.1; done
    tail -5 "$OUTD/serve-$1.log"; return 1
}
start cuda 8801 && start cpu 8802 || exit 1
env -u LD_LIBRARY_PATH python3 - <<'PY'
import json, threading, urllib.request
def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())
for port in (8801, 8802):
    print("load a2 on", port, post(port, "/v1/adapters", {"name": "a2", "path": "a2"})["id"])
ids = [1, 17, 42, 99, 7, 250, 33, 8, 120, 64]
worst = 0.0
for model in ("base", "a1", "a2"):
    for t in (3, 6, 10):
        a = post(8801, "/v1/completions", {"model": model, "prompt": ids[:t], "max_tokens": 1, "logprobs": 5, "temperature": 0})
        b = post(8802, "/v1/completions", {"model": model, "prompt": ids[:t], "max_tokens": 1, "logprobs": 5, "temperature": 0})
        la = a["choices"][0]["logprobs"]["token_logprobs"][0]; lb = b["choices"][0]["logprobs"]["token_logprobs"][0]
        worst = max(worst, abs(la - lb))
print(f"cuda vs cpu: chosen-token logprob max |diff| {worst:.2e} ->", "PASS" if worst < 1e-3 else "FAIL")
def gen(model, p):
    return post(8801, "/v1/completions", {"model": model, "prompt": p, "max_tokens": 30, "temperature": 0})["choices"][0]["text"]
reqs = [(("base", "a1", "a2")[i % 3], ids[i % 5: i % 5 + 4]) for i in range(12)]
alone = [gen(m, p) for m, p in reqs]
tog = [None] * 12
def w(i): tog[i] = gen(*reqs[i])
ts = [threading.Thread(target=w, args=(i,)) for i in range(12)]
[t.start() for t in ts]; [t.join() for t in ts]
same = sum(a == b for a, b in zip(alone, tog))
print(f"cuda mixed adapters: {same}/12 equal alone ->", "PASS" if same == 12 else "FAIL")
print("distinct answers of base/a1/a2 on one prompt:", len({alone[0], alone[1], alone[2]}))
PY
kill %1 %2 2>/dev/null
