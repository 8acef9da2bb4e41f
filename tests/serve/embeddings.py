"""embeddings.py - POST /v1/embeddings (issue 14, "What it must show":
embeddings).

Runs against a server of tests/fixtures/hf/embed_llama (a tiny random
Llama with its own byte-level BPE tokenizer, made by
tests/gen/gen_embed_fixture.py), started by test_serve.sh with
--embedding-pooling EN_POOLING (mean or last). The reference is
embeddings.json: the same model's last_hidden_state computed by
transformers in float64, pooled and L2-normalised in float64.

  - the official openai client's embeddings.create (which asks for base64
    by default) on the fixture's texts, one request for all: every vector
    within 1e-5 of the float64 reference (max abs difference), norm 1;
  - /tokenize gives the fixture's (tokenizers') ids, and the same ids sent
    as input give the same vectors bit for bit; encoding_format float gives
    the base64 values exactly;
  - 24 embedding requests at once beside 8 generation requests: each
    vector bit-identical to the one it got alone (batch invariance);
  - bad input: 400 naming the parameter (empty input, empty string, token
    id out of range, dimensions unequal, bad encoding_format, an input
    over the context), 404 for another model; the server keeps serving.
"""
import base64
import json
import math
import os
import struct
import threading

from common import FIXTURES, MODEL, check, finish, note, openai_client, post, short

POOLING = os.environ.get("EN_POOLING", "mean")
with open(os.path.join(FIXTURES, "hf", "embed_llama", "embeddings.json")) as f:
    REF = json.load(f)
TEXTS, IDS, WANT = REF["texts"], REF["ids"], REF[POOLING]
note(f"pooling {POOLING}: {len(TEXTS)} texts of {min(map(len, IDS))}..{max(map(len, IDS))} tokens")


def max_diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else math.inf


def raw(body):
    st, js, data = post("/v1/embeddings", body)
    return st, js, data


def vectors(js, b64):
    out = []
    for d in sorted(js["data"], key=lambda d: d["index"]):
        e = d["embedding"]
        if b64:
            b = base64.b64decode(e)
            e = list(struct.unpack(f"<{len(b) // 4}f", b))
        out.append(e)
    return out


# ---- the official client against the float64 reference
client = openai_client()
resp = client.embeddings.create(model=MODEL, input=TEXTS)
got = [list(d.embedding) for d in sorted(resp.data, key=lambda d: d.index)]
diffs = [max_diff(g, w) for g, w in zip(got, WANT)]
check(len(got) == len(TEXTS) and max(diffs) <= 1e-5, "openai embeddings.create vs float64 reference",
      f"{len(got)} vectors of {len(got[0])}, max |diff| {max(diffs):.2e} (bound 1e-5)")
norms = [math.sqrt(sum(x * x for x in g)) for g in got]
check(all(abs(n - 1) < 1e-5 for n in norms), "vectors are L2-normalised",
      f"norms {min(norms):.7f}..{max(norms):.7f}")
check(resp.usage.prompt_tokens == sum(map(len, IDS)) and resp.object == "list"
      and resp.model == MODEL, "usage and envelope",
      f"prompt_tokens {resp.usage.prompt_tokens} (want {sum(map(len, IDS))}), model {resp.model}")
one = client.embeddings.create(model=MODEL, input=TEXTS[1])
check(max_diff(list(one.data[0].embedding), WANT[1]) <= 1e-5 and len(one.data) == 1,
      "a single string input", f"max |diff| {max_diff(list(one.data[0].embedding), WANT[1]):.2e}")

# ---- ids, formats
st, js, data = post("/tokenize", {"model": MODEL, "prompt": TEXTS[3]})
check(st == 200 and js["tokens"] == IDS[3], "/tokenize gives the tokenizers package's ids",
      f"{short(js.get('tokens') if js else data, 80)}")
st, b64js, _ = raw({"model": MODEL, "input": TEXTS, "encoding_format": "base64"})
st2, fjs, _ = raw({"model": MODEL, "input": TEXTS, "encoding_format": "float"})
st3, ijs, _ = raw({"model": MODEL, "input": IDS})
ok = st == st2 == st3 == 200
vb, vf = (vectors(b64js, True), vectors(fjs, False)) if ok else ([], [])
vi = vectors(ijs, False) if ok else []
check(ok and all(struct.pack("<f", x) == struct.pack("<f", y) for a, b in zip(vb, vf) for x, y in zip(a, b)),
      "encoding_format float = base64, bit for bit", f"statuses {st} {st2} {st3}")
check(ok and vi == vf, "token-id inputs = the same texts, bit for bit")
st, js, _ = raw({"input": IDS[0]})
check(st == 200 and vectors(js, False)[0] == vf[0], "one list of token ids is one input")

# ---- batched beside generation: bit-identical to alone
alone = {i: vf[i % len(vf)] for i in range(24)}
results, errors = {}, []


def emb_worker(i):
    try:
        s, j, d = raw({"model": MODEL, "input": TEXTS[i % len(TEXTS)], "encoding_format": "float"})
        results[i] = vectors(j, False)[0] if s == 200 else f"status {s}: {short(d)}"
    except Exception as ex:  # noqa: BLE001 - reported as a FAIL line
        errors.append(repr(ex))


def gen_worker(i):
    try:
        s, j, d = post("/v1/completions", {"model": MODEL, "prompt": TEXTS[i % len(TEXTS)],
                                            "max_tokens": 24, "temperature": 0})
        if s != 200:
            errors.append(f"completion {i}: {s} {short(d)}")
    except Exception as ex:  # noqa: BLE001
        errors.append(repr(ex))


threads = [threading.Thread(target=emb_worker, args=(i,)) for i in range(24)]
threads += [threading.Thread(target=gen_worker, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
same = sum(1 for i in range(24) if results.get(i) == alone[i])
check(same == 24 and not errors, "24 embeddings beside 8 generations = alone, bit for bit",
      f"{same}/24 identical; errors {short(errors)}")

# ---- bad input
long_ids = [IDS[0][0]] * 200  # the fixture's context is 128
bad = [
    ({"model": MODEL}, 400, "input"),
    ({"model": MODEL, "input": []}, 400, "input"),
    ({"model": MODEL, "input": ""}, 400, "input"),
    ({"model": MODEL, "input": ["ok", ""]}, 400, "input[1]"),
    ({"model": MODEL, "input": [1, 2, 100000]}, 400, "input"),
    ({"model": MODEL, "input": [[1, 2], [3, -1]]}, 400, "input[1]"),
    ({"model": MODEL, "input": [{"a": 1}]}, 400, "input[0]"),
    ({"model": MODEL, "input": "x", "dimensions": 7}, 400, "dimensions"),
    ({"model": MODEL, "input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ({"model": MODEL, "input": long_ids}, 400, "input"),
    ({"model": "no-such-model", "input": "x"}, 404, "model"),
]
for body, want_st, param in bad:
    st, js, data = raw(body)
    err = (js or {}).get("error", {}) if isinstance(js, dict) else {}
    check(st == want_st and err.get("param") == param,
          f"bad input {short(json.dumps(body), 60)} -> {want_st} naming {param}",
          f"got {st}, param {err.get('param')!r}: {short(err.get('message', data), 100)}")
st, js, _ = raw({"model": MODEL, "input": TEXTS[0], "dimensions": len(WANT[0])})
check(st == 200, "dimensions equal to the model's are accepted", f"status {st}")
finish("embeddings")
