"""A float64 BM25 with SQLite FTS5's formula, the independent reference of
tests/test_index.sh and tests/serve/retrieve.py: k1 = 1.2, b = 0.75, idf =
log((N - n + 0.5) / (n + 0.5)) (1e-6 where that is not positive), words
lower-cased runs of letters and digits (unicode61 on ASCII text); a word
repeated in the query counts once."""
import math
import re


def tokens(s):
    return re.findall(r"[^\W_]+", s.lower())


def bm25_top(docs, query, k):
    """The k best (id, score) of docs ({id: token list}) for query, the
    score descending, then the id ascending (FTS5's ORDER BY bm25, rowid)."""
    n_docs = len(docs)
    avgdl = sum(len(t) for t in docs.values()) / n_docs
    terms = list(dict.fromkeys(query.lower().split()))  # each word once, as rag/index.c
    scores = {}
    for pid, t in docs.items():
        if not any(q in t for q in terms):
            continue
        s = 0.0
        for q in terms:
            nq = sum(1 for d in docs.values() if q in d)
            idf = math.log((n_docs - nq + 0.5) / (nq + 0.5))
            if idf <= 0:
                idf = 1e-6
            f = t.count(q)
            s += idf * f * 2.2 / (f + 1.2 * (1 - 0.75 + 0.75 * len(t) / avgdl))
        scores[pid] = s
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
