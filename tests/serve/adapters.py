"""Many LoRA adapters over one base in one server (issue 14).

The server (test_serve.sh starts it) serves tests/fixtures/hf/llama_gqa_tied
(a random llama with a trained 333-piece tokenizer beside it) as the base,
the PEFT-written adapter tests/fixtures/grad/llama_gqa_tied_lora_adapter as
`a1` (--adapter a1=DIR) and may load more from EN_ADAPTER_DIR. Checks:
  - /v1/models lists the base and a1 with the base as parent;
  - the log-probabilities of a1 through the API equal PEFT's (the fixture
    tests/fixtures/grad/llama_gqa_tied_lora_merged.bin, from
    tests/gen/gen_export_fixture.py) within 1e-4, and the base's equal
    transformers' (hf/llama_gqa_tied/logits.bin);
  - POST /v1/adapters loads a second adapter (a1's weights with lora_B
    times -3, written here) while 16 requests run, all of which succeed;
    paths outside --adapter-dir get 403, a taken name 409, a bad name or a
    directory that is no adapter 400;
  - 24 concurrent temperature-0 requests spread over base, a1 and a2 each
    answer what the same request answers alone, and the engine ran them in
    fewer steps than alone (they were batched together);
  - DELETE /v1/adapters/a2 while 8 streams run on it: all 8 end normally,
    a2 then answers 404, /metrics counts no draining adapter once they end;
  - issue 31: r = 4096 without weights refused naming the rank; a 300 MB
    sparse config refused at once naming the cap; a FIFO as either file
    answered at once; outside paths ('..', absolute, a link out) answer the
    same 403 whether or not they exist; a config linked to /etc/passwd is
    not followed; links inside the directory (an HF cache) are; 300
    load / delete races never answer 500; "dry_run" answers what a load
    would, loading and making nothing.
"""
import http.client as hc
import json
import os
import shutil
import struct
import threading
import time

from common import (FIXTURES, MODEL, SLOW, URL, check, finish, http_json, metric, metrics, note,
                    post, split_url, sse_events, stream_post)

ADIR = os.environ["EN_ADAPTER_DIR"]
PEFT = os.path.join(FIXTURES, "grad", "llama_gqa_tied_lora_adapter")


def read_enfx(path):
    with open(path, "rb") as f:
        assert f.read(4) == b"ENFX"
        _, t, v = struct.unpack("<III", f.read(12))
        ids = list(struct.unpack(f"<{t}i", f.read(4 * t)))
        vals = struct.unpack(f"<{t * v}f", f.read(4 * t * v))
    return ids, [vals[i * v:(i + 1) * v] for i in range(t)]


def log_softmax(row):
    import math
    mx = max(row)
    lse = mx + math.log(sum(math.exp(x - mx) for x in row))
    return [x - lse for x in row]


def scaled_copy(src, dst, factor):
    """A PEFT adapter directory whose lora_B tensors are factor times src's
    (safetensors written by hand: 8-byte header length, JSON, data)."""
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "adapter_config.json"), dst)
    with open(os.path.join(src, "adapter_model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = bytearray(f.read())
    for name, t in head.items():
        if name == "__metadata__" or "lora_B" not in name:
            continue
        assert t["dtype"] == "F32"
        a, b = t["data_offsets"]
        vals = struct.unpack(f"<{(b - a) // 4}f", data[a:b])
        data[a:b] = struct.pack(f"<{len(vals)}f", *[v * factor for v in vals])
    hb = json.dumps(head, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(os.path.join(dst, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        f.write(data)


def top_logprobs(model, ids, k=5):
    st, js, raw = post("/v1/completions", {"model": model, "prompt": ids, "max_tokens": 1,
                                           "temperature": 0, "logprobs": k})
    if st != 200:
        raise RuntimeError(f"{model}: {st} {raw[:200]}")
    return js["choices"][0]["logprobs"]["top_logprobs"][0], js


def complete(model, ids, n=40):
    st, js, raw = post("/v1/completions", {"model": model, "prompt": ids, "max_tokens": n,
                                           "temperature": 0, "logprobs": 1})
    if st != 200:
        return f"error {st}"
    return js["choices"][0]["logprobs"]["tokens"], js["model"]


# ---- /v1/models
st, js, _ = http_json("GET", "/v1/models")
ids_ = {m["id"]: m for m in (js or {}).get("data", [])}
check(st == 200 and MODEL in ids_ and "a1" in ids_ and ids_["a1"]["parent"] == MODEL,
      "/v1/models lists the base and a1 (parent: the base)", f"{sorted(ids_)}")

# ---- logits against PEFT and transformers, through the API
fx_ids, peft = read_enfx(os.path.join(FIXTURES, "grad", "llama_gqa_tied_lora_merged.bin"))
_, base = read_enfx(os.path.join(FIXTURES, "hf", "llama_gqa_tied", "logits.bin"))
for model, ref, what in (("a1", peft, "PEFT"), (MODEL, base, "transformers")):
    worst, n = 0.0, 0
    for t in (3, 7, 12, len(fx_ids)):
        top, js = top_logprobs(model, fx_ids[:t])
        lp = sorted(log_softmax(ref[t - 1]), reverse=True)
        # top_logprobs is keyed by token text (two ids may share one): each
        # value must be one of the reference's largest, the first the largest
        chosen = js["choices"][0]["logprobs"]["token_logprobs"][0]
        worst = max(worst, abs(chosen - lp[0]))
        n += 1
        for a in top.values():
            worst = max(worst, min(abs(a - b) for b in lp[:8]))
            n += 1
    check(worst <= 1e-4, f"{model}: top-5 log-probabilities equal {what}'s within 1e-4",
          f"{n} values, max |diff| {worst:.2e}")
adiff = max(abs(a - b) for a, b in zip(log_softmax(peft[-1]), log_softmax(base[-1])))
note(f"the adapter moves the last row's log-probabilities by up to {adiff:.3f}")

# ---- loading while requests run; refusals
a2dir = os.path.join(ADIR, "a2")
scaled_copy(PEFT, a2dir, -3.0)
os.makedirs(os.path.join(ADIR, "junk"), exist_ok=True)
with open(os.path.join(ADIR, "junk", "adapter_config.json"), "w") as f:
    f.write("{not json")
prompts = [fx_ids[i:i + 6] for i in range(0, 12)]
busy = [None] * 16


def run_busy(i):
    busy[i] = complete(MODEL if i % 2 else "a1", prompts[i % len(prompts)], 40)


threads = [threading.Thread(target=run_busy, args=(i,)) for i in range(16)]
for t in threads:
    t.start()
st, js, raw = post("/v1/adapters", {"name": "a2", "path": "a2"})
for t in threads:
    t.join()
check(st == 200 and js.get("id") == "a2" and js.get("rank") == 4,
      "POST /v1/adapters loads a2 while 16 requests run", f"{st} {raw[:160]!r}")
check(all(isinstance(b, tuple) for b in busy), "the 16 requests around the load all succeed",
      f"{sum(isinstance(b, tuple) for b in busy)}/16")
for body, want, what in (({"name": "a3", "path": "/etc"}, 403, "an absolute path outside"),
                         ({"name": "a3", "path": "../../../../../../etc"}, 403, "a path leading out"),
                         ({"name": "a2", "path": "a2"}, 409, "a name already loaded"),
                         ({"name": MODEL, "path": "a2"}, 409, "the base's name"),
                         ({"name": "bad name!", "path": "a2"}, 400, "a bad name"),
                         ({"name": "a4", "path": "junk"}, 400, "a directory that is no adapter"),
                         ({"name": "a4"}, 400, "no path"),
                         ({"name": "a4", "path": "missing"}, 404, "a missing directory")):
    st, js, raw = post("/v1/adapters", body)
    check(st == want and js and "error" in js, f"POST /v1/adapters with {what}: {want}",
          f"{st} {(js or {}).get('error', {}).get('message', raw[:100])}")
st, js, _ = http_json("DELETE", "/v1/adapters/nope")
check(st == 404, "DELETE of an unknown adapter: 404", f"{st}")

# ---- issue 31: what a load opens, and what it answers about what is not there


def err_of(js, raw):
    return ((js or {}).get("error") or {}).get("message", str(raw[:200]))


def healthy():
    st, _, _ = http_json("GET", "/health", timeout=5)
    return st == 200


# r = 4096 (legal for the loader) and no weights: refused for the rank, not
# for the missing file, before anything is allocated
big = os.path.join(ADIR, "r4096")
os.makedirs(big, exist_ok=True)
with open(os.path.join(PEFT, "adapter_config.json")) as f:
    cfg = json.load(f)
cfg["r"] = 4096
with open(os.path.join(big, "adapter_config.json"), "w") as f:
    json.dump(cfg, f)
st, js, raw = post("/v1/adapters", {"name": "r4096", "path": "r4096"})
msg = err_of(js, raw)
check(st == 400 and "r = 4096" in msg and "--max-lora-rank 64" in msg and "safetensors" not in msg,
      "r = 4096 without weights: 400 naming the rank and --max-lora-rank", f"{st} {msg}")
# a 300 MB sparse adapter_config.json: refused unread, naming the file and the cap
sparse = os.path.join(ADIR, "sparse")
os.makedirs(sparse, exist_ok=True)
shutil.copy(os.path.join(PEFT, "adapter_model.safetensors"), sparse)
with open(os.path.join(sparse, "adapter_config.json"), "wb") as f:
    f.truncate(300 << 20)
t0 = time.time()
st, js, raw = post("/v1/adapters", {"name": "sparse", "path": "sparse"})
dt = time.time() - t0
msg = err_of(js, raw)
check(st == 400 and "adapter_config.json is 314572800 bytes" in msg and "1.0 MiB" in msg and
      dt < 2 * SLOW, "a 300 MB sparse adapter_config.json: 400 naming the file and the 1 MiB cap",
      f"{st} in {dt:.2f} s: {msg}")
# FIFOs as either file: answered at once, the server unharmed
for which in ("adapter_config.json", "adapter_model.safetensors"):
    d = os.path.join(ADIR, "fifo-" + which.split("_")[1].split(".")[0])
    os.makedirs(d, exist_ok=True)
    for other in ("adapter_config.json", "adapter_model.safetensors"):
        if other != which:
            shutil.copy(os.path.join(PEFT, other), d)
    os.mkfifo(os.path.join(d, which))
    t0 = time.time()
    st, js, raw = post("/v1/adapters", {"name": "fifo", "path": os.path.basename(d)}, timeout=10)
    dt = time.time() - t0
    msg = err_of(js, raw)
    check(st == 400 and "not a regular file" in msg and which in msg and dt < 2 * SLOW and healthy(),
          f"a FIFO as {which}: 400 at once, the server fine", f"{st} in {dt:.2f} s: {msg}")
# an existence oracle: the same answer for an outside path that exists and
# one that does not, written with '..', absolute, or through a link
os.symlink("/etc", os.path.join(ADIR, "to-etc"))
os.symlink("/no-such-dir-31", os.path.join(ADIR, "to-nothing"))
for there, not_there, what in (("../../../../../../etc", "../../../../../../no-such-dir-31", "'..'"),
                               ("/etc", "/no-such-dir-31", "absolute"),
                               ("to-etc", "to-nothing", "a link out"),
                               ("../" + os.path.basename(ADIR.rstrip("/")) + "/a2",
                                "../" + os.path.basename(ADIR.rstrip("/")) + "/nope", "'..' back in")):
    a = post("/v1/adapters", {"name": "o1", "path": there})
    b = post("/v1/adapters", {"name": "o1", "path": not_there})
    ma, mb = err_of(a[1], a[2]).replace(there, "P"), err_of(b[1], b[2]).replace(not_there, "P")
    ca, cb = ((a[1] or {}).get("error") or {}).get("code"), ((b[1] or {}).get("error") or {}).get("code")
    check(a[0] == b[0] == 403 and ma == mb and ca == cb,
          f"outside --adapter-dir ({what}): 403 alike whether or not it exists",
          f"{a[0]} {ca} / {b[0]} {cb}: {ma} | {mb}")
# a file linked out of an adapter directory is not followed: /etc/passwd's
# first word never shows in the answer
leak = os.path.join(ADIR, "leak")
os.makedirs(leak, exist_ok=True)
shutil.copy(os.path.join(PEFT, "adapter_model.safetensors"), leak)
os.symlink("/etc/passwd", os.path.join(leak, "adapter_config.json"))
with open("/etc/passwd") as f:
    first = f.read().split(":")[0]
st, js, raw = post("/v1/adapters", {"name": "leak", "path": "leak"})
msg = err_of(js, raw)
check(st == 400 and "symbolic link leading outside" in msg and
      (first + ":") not in raw.decode(errors="replace"),
      "a config linked to /etc/passwd: 400, not followed, nothing of it echoed", f"{st} {msg}")
# links inside --adapter-dir are followed (a Hugging Face cache snapshot)
snap = os.path.join(ADIR, "hf", "snapshots", "r1")
blobs = os.path.join(ADIR, "hf", "blobs")
os.makedirs(snap, exist_ok=True)
os.makedirs(blobs, exist_ok=True)
for i, name in enumerate(("adapter_config.json", "adapter_model.safetensors")):
    shutil.copy(os.path.join(PEFT, name), os.path.join(blobs, f"b{i}"))
    os.symlink(f"../../blobs/b{i}", os.path.join(snap, name))
st, js, raw = post("/v1/adapters", {"name": "snap", "path": "hf/snapshots/r1"})
check(st == 200 and js.get("rank") == 4 and js.get("path", "").endswith("/hf/snapshots/r1"),
      "an adapter of links inside --adapter-dir (HF cache layout) loads", f"{st} {raw[:160]!r}")
http_json("DELETE", "/v1/adapters/snap")

# ---- load / delete races: 300 rounds of one load while DELETEs of the same
# name run back to back on a kept-alive connection, so that some land just
# as the load adds the adapter (the answer must then still be the load's)
def spin_deletes(stop, seen):
    host, port = split_url(URL)
    conn = hc.HTTPConnection(host, port, timeout=30 * SLOW)
    while not stop.is_set():
        conn.request("DELETE", "/v1/adapters/race")
        r = conn.getresponse()
        r.read()
        seen[r.status] = seen.get(r.status, 0) + 1
    conn.close()


posts, deletes = {}, {}
for i in range(300):
    stop = threading.Event()
    spinner = threading.Thread(target=spin_deletes, args=(stop, deletes))
    spinner.start()
    st = post("/v1/adapters", {"name": "race", "path": "a2"})[0]
    stop.set()
    spinner.join()
    posts[st] = posts.get(st, 0) + 1
http_json("DELETE", "/v1/adapters/race")
check(set(posts) <= {200, 409} and set(deletes) <= {200, 404} and posts.get(200, 0) > 0,
      "300 loads raced by back-to-back DELETEs: loads answer 200 or 409, deletes 200 or 404, "
      "never 500", f"loads {posts}, deletes {deletes}")

# ---- "dry_run": what a load would answer, with nothing loaded
for body, want, what in (
        ({"name": "dry", "path": "runs/future", "dry_run": True, "rank": 8}, 200,
         "a directory a run will make"),
        ({"name": "dry", "path": "a2", "dry_run": True}, 200, "an existing directory"),
        ({"name": "dry", "path": "runs/future", "dry_run": True, "rank": 128}, 400,
         "a rank over --max-lora-rank"),
        ({"name": "a1", "path": "runs/future", "dry_run": True}, 409, "a name already loaded"),
        ({"name": "dry", "path": "../elsewhere/run", "dry_run": True}, 403, "a path leading out"),
        ({"name": "dry", "path": "runs/x/../../../out", "dry_run": True}, 403,
         "a '..' out in the part to be made"),
        ({"name": "dry", "path": "/etc/run", "dry_run": True}, 403, "an absolute path outside"),
        ({"name": "dry", "path": "a2", "dry_run": "yes"}, 400, "dry_run not a boolean")):
    st, js, raw = post("/v1/adapters", body)
    check(st == want and (st != 200 or js.get("dry_run") is True),
          f"POST /v1/adapters dry run with {what}: {want}", f"{st} {raw[:200]!r}")
st, _, _ = http_json("GET", "/v1/adapters/dry")
check(st == 404 and not os.path.exists(os.path.join(ADIR, "runs")),
      "a dry run loads nothing and makes nothing", f"GET /v1/adapters/dry: {st}")

# ---- a mixed batch equals each request alone
reqs = [(("base", "a1", "a2")[i % 3], prompts[i % len(prompts)]) for i in range(24)]
model_of = {"base": MODEL, "a1": "a1", "a2": "a2"}
m0 = metrics()
alone = [complete(model_of[m], p) for m, p in reqs]
m1 = metrics()
together = [None] * 24


gate = threading.Barrier(24)


def run_one(i):
    m, p = reqs[i]
    gate.wait()
    together[i] = complete(model_of[m], p)


threads = [threading.Thread(target=run_one, args=(i,)) for i in range(24)]
for t in threads:
    t.start()
for t in threads:
    t.join()
m2 = metrics()
same = sum(1 for a, b in zip(alone, together) if isinstance(a, tuple) and a == b)
check(same == 24, "24 requests over base, a1 and a2 at once: each answers as alone",
      f"{same}/24 identical")
differ = len({str(alone[i][0]) for i in (0, 1, 2)})
check(differ == 3, "the three models answer the same prompt differently", f"{differ} distinct")
s_alone = metric(m1, "energon_engine_steps_total") - metric(m0, "energon_engine_steps_total")
s_tog = metric(m2, "energon_engine_steps_total") - metric(m1, "energon_engine_steps_total")
check(s_tog < s_alone / 4, "the mixed requests were batched together",
      f"{s_tog:.0f} engine steps together vs {s_alone:.0f} alone")

# ---- unloading while 8 streams run on it
streams = []
for i in range(8):
    conn, r = stream_post("/v1/completions", {"model": "a2", "prompt": prompts[i], "stream": True,
                                              "max_tokens": 60, "temperature": 0})
    streams.append((conn, r))
first = [next(sse_events(r), None) for _, r in streams]  # each has started
st, js, _ = http_json("DELETE", "/v1/adapters/a2")
check(st == 200 and js.get("deleted") is True, "DELETE /v1/adapters/a2 while 8 streams run on it",
      f"{st}")
st404, _, _ = post("/v1/completions", {"model": "a2", "prompt": prompts[0], "max_tokens": 2})
check(st404 == 404, "a new request for the unloaded a2: 404", f"{st404}")
ends = []
for conn, r in streams:
    chunks = [json.loads(d) for d in sse_events(r)]
    ends.append(chunks[-1]["choices"][0]["finish_reason"] if chunks and chunks[-1]["choices"]
                else None)
    conn.close()
check(all(f is not None for f in first) and all(e in ("length", "stop") for e in ends),
      "the 8 running streams on a2 all finish", f"{ends}")
# the server lets go of a request just after its last chunk is sent: wait
# (up to 10 s) for the draining adapter's last user to release it
deadline = time.time() + 10 * SLOW
ms = metrics()
while metric(ms, "energon_lora_adapters_draining") != 0 and time.time() < deadline:
    time.sleep(0.05)
    ms = metrics()
check(metric(ms, "energon_lora_adapters_loaded") == 1 and
      metric(ms, "energon_lora_adapters_draining") == 0,
      "/metrics: one adapter loaded, none draining once they end",
      f"loaded {metric(ms, 'energon_lora_adapters_loaded')}, "
      f"draining {metric(ms, 'energon_lora_adapters_draining')}")
st, js, _ = http_json("GET", "/v1/adapters")
check(st == 200 and [a["id"] for a in js["data"]] == ["a1"], "GET /v1/adapters: a1 only",
      f"{[a['id'] for a in (js or {}).get('data', [])]}")
finish("adapters")
