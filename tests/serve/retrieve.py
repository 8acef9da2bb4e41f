"""POST /v1/retrieve on a server started with --index (tests/test_serve.sh
starts it on an index of examples/company, EN_INDEX): (a) ranked ids and
scores equal an independent float64 BM25 over the passages read with
sqlite3 (FTS5's formula: bm25_ref.py, shared with tests/test_index.sh);
(b) passage fields equal the DB rows; (c) 16 concurrent requests equal each alone;
(d) bad bodies: 400 naming the param, GET 405 with Allow: POST, queries of
thousands of one-letter words searched (issue 31's overflow); (e) a
server without --index (EN_URL_MAIN) answers 404 retrieval_not_enabled."""
import os
import sqlite3
import threading

from bm25_ref import bm25_top, tokens
from common import check, finish, http, post

DB = os.environ["EN_INDEX"]
MAIN = os.environ.get("EN_URL_MAIN", "")


def rows():
    c = sqlite3.connect(DB)
    r = c.execute("SELECT p.id, f.path, p.section, p.text, p.line_start, p.line_end"
                  " FROM passages p JOIN files f ON f.id = p.file_id ORDER BY p.id").fetchall()
    c.close()
    return {x[0]: x for x in r}


P = rows()


docs = {pid: tokens(p[2]) + tokens(p[3]) for pid, p in P.items()}


QUERIES = [("Tern gripper suction cups", 5), ("vacation days policy", 3),
           ("Bramble fleet software", 5), ("founded bakery Harrowgate", 7),
           ("firmware update reboot", 1)]
for q, k in QUERIES:
    st, js, raw = post("/v1/retrieve", {"query": q, "top_k": k})
    ok = st == 200 and js.get("object") == "list" and js.get("model") == os.path.basename(DB)
    data = js.get("data", []) if ok else []
    ref = bm25_top(docs, q, k)
    same = [d["id"] for d in data] == [r[0] for r in ref] and all(
        abs(d["score"] - r[1]) <= 1e-6 * abs(r[1]) for d, r in zip(data, ref))
    check(ok and same and len(data) <= k and [d["index"] for d in data] == list(range(len(data))),
          f"top-{k} for {q!r}: ids and scores as float64 BM25", f"{st} {raw[:300]!r} ref {ref}")
    fields = all(d["object"] == "passage" and (d["file"], d["section"], d["text"],
                 d["line_start"], d["line_end"]) == P[d["id"]][1:] for d in data)
    check(fields, f"passages of {q!r} equal the index's rows")

# (c) concurrency
alone = {q: post("/v1/retrieve", {"query": q, "top_k": k})[2] for q, k in QUERIES}
got = [None] * 16


def one(i):
    q, k = QUERIES[i % len(QUERIES)]
    got[i] = (q, post("/v1/retrieve", {"query": q, "top_k": k})[2])


th = [threading.Thread(target=one, args=(i,)) for i in range(16)]
for t in th:
    t.start()
for t in th:
    t.join()
check(all(g and g[1] == alone[g[0]] for g in got), "16 concurrent retrieves equal each alone")

# (d) bad input
BAD = [({"top_k": 3}, "query"), ({"query": ""}, "query"), ({"query": 5}, "query"),
       ({"query": "x", "top_k": 0}, "top_k"), ({"query": "x", "top_k": 101}, "top_k"),
       ({"query": "x", "top_k": "5"}, "top_k"), ({"query": "x", "top_k": 10000}, "top_k"),
       ({"query": "q" * 9000}, "query"), ({"query": ("vacation " * 116509)[:1 << 20]}, "query")]
for body, param in BAD:
    st, js, raw = post("/v1/retrieve", body)
    err = (js or {}).get("error") or {}
    check(st == 400 and err.get("param") == param, f"{str(body)[:60]} -> 400 param {param}",
          f"{st} {raw[:200]!r}")
st, js, raw = post("/v1/retrieve", "not json")
check(st == 400 and isinstance((js or {}).get("error"), dict), "a non-JSON body -> 400")
st, hd, raw = http("GET", "/v1/retrieve")
check(st == 405 and hd.get("allow") == "POST", "GET /v1/retrieve -> 405, Allow: POST",
      f"{st} {hd}")

# (d2) one-letter words quote to 7 bytes each (' OR "a"'), more than the 3n + 8
# bytes match_expr once allocated (issue 31): searched, and the server lives
for q in [" ".join(["a"] * 16), " ".join(["a"] * 4096)[:8192], " ".join(['a"'] * 2730)]:
    st, js, raw = post("/v1/retrieve", {"query": q, "top_k": 3})
    check(st == 200 and len((js or {}).get("data", [])) <= 3,
          f"a query of {len(q.split())} one-letter words ({len(q)} bytes) -> 200",
          f"{st} {raw[:200]!r}")
q, k = QUERIES[0]
check(post("/v1/retrieve", {"query": q, "top_k": k})[2] == alone[q],
      "after them the server answers as before")

# (e) no --index
if MAIN:
    st, js, raw = post("/v1/retrieve", {"query": "vacation"}, url=MAIN)
    check(st == 404 and ((js or {}).get("error") or {}).get("code") == "retrieval_not_enabled",
          "a server without --index -> 404 retrieval_not_enabled", f"{st} {raw[:200]!r}")
finish("retrieve")
