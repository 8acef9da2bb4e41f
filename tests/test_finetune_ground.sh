#!/usr/bin/env bash
# test_finetune_ground.sh ENERGON [FIXTURES SHARED] - `energon finetune
# --index` (finetune/ground_data.c): prompt/completion records grounded as the
# server grounds a request. With SmolLM2-135M-Instruct's GGUF (its own chat
# template) and an index of examples/company, --dump-data's rendered records
# are compared with an independent Python reference: the system message built
# per docs/retrieval.md from a float64 BM25 top K over the index's rows
# (tests/serve/bm25_ref.py), the citation marker recomputed with the
# documented rule, the trained span being exactly the completion, its marker
# and the end of turn. Also: a prompt without words gets no passages, chat
# records are left alone, a missing index and --retrieval-top-k without
# --index are errors naming the flag. Needs .venv-test/bin/python
# (scripts/install-deps) and the GGUF at ${ENERGON_SMOLLM2_GGUF:-
# $HOME/.cache/energon/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}.
set -u
ENERGON=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$ROOT/.venv-test/bin/python
GGUF=${ENERGON_SMOLLM2_GGUF:-$HOME/.cache/energon/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ ! -x "$PY" ]; then
    echo "SKIP: $PY missing (run scripts/install-deps)"
    exit 77
fi
if [ ! -f "$GGUF" ]; then
    echo "SKIP: $GGUF missing (SmolLM2-135M-Instruct GGUF; set ENERGON_SMOLLM2_GGUF)"
    exit 77
fi
T=$(mktemp -d /tmp/en_ftg_XXXXXX)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/docs"
cp "$ROOT"/examples/company/{handbook,policies,products}.txt "$T/docs/"
"$ENERGON" index --docs "$T/docs" --out "$T/idx.db" --chunk-tokens 128 --overlap 16 \
    >"$T/index.log" 2>&1 || { echo "FAIL: energon index"; cat "$T/index.log"; exit 1; }
"$PY" - "$ENERGON" "$ROOT" "$T" "$GGUF" <<'PYEOF'
import json, os, re, sqlite3, subprocess, sys

ENERGON, ROOT, T, GGUF = sys.argv[1:5]
sys.path.insert(0, os.path.join(ROOT, "tests", "serve"))
from bm25_ref import bm25_top, tokens  # noqa: E402

passed = failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print("  ok", name)
    else:
        failed += 1
        print("FAIL", name, detail)


INSTRUCTION = ("Answer the user's question using only the numbered sources below. After each "
               "fact, cite the source it comes from by its number in brackets, like [1]. If the "
               "sources do not contain the answer, say that you do not know.")
DB = os.path.join(T, "idx.db")
c = sqlite3.connect(DB)
ROWS = {r[0]: r for r in c.execute(
    "SELECT p.id, f.path, p.section, p.text, p.line_start, p.line_end"
    " FROM passages p JOIN files f ON f.id = p.file_id ORDER BY p.id")}
c.close()
DOCS = {pid: tokens(r[2]) + tokens(r[3]) for pid, r in ROWS.items()}


def words(s):  # the marker rule's words: lowercased ASCII letter/digit runs, distinct
    return set(re.findall(r"[a-z0-9]+", s.lower()))


def marker(completion, texts):
    cw = words(completion)
    best, best_share = 0, -1.0
    for i, t in enumerate(texts):
        share = len(cw & words(t)) / len(cw) if cw else 0.0
        if share > best_share:
            best, best_share = i + 1, share
    return f" [{best}]" if cw and best_share >= 0.5 else ""


def expected(prompt, completion, k):
    # each whitespace word of these prompts is one index token (checked), so
    # FTS5's phrase query is the reference's term query
    q = [tokens(w) for w in prompt.split()]
    assert all(len(x) == 1 for x in q if x), prompt
    top = bm25_top(DOCS, " ".join(x[0] for x in q if x), k)
    rows = [ROWS[pid] for pid, _ in top]
    sys_msg = INSTRUCTION
    for i, (pid, path, section, text, a, b) in enumerate(rows):
        title = f"{path}, {section}" if section else path
        sys_msg += f"\n\n[{i + 1}] {title} (lines {a}-{b})\n{text}"
    ans = completion + marker(completion, [r[3] for r in rows])
    body = (f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
            f"\u27e6{ans}<|im_end|>\n\u27e7")
    return (f"<|im_start|>system\n{sys_msg}<|im_end|>\n" if rows else None), body, ans


RECS = [("What does Quillon Robotics make?",
         "Quillon Robotics makes warehouse robots and the software that runs them."),
        ("How many suction cups does the Petal gripper have?",
         "The Petal gripper has 4 suction cups."),
        ("Who won the football cup in Harrowgate?",
         "Nobody knows who won that football match, sorry."),
        ("?! ...", "Please ask a question.")]
data = os.path.join(T, "data.jsonl")
with open(data, "w") as f:
    for p, a in RECS:
        f.write(json.dumps({"prompt": p, "completion": a}) + "\n")
    f.write(json.dumps({"messages": [{"role": "user", "content": "What does Quillon make?"},
                                     {"role": "assistant", "content": "Robots."}]}) + "\n")

for k in (3, 2):
    r = subprocess.run([ENERGON, "finetune", "--model", GGUF, "--data", data, "--index", DB,
                        "--retrieval-top-k", str(k), "--seq-len", "1024", "--dump-data", "10"],
                       capture_output=True, text=True, timeout=300)
    check(f"k={k}: exit 0", r.returncode == 0, r.stderr[-2000:])
    # the windows' texts, cut into records after each trained span's end
    wins = [blk.split("\ntext: ", 1)[1].rstrip("\n")
            for blk in re.split(r"(?m)^window \d+ ", r.stdout)[1:]]
    texts = [x + "\u27e7" for x in "".join(wins).split("\u27e7")[:-1]]
    check(f"k={k}: every record rendered", len(texts) == len(RECS) + 1, str(len(texts)))
    n_marked = 0
    for i, (p, a) in enumerate(RECS):
        if i >= len(texts):
            break
        got = texts[i]
        head, body, ans = expected(p, a, k)
        n_marked += ans != a
        if head is None:
            check(f"k={k} rec {i}: no words, no sources, no marker",
                  "[1]" not in got and got.endswith(body) and INSTRUCTION not in got, got[:300])
        else:
            check(f"k={k} rec {i}: rendered record equals the reference ({ans[-4:]!r})",
                  got == head + body, f"\n got: {got!r}\nwant: {head + body!r}")
    if len(texts) > len(RECS):
        check(f"k={k}: chat record not grounded", INSTRUCTION not in texts[len(RECS)]
              and "\u27e6Robots.<|im_end|>" in texts[len(RECS)], texts[len(RECS)][:300])
    m = re.search(r"grounded (\d+) prompt/completion records .*?: (\d+) with a citation marker, "
                  r"(\d+) without", r.stderr)
    check(f"k={k}: summary line", m is not None and m.groups() == (
        str(len(RECS)), str(n_marked), str(len(RECS) - n_marked)), r.stderr[-800:])
    check(f"k={k}: the answerable records are marked, the others not", n_marked == 2,
          str(n_marked))

r = subprocess.run([ENERGON, "finetune", "--model", GGUF, "--data", data, "--index",
                    os.path.join(T, "nope.db"), "--dump-data", "1"],
                   capture_output=True, text=True, timeout=300)
check("missing index: error names --index and the file",
      r.returncode != 0 and "--index" in r.stderr and "nope.db" in r.stderr, r.stderr[-500:])
r = subprocess.run([ENERGON, "finetune", "--model", GGUF, "--data", data, "--retrieval-top-k",
                    "2", "--dump-data", "1"], capture_output=True, text=True, timeout=60)
check("--retrieval-top-k without --index: usage error",
      r.returncode == 2 and "--index" in r.stderr, f"rc {r.returncode} {r.stderr[-300:]}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PYEOF
