"""retrieval_chat.py - "retrieval" in /v1/chat/completions (issue 15). A
server started here with --index EN_INDEX (an index of examples/company with
small passages, so that three fit the test model's context) answers chats
grounded in the passages it retrieves. Every expectation comes from outside
the code under test:

  (a) the official openai client gets "citations" back through extra_body,
      streamed (first chunk) and not, the same list both ways;
  (b) the citations are the passages an independent float64 BM25 over the
      index's rows ranks first for the last user message (bm25_ref.py), in
      order, with the rows' fields;
  (c) each citation's line range of its file (read here) contains its text;
  (d) the citations are exactly what was in the prompt: the same chat sent
      WITHOUT retrieval but with the system message written here from the
      documented format (docs/retrieval.md, "Grounded answers") gets the same
      prompt_tokens and, at temperature 0, the same answer; with a system
      message of the user's own, it is kept in front of the sources;
  (e) "cited" is true exactly for the markers "[n]" in the answer;
  (f) 8 concurrent grounded requests each equal the same request alone;
  (g) bad input: top_k 0 and 10000, a non-object, an unknown key -> 400
      naming the param; no user text; a 1 MB question -> 400 "messages"; a
      question of 4096 one-letter words is no crash (issue 31); a server
      without --index (EN_URL) -> 400 retrieval_not_enabled; after all that
      the server still answers.
"""
import os
import sqlite3
import threading

from bm25_ref import bm25_top, tokens
from common import MODEL, Server, check, finish, openai_client, post, short

DB = os.environ["EN_INDEX"]
DOCS = os.environ["EN_DOCS"]  # the folder the index was built from
INSTRUCTION = ("Answer the user's question using only the numbered sources below. After each "
               "fact, cite the source it comes from by its number in brackets, like [1]. If the "
               "sources do not contain the answer, say that you do not know.")


def rows():
    c = sqlite3.connect(DB)
    r = c.execute("SELECT p.id, f.path, p.section, p.text, p.line_start, p.line_end"
                  " FROM passages p JOIN files f ON f.id = p.file_id ORDER BY p.id").fetchall()
    c.close()
    return {x[0]: x for x in r}


P = rows()
DOC_TOKENS = {pid: tokens(p[2]) + tokens(p[3]) for pid, p in P.items()}


def title(c):
    t = f"{c['file']}, {c['section']}" if c["section"] else c["file"]
    return f"{t} (lines {c['line_start']}-{c['line_end']})"


def system_text(cits):
    return INSTRUCTION + "".join(f"\n\n[{c['index']}] {title(c)}\n{c['text']}" for c in cits)


K = 2  # passages a request: two of the index's small ones fit the 512-token context


def body(messages, k=K, **kw):
    b = {"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 24}
    if k:
        b["retrieval"] = {"top_k": k}
    b.update(kw)
    return b


srv = Server("retrieval-chat", "--index", DB, "--model-name", MODEL)
check(srv.url is not None, "a server with --index starts", short(srv.tail()) if not srv.url else "")
url = srv.url
client = openai_client(url)
QUESTIONS = ["How many suction cups does the Petal gripper have?",
             "How many days of annual leave do employees get?",
             "Who must approve a purchase over the procurement limit?",
             "What does the Bramble fleet software do?"]

for q in QUESTIONS:
    msgs = [{"role": "user", "content": q}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=24,
                                       extra_body={"retrieval": {"top_k": K}})
    cits = (r.model_extra or {}).get("citations")
    check(isinstance(cits, list) and len(cits) > 0, f"openai client: citations for {q!r}",
          f"{len(cits or [])} passages")
    if not cits:
        continue
    # (b) the passages BM25 ranks first, with the index's fields
    ref = bm25_top(DOC_TOKENS, q, K)
    same = [c["id"] for c in cits] == [x[0] for x in ref] and [c["index"] for c in cits] == list(
        range(1, len(cits) + 1))
    fields = all((c["file"], c["section"], c["text"], c["line_start"], c["line_end"]) ==
                 P[c["id"]][1:] for c in cits)
    check(same and fields, f"citations of {q!r} are BM25's top {K} with the rows' fields",
          f"got {[c['id'] for c in cits]} ref {[x[0] for x in ref]}")
    # (c) line ranges contain the text
    inside = True
    for c in cits:
        with open(os.path.join(DOCS, c["file"]), encoding="utf-8") as f:
            lines = f.read().split("\n")
        span = "\n".join(lines[c["line_start"] - 1:c["line_end"]])
        inside = inside and c["text"] in span
    check(inside, f"each citation's lines {[(c['line_start'], c['line_end']) for c in cits]} "
          f"contain its text")
    # (d) exactly what was in the prompt
    text = r.choices[0].message.content
    st, hand, raw = post("/v1/chat/completions",
                         body([{"role": "system", "content": system_text(cits)}] + msgs, k=0),
                         url=url)
    ok = st == 200 and hand["usage"]["prompt_tokens"] == r.usage.prompt_tokens and \
        hand["choices"][0]["message"]["content"] == text
    check(ok, f"{q!r}: the same prompt written by hand from the citations: same prompt_tokens "
          f"({r.usage.prompt_tokens}) and answer", short(raw))
    # (e) cited <=> the marker is in the answer
    check(all(c["cited"] == (f"[{c['index']}]" in text) for c in cits),
          f"'cited' flags match the markers in {short(text, 60)!r}")
    # (a) streamed: the first chunk has the same citations (without "cited")
    stream = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0,
                                            max_tokens=24, stream=True,
                                            extra_body={"retrieval": {"top_k": K}})
    chunks = list(stream)
    first = (chunks[0].model_extra or {}).get("citations") if chunks else None
    later = [ch for ch in chunks[1:] if (ch.model_extra or {}).get("citations")]
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    want = [{k: v for k, v in c.items() if k != "cited"} for c in cits]
    check(first == want and not later and streamed == text,
          f"{q!r} streamed: citations in the first chunk only, same list, same text",
          f"first {short(first)} later {len(later)}")

# (d') a system message of the user's own stays in front of the sources
msgs = [{"role": "system", "content": "You are the Quillon assistant."},
        {"role": "user", "content": QUESTIONS[0]}]
st, js, raw = post("/v1/chat/completions", body(msgs), url=url)
cits = js.get("citations", []) if st == 200 else []
hand_sys = "You are the Quillon assistant.\n\n" + system_text(cits)
st2, js2, raw2 = post("/v1/chat/completions",
                      body([{"role": "system", "content": hand_sys}, msgs[1]], k=0), url=url)
check(st == 200 and st2 == 200 and cits and
      js["usage"]["prompt_tokens"] == js2["usage"]["prompt_tokens"] and
      js["choices"][0]["message"]["content"] == js2["choices"][0]["message"]["content"],
      "the user's system message, then the sources: same prompt as written by hand",
      short(raw) + short(raw2))

# without "retrieval": no citations, the plain answer
st, js, raw = post("/v1/chat/completions", body([{"role": "user", "content": QUESTIONS[1]}], k=0),
                   url=url)
check(st == 200 and "citations" not in js, "without retrieval: no citations key", short(raw))

# (f) concurrency
alone = {q: post("/v1/chat/completions", body([{"role": "user", "content": q}]), url=url)[2]
         for q in QUESTIONS}
got = [None] * 8


def one(i):
    q = QUESTIONS[i % len(QUESTIONS)]
    got[i] = (q, post("/v1/chat/completions", body([{"role": "user", "content": q}]), url=url)[2])


th = [threading.Thread(target=one, args=(i,)) for i in range(8)]
for t in th:
    t.start()
for t in th:
    t.join()


def strip_ids(raw):
    import json
    d = json.loads(raw)
    for k in ("id", "created"):
        d.pop(k, None)
    return d


check(all(g and strip_ids(g[1]) == strip_ids(alone[g[0]]) for g in got),
      "8 concurrent grounded requests each equal the same request alone")

# (g) bad input
user = [{"role": "user", "content": QUESTIONS[0]}]
BAD = [({"retrieval": {"top_k": 0}}, "retrieval.top_k"),
       ({"retrieval": {"top_k": 10000}}, "retrieval.top_k"),
       ({"retrieval": 3}, "retrieval"),
       ({"retrieval": {"top_k": 2, "topk": 2}}, "retrieval"),
       ({"retrieval": {"top_k": 2}, "messages": [{"role": "system", "content": "x"}]},
        "messages"),
       ({"retrieval": {"top_k": 2},
         "messages": [{"role": "user", "content": "word " * 200000}]}, "messages")]
for extra, param in BAD:
    b = body(user, k=0)
    b.update(extra)
    st, js, raw = post("/v1/chat/completions", b, url=url)
    err = js.get("error", {}) if isinstance(js, dict) else {}
    check(st == 400 and err.get("param") == param,
          f"{short(str(extra), 60)} -> 400 naming {param}", f"{st} {short(raw)}")
st, js, raw = post("/v1/chat/completions", body(user))  # the main server: no --index
err = js.get("error", {}) if isinstance(js, dict) else {}
check(st == 400 and err.get("code") == "retrieval_not_enabled" and err.get("param") == "retrieval",
      "a server without --index: 400 retrieval_not_enabled", f"{st} {short(raw)}")
# one-letter words once overflowed the FTS5 MATCH expression and killed the
# server (issue 31): the question may be too long for the context, no more
st, js, raw = post("/v1/chat/completions",
                   body([{"role": "user", "content": " ".join(["a"] * 4096)[:8192]}]), url=url)
check(st in (200, 400), f"a question of 4096 one-letter words -> {st}, not a crash", short(raw))
st, js, raw = post("/v1/chat/completions", body(user), url=url)
check(st == 200 and js.get("citations"), "the server still answers after the bad requests")
check(srv.stop() == 0, "the --index server exits 0 on SIGTERM")
finish("retrieval_chat")
