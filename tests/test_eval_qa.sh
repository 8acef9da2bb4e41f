#!/usr/bin/env bash
# test_eval_qa.sh ENERGON [FIXTURES SHARED] - `energon eval qa` (issue 15's
# grounded QA evaluation) against independent Python: on stories260K (its
# answers are junk, which is fine: the arithmetic is what is checked) and an
# index of examples/company's three documents, 8 questions of eval_qa.jsonl.
#  - recall@1, recall@k, MRR recomputed from the retrieved files of --out, and
#    the retrieved ids against a float64 phrase-aware BM25 with FTS5's formula;
#  - EM, token F1 and "contains" recomputed from the answers with a separate
#    SQuAD normalisation, per question and as the --json means (1e-9);
#  - a second run whose gold answers are cut from the first run's answers, so
#    that EM and F1 are not all zero (temperature 0: the answers repeat);
#  - bad input: a missing field, bad JSON, a missing or corrupt index.
# Needs the stories260K GGUF under SHARED/models (skipped without it).
set -u
ENERGON=$1
SHARED=${3:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODEL=$SHARED/models/stories260K/stories260K.gguf
if [ ! -f "$MODEL" ]; then
    echo "SKIP: $MODEL missing (the shared models folder is absent)"
    exit 77
fi
PY=$ROOT/.venv-test/bin/python
[ -x "$PY" ] || PY=python3 # the standard library is enough
T=$(mktemp -d /tmp/en_eval_qa_XXXXXX)
trap 'rm -rf "$T"' EXIT
"$PY" - "$ENERGON" "$ROOT" "$T" "$MODEL" <<'PYEOF'
import json, math, os, re, shutil, sqlite3, subprocess, sys
from collections import Counter

energon, root, T, model = sys.argv[1:5]
TOP_K = 3
fails = []

def check(cond, what):
    print(("  ok   " if cond else "  FAIL ") + what)
    if not cond:
        fails.append(what)

def run(*args):
    p = subprocess.run([energon, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr

D = os.path.join(T, "docs")
os.makedirs(D)
for name in ("handbook.txt", "policies.txt", "products.txt"):
    shutil.copy(os.path.join(root, "examples/company", name), D)
DB = os.path.join(T, "index.db")
# small passages: stories260K's context is 512 tokens
rc, out, err = run("index", "--docs", D, "--out", DB, "--chunk-tokens", "40", "--overlap", "8")
check(rc == 0, "index built: " + err.strip())
if rc:
    sys.exit(1)

recs = [json.loads(l) for l in open(os.path.join(root, "examples/company/eval_qa.jsonl"))]
QA = os.path.join(root, "examples/company/qa.jsonl")
qa_prompts = {json.loads(l)["prompt"] for l in open(QA)}
check(len(recs) >= 55 and not [r for r in recs if r["question"] in qa_prompts]
      and {r["source"] for r in recs} == {"handbook.txt", "policies.txt", "products.txt"},
      "eval_qa.jsonl: %d questions, none a prompt of qa.jsonl, all three documents" % len(recs))
pick = recs[0:3] + recs[30:33] + recs[60:62]  # handbook, policies, products

# ---- the independent scorer (SQuAD v2's, ASCII) ----
PUNCT = set('!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~')
CITE = re.compile(r"\[[0-9]+(?:[ \t\n\r\f\v]*,[ \t\n\r\f\v]*[0-9]+)*\]")

def words(s, cite):
    if cite:
        s = CITE.sub("", s)
    s = "".join(c for c in s if c not in PUNCT)
    s = "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in s)
    return [w for w in re.split(r"[ \t\n\r\f\v]+", s) if w and w not in ("a", "an", "the")]

def score(pred, gold):
    p, g = words(pred, True), words(gold, False)
    em = float(p == g)
    common = sum((Counter(p) & Counter(g)).values())
    f1 = 0.0 if common == 0 else 2 * (common / len(p)) * (common / len(g)) / (
        common / len(p) + common / len(g))
    contains = float(any(p[i:i + len(g)] == g for i in range(len(p) - len(g) + 1)))
    return em, f1, contains

check(words("The [1] Tern-3 [2, 3] lifts AN arm.", True) == ["tern3", "lifts", "arm"]
      and score("It is 9 kg [1].", "9 kg")[0] == 0.0 and score("9 kg [1]", "the 9 kg")[0] == 1.0,
      "the reference scorer itself")

# ---- an independent BM25 (FTS5's formula, query words as phrases) ----
con = sqlite3.connect(DB)
P = {pid: (path, re.findall(r"[^\W_]+", (sec + " " + text).lower())) for pid, path, sec, text in
     con.execute("SELECT p.id, f.path, p.section, p.text FROM passages p JOIN files f "
                 "ON f.id = p.file_id")}
con.close()
avgdl = sum(len(t) for _, t in P.values()) / len(P)

def occurrences(toks, phrase):
    n = len(phrase)
    return sum(1 for i in range(len(toks) - n + 1) if toks[i:i + n] == phrase)

def bm25(query):
    phrases = [re.findall(r"[^\W_]+", w.lower()) for w in query.split()]
    phrases = [p for p in phrases if p]
    freq = {pid: [occurrences(t, p) for p in phrases] for pid, (_, t) in P.items()}
    scores = {}
    for i, p in enumerate(phrases):
        nq = sum(1 for f in freq.values() if f[i])
        idf = math.log((len(P) - nq + 0.5) / (nq + 0.5))
        idf = idf if idf > 0 else 1e-6
        for pid, f in freq.items():
            if f[i]:
                dl = len(P[pid][1])
                scores[pid] = scores.get(pid, 0.0) + idf * f[i] * 2.2 / (
                    f[i] + 1.2 * (1 - 0.75 + 0.75 * dl / avgdl))
    return scores

def source_rank(files, source):
    for i, f in enumerate(files):
        if f == source or f.endswith("/" + source):
            return i + 1
    return 0

def run_eval(data, tag):
    out = os.path.join(T, tag + ".jsonl")
    rc, so, se = run("eval", "qa", "--data", data, "--index", DB, "--model", model,
                     "--top-k", str(TOP_K), "--max-tokens", "12", "--json", "--out", out)
    check(rc == 0, "%s: eval qa ran (rc %d) %s" % (tag, rc, se.strip()[-300:] if rc else ""))
    if rc:
        sys.exit(1)
    return json.loads(so), [json.loads(l) for l in open(out)]

def verify(agg, rows, golds, tag):
    n = len(rows)
    check(agg["questions"] == n == len(golds) and agg["top_k"] == TOP_K,
          "%s: %d questions, top_k %d" % (tag, n, TOP_K))
    ranks = [source_rank(r["retrieved_files"], g["source"]) for r, g in zip(rows, golds)]
    ok_rank = all(r["rank"] == k for r, k in zip(rows, ranks))
    want = {"recall_at_1": sum(k == 1 for k in ranks) / n,
            "recall_at_k": sum(k > 0 for k in ranks) / n,
            "mrr": sum(1 / k for k in ranks if k) / n}
    ok = ok_rank and all(abs(agg[k] - v) <= 1e-9 for k, v in want.items())
    check(ok, "%s: recall@1 %.3f, recall@%d %.3f, MRR %.3f recomputed from the files" %
          (tag, want["recall_at_1"], TOP_K, want["recall_at_k"], want["mrr"]))
    ok_bm = True
    for r in rows:
        s = bm25(r["question"])
        ref = sorted(s.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_K]
        got = [s.get(i, -1.0) for i in r["retrieved_ids"]]
        # the same ids, or (a float tie at the cut) the same scores
        same = r["retrieved_ids"] == [i for i, _ in ref] or all(
            abs(a - b[1]) <= 1e-9 * abs(b[1]) for a, b in zip(got, ref))
        if not same or len(got) != len(ref):
            ok_bm = False
            print("    %r: got %s, reference %s" % (r["question"], r["retrieved_ids"], ref))
    check(ok_bm, "%s: retrieved ids = the top %d of a float64 phrase BM25" % (tag, TOP_K))
    ok_q = True
    sums = {}
    for r, g in zip(rows, golds):
        check_gold = r["gold"] == g["answer"] and r["question"] == g["question"]
        for w in ("without", "with"):
            em, f1, c = score(r["answer_" + w], g["answer"])
            got = (r["em_" + w], r["f1_" + w], r["contains_" + w])
            if not check_gold or any(abs(a - b) > 1e-9 for a, b in zip(got, (em, f1, c))):
                ok_q = False
                print("    %r / %r: got %s, reference %s" % (r["answer_" + w], g["answer"],
                                                             got, (em, f1, c)))
            for k, v in (("em", em), ("f1", f1), ("contains", c)):
                sums[(w, k)] = sums.get((w, k), 0.0) + v
    check(ok_q, "%s: per-question EM, F1, contains = the reference scorer's" % tag)
    ok_a = all(abs(agg[w][k] - v / n) <= 1e-9 for (w, k), v in sums.items())
    check(ok_a, "%s: --json means (without EM %.3f F1 %.3f; with EM %.3f F1 %.3f) = the "
          "reference's" % (tag, sums[("without", "em")] / n, sums[("without", "f1")] / n,
                           sums[("with", "em")] / n, sums[("with", "f1")] / n))
    return sums

D1 = os.path.join(T, "q1.jsonl")
with open(D1, "w") as f:
    for r in pick:
        f.write(json.dumps(r) + "\n")
agg1, rows1 = run_eval(D1, "run1")
verify(agg1, rows1, pick, "run1")

# Run 2: gold answers cut from run 1's answers (same questions, so the same
# answers come back): whole answers (EM 1), pieces (partial F1, contains),
# a citation-marked gold, and unrelated words (0).
gold2 = []
for i, (r, row) in enumerate(zip(pick, rows1)):
    a = row["answer_without"] if i % 2 == 0 else row["answer_with"]
    ws = a.split()
    g = [a, " ".join(ws[:2]), " ".join(ws[1:]) + " extra words", "Lantern Street",
         "the " + a, " ".join(ws[-3:])][i % 6]
    if not words(g, False):
        g = "nothing"
    gold2.append(dict(r, answer=g))
D2 = os.path.join(T, "q2.jsonl")
with open(D2, "w") as f:
    for r in gold2:
        f.write(json.dumps(r) + "\n")
agg2, rows2 = run_eval(D2, "run2")
check([r["answer_with"] for r in rows2] == [r["answer_with"] for r in rows1] and
      [r["answer_without"] for r in rows2] == [r["answer_without"] for r in rows1],
      "run2: temperature 0 gives the same answers again")
s2 = verify(agg2, rows2, gold2, "run2")
check(s2[("without", "em")] + s2[("with", "em")] >= 1 and
      0 < s2[("without", "f1")] + s2[("with", "f1")],
      "run2: some exact matches and a non-zero F1 were scored")

# ---- bad input ----
def bad(name, lines, want, extra=()):
    path = os.path.join(T, name)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    rc, so, se = run("eval", "qa", "--data", path, "--index", DB, "--model", model, *extra)
    ok = rc != 0 and all(w in se for w in want)
    check(ok, "%s: rc %d, %s" % (name, rc, se.strip().splitlines()[-1] if se.strip() else ""))

good = json.dumps(pick[0])
bad("missing.jsonl", [good, "", json.dumps({"question": "Where?", "answer": "Here"})],
    ["missing.jsonl:3", "source"])
bad("badjson.jsonl", [good, '{"question": "x", "answer": '], ["badjson.jsonl:2"])
bad("notobj.jsonl", ['["question"]'], ["notobj.jsonl:1", "object"])
bad("empty.jsonl", [json.dumps({"question": "Who?", "answer": "The", "source": "a.txt"})],
    ["empty.jsonl:1", "answer"])
bad("nonstring.jsonl", [json.dumps({"question": "Who?", "answer": 7, "source": "a.txt"})],
    ["nonstring.jsonl:1", "answer"])
rc, so, se = run("eval", "qa", "--data", D1, "--index", os.path.join(T, "nope.db"), "--model",
                 model)
check(rc != 0 and "nope.db" in se and "--index" in se, "missing index: " + se.strip())
junk = os.path.join(T, "junk.db")
with open(junk, "w") as f:
    f.write("not a database " * 100)
rc, so, se = run("eval", "qa", "--data", D1, "--index", junk, "--model", model)
check(rc != 0 and "junk.db" in se, "corrupt index: " + se.strip())
rc, so, se = run("eval", "qa", "--data", os.path.join(T, "none.jsonl"), "--index", DB,
                 "--model", model)
check(rc != 0 and "none.jsonl" in se, "missing data file: " + se.strip())
rc, so, se = run("eval", "qa", "--data", D1, "--index", DB)
check(rc == 2 and "--model" in se, "no --model: usage error")
rc, so, se = run("eval", "qa", "--data", D1, "--index", DB, "--model", model, "--top-k", "0")
check(rc == 2 and "--top-k" in se, "--top-k 0: usage error")

print("test_eval_qa: %d failure(s)" % len(fails))
sys.exit(1 if fails else 0)
PYEOF
