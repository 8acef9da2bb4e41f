#!/usr/bin/env bash
# test_index_embed.sh ENERGON - `energon index --embed` and hybrid retrieval
# (serve/retrieval.c, docs/retrieval.md "Hybrid") against independent
# Python (float64): every stored vector has the model's dimension and unit
# norm, three equal what `energon serve`'s POST /v1/embeddings returns for
# the same text (1e-5); the hybrid ranking of `index --search --model`
# and of the server's POST /v1/retrieve equal a reciprocal-rank fusion
# (k = 60) of tests/serve/bm25_ref.py's BM25 and a float64 cosine ranking of
# the stored vectors; an update of one
# file re-embeds only its passages; another model, or an update without
# --embed, is a clear error (search, and serve at start-up). Model:
# stories260K's GGUF (shared/models); skipped when it is absent.
set -u
ENERGON=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$ROOT/.venv-test/bin/python
MODEL=$ROOT/../shared/models/stories260K/stories260K.gguf
[ -f "$MODEL" ] || MODEL=/work/shared/models/stories260K/stories260K.gguf
OTHER=$(dirname "$(dirname "$MODEL")")/tiny-random-gpt2
if [ ! -x "$PY" ]; then
    echo "SKIP: $PY missing (run scripts/install-deps)"
    exit 77
fi
if [ ! -f "$MODEL" ]; then
    echo "SKIP: $MODEL missing (the shared models folder)"
    exit 77
fi
T=$(mktemp -d /tmp/en_index_embed_XXXXXX)
trap 'rm -rf "$T"' EXIT
export OMP_WAIT_POLICY=passive # 2 shared cores: no spinning threads
"$PY" - "$ENERGON" "$ROOT" "$T" "$MODEL" "$OTHER" <<'PYEOF'
import json, math, os, re, shutil, sqlite3, struct, subprocess, sys, time, urllib.request

energon, root, T, model, other = sys.argv[1:6]
sys.path.insert(0, os.path.join(root, "tests/serve"))
from bm25_ref import bm25_top, tokens

fails = []

def check(cond, what):
    print(("  ok   " if cond else "  FAIL ") + what)
    if not cond:
        fails.append(what)

def run(*args):
    p = subprocess.run([energon, "index", *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr

D = os.path.join(T, "docs")
os.mkdir(D)
for f in ("handbook.txt", "policies.txt", "products.txt"):
    shutil.copy(os.path.join(root, "examples/company", f), D)
DB = os.path.join(T, "idx.db")
emb = ["--embed", "--model", model, "--threads", "1"]
t0 = time.time()
rc, out = run("--docs", D, "--out", DB, *emb)
print(out.strip())
check(rc == 0, "index --embed exits 0 (%.1f s)" % (time.time() - t0))

db = sqlite3.connect(DB)
meta = dict(db.execute("SELECT key, value FROM meta"))
P = db.execute("SELECT p.id, f.path, p.text, p.section FROM passages p JOIN files f"
               " ON f.id = p.file_id ORDER BY p.id").fetchall()
def vectors():
    return {i: struct.unpack("<%df" % (len(b) // 4), b)
            for i, b in db.execute("SELECT passage_id, v FROM vectors")}
V = vectors()
dim = int(meta.get("embed_dim", 0))
check(dim == 64 and meta.get("embed_pooling") == "mean", "meta: dim 64, mean pooling")
check(all(k in meta for k in ("embed_model_hash", "embed_model_arch", "embed_vocab",
                              "embed_layers", "embed_model")), "meta: the model identity")
check(sorted(V) == [p[0] for p in P], "one vector per passage (%d)" % len(P))
check(all(len(v) == dim for v in V.values()), "every vector has %d floats" % dim)
worst = max(abs(math.sqrt(sum(x * x for x in v)) - 1) for v in V.values())
check(worst < 1e-5, "every vector has unit norm (worst |norm - 1| %.2e)" % worst)
m = re.search(r"embedded (\d+) passages", out)
check(m and int(m.group(1)) == len(P), "the command reports %d passages embedded" % len(P))

# energon serve's /v1/embeddings for three passages and the query
srv = subprocess.Popen([energon, "serve", "--model", model, "--port", "0", "--quiet",
                        "--threads", "1", "--index", DB], stderr=subprocess.PIPE, text=True)
port = None
t0 = time.time()
while time.time() - t0 < 30:
    line = srv.stderr.readline()
    if not line:
        break
    m = re.search(r"listening on http://[^:]+:(\d+)", line)
    if m:
        port = int(m.group(1))
        break
check(port is not None, "energon serve --index DB (with vectors, same model) starts")

def embed(texts):
    req = urllib.request.Request("http://127.0.0.1:%d/v1/embeddings" % port,
                                 json.dumps({"input": texts}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return [d["embedding"] for d in json.load(r)["data"]]

Q = "how many vacation days do employees get per year"
if port:
    pick = [P[0], P[len(P) // 2], P[-1]]
    ref = embed([p[2] for p in pick] + [Q])
    qv = ref[3]
    for p, r in zip(pick, ref):
        d = max(abs(a - b) for a, b in zip(V[p[0]], r))
        check(d <= 1e-5, "passage %d's vector = /v1/embeddings (max diff %.2e)" % (p[0], d))
if port:
    # the hybrid ranking against RRF of float64 BM25 and cosine rankings
    K, DEPTH = 5, 50
    docs = {p[0]: tokens(p[3]) + tokens(p[2]) for p in P}
    bm = [pid for pid, _ in bm25_top(docs, Q, DEPTH)]
    qn = math.sqrt(sum(x * x for x in qv))
    cos = sorted(((sum(a * b for a, b in zip(qv, v)) / qn, pid) for pid, v in V.items()),
                 key=lambda t: (-t[0], t[1]))[:DEPTH]
    fused = {}
    for ranking in (bm, [pid for _, pid in cos]):
        for r, pid in enumerate(ranking, 1):
            fused[pid] = fused.get(pid, 0.0) + 1.0 / (60 + r)
    want = sorted(fused.items(), key=lambda t: (-t[1], t[0]))[:K]
    rc, out = run("--search", DB, "--query", Q, "--top-k", str(K), "--model", model,
                  "--threads", "1")
    got = [(int(i), float(s)) for s, i in
           re.findall(r"^\d+\. \[([-0-9.e]+)\].*\(passage (\d+)\)$", out, re.M)]
    check(rc == 0 and "hybrid" in out, "index --search --model: hybrid")
    check([g[0] for g in got] == [w[0] for w in want],
          "hybrid top %d = Python RRF: %s vs %s" % (K, [g[0] for g in got], [w[0] for w in want]))
    check(all(abs(g[1] - w[1]) < 1e-6 for g, w in zip(got, want)), "fused scores within 1e-6")
    req = urllib.request.Request("http://127.0.0.1:%d/v1/retrieve" % port,
                                 json.dumps({"query": Q, "top_k": K}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        data = json.load(r)["data"]
    check([d["id"] for d in data] == [w[0] for w in want] and
          all(abs(d["score"] - w[1]) < 1e-6 for d, w in zip(data, want)),
          "the server's /v1/retrieve is the same hybrid ranking")
    rc, out = run("--search", DB, "--query", Q, "--top-k", str(K))
    got = [int(i) for i in re.findall(r"\(passage (\d+)\)$", out, re.M)]
    check(rc == 0 and "BM25 only" in out and got == bm[:K], "index --search without --model: BM25")

srv.terminate()
srv.wait(timeout=30)

# an update of one file re-embeds its passages only
before = V
with open(os.path.join(D, "policies.txt"), "a") as f:
    f.write("\nA new paragraph about the parking garage and bicycle racks.\n")
rc, out = run("--docs", D, "--out", DB, *emb)
n_pol = db.execute("SELECT n_passages FROM files WHERE path = 'policies.txt'").fetchone()[0]
m = re.search(r"embedded (\d+) passages", out)
check(rc == 0 and m and int(m.group(1)) == n_pol,
      "an update of policies.txt re-embeds its %d passages (%s)" % (n_pol, m and m.group(1)))
V = vectors()
kept = [p[0] for p in db.execute("SELECT p.id FROM passages p JOIN files f ON f.id = p.file_id"
                                 " WHERE f.path != 'policies.txt'")]
check(sorted(V) == sorted(p[0] for p in db.execute("SELECT id FROM passages")) and
      all(V[i] == before[i] for i in kept), "the other files' vectors are kept as they were")
rc, out = run("--docs", D, "--out", DB, *emb)
check(rc == 0 and "embedded 0 passages" in out, "an unchanged update embeds nothing")

# errors: another model, an update without --embed
snap = open(DB, "rb").read()
rc, out = run("--docs", D, "--out", DB)
check(rc == 2 and "holds vectors" in out and "stories260K.gguf" in out,
      "an update without --embed is refused: " + out.strip()[:120])
if os.path.isdir(other):
    rc, out = run("--search", DB, "--query", Q, "--model", other)
    check(rc != 0 and DB in out and "stories260K.gguf" in out and "tiny-random-gpt2" in out,
          "search with another model: a clear error: " + out.strip()[-160:])
    p = subprocess.run([energon, "serve", "--model", other, "--port", "0", "--index", DB],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "tiny-random-gpt2" in p.stderr and DB in p.stderr,
          "serve --index with another model exits 2 at start-up")
else:
    print("  skip: %s missing (the model-mismatch checks)" % other)
check(open(DB, "rb").read() == snap, "the refused runs left the index as it was")
print("%d failure(s)" % len(fails))
sys.exit(1 if fails else 0)
PYEOF
