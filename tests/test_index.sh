#!/usr/bin/env bash
# test_index.sh ENERGON [FIXTURES SHARED] - `energon index` (rag/, issue 15's
# first piece) against independent Python: byte and line ranges of txt / md
# passages, chunk sizes and overlaps, the HTML text against an html.parser
# extraction, the BM25 ranking against a float64 BM25 with FTS5's formula,
# a query of many one-letter words, incremental updates, a crash in the middle
# of an update and of the first build (EN_INDEX_FAIL_AFTER, and a SIGKILL), .txt
# title lines, --docs FILE, and bad input (an empty and an unreadable folder,
# binary and non-UTF-8 files, a bad .jsonl line). Needs .venv-test/bin/python
# (scripts/install-deps).
set -u
ENERGON=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$ROOT/.venv-test/bin/python
if [ ! -x "$PY" ]; then
    echo "SKIP: $PY missing (run scripts/install-deps)"
    exit 77
fi
T=$(mktemp -d /tmp/en_index_XXXXXX)
trap 'rm -rf "$T"' EXIT
"$PY" - "$ENERGON" "$ROOT" "$T" <<'PYEOF'
import html.parser, os, re, shutil, sqlite3, subprocess, sys

energon, root, T = sys.argv[1:4]
N, M = 60, 8
fails = []

def check(cond, what):
    print(("  ok   " if cond else "  FAIL ") + what)
    if not cond:
        fails.append(what)

def run(*args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([energon, "index", *args], capture_output=True, text=True, env=e)
    return p.returncode, p.stdout + p.stderr

D = os.path.join(T, "docs")
shutil.copytree(os.path.join(root, "examples/company"), D)
long_words = " ".join("word%d" % i for i in range(1, 301))
with open(os.path.join(D, "long.txt"), "w") as f:
    f.write("Intro line one.\nIntro line two.\n\n\n   " + long_words + "  \n\nShort tail.\n")
with open(os.path.join(D, "notes.md"), "w") as f:
    f.write("Preamble text before any heading.\n\n# Gripper care\n\nClean the Petal "
            "suction cups weekly.\nReplace worn cups.\n\n## Firmware ##\n\n```sh\n"
            "update --to 3.1.5\n\nreboot\n```\n\nAfter the update the arm restarts.\n\n"
            "### Long notes\n\n" + " ".join("note%d" % i for i in range(150)) + "\n")
os.makedirs(os.path.join(D, "site"))
HTML = """<!DOCTYPE html><html><head><title>Site help</title>
<style>p { color: red; }</style><script>var x = "<p>not text</p>";</script></head>
<body><p>Welcome to the <b>help</b> site &amp; its pages.</p>
<h1>Charging &lt;Heron&gt;</h1><p>The Heron dock charges a Wren in 40 minutes.<br>Keep it
dry.</p><ul><li>Plug in</li><li>Wait for the &quot;green&quot; light &#8212; then go</li></ul>
<!-- a comment <p>hidden</p> -->
<h2>Caf&#xE9; rules</h2><div>No drinks near the <i>Barn</i>.
Coffee stays in The Oven.</div><p>Line with   many    spaces.</p>
</body></html>
"""
with open(os.path.join(D, "site", "help.html"), "w") as f:
    f.write(HTML)
with open(os.path.join(D, "kb.jsonl"), "w") as f:
    f.write('{"id": "kb-1", "title": "Lost badge", "text": "Report a lost badge to the '
            'front desk.\\n\\nA new badge costs 5 euros."}\n\n'
            '{"id": 2, "title": "Parking", "text": "Parking is free for employees."}\n')
with open(os.path.join(D, "image.bin"), "wb") as f:
    f.write(b"\x00\x01\x02")
with open(os.path.join(D, "blob.txt"), "wb") as f:  # a NUL byte: binary, skipped
    f.write(b"text\x00\x01\x02")

DB = os.path.join(T, "index.db")
rc, out = run("--docs", D, "--out", DB, "--chunk-tokens", str(N), "--overlap", str(M))
print(out.strip())
# skipped: examples/company's .jsonl data files (no "text"), base_model.json,
# image.bin and the binary blob.txt
n_data = sum(1 for x in os.listdir(D) if x.endswith(".jsonl") and x != "kb.jsonl")
check(rc == 0 and "files 8 added" in out and "%d skipped" % (n_data + 3) in out,
      "first run: 8 files indexed; %d .jsonl data files, base_model.json, image.bin and "
      "binary blob.txt skipped" % n_data)
if rc != 0:
    sys.exit(1)

def rows(db=DB):
    c = sqlite3.connect(db)
    r = c.execute("SELECT p.id, f.path, f.kind, p.section, p.text, p.byte_start, p.byte_end,"
                  " p.line_start, p.line_end, p.record_id FROM passages p JOIN files f"
                  " ON f.id = p.file_id ORDER BY p.id").fetchall()
    c.close()
    return r

P = rows()
# (a) byte and line ranges, sizes, overlaps
ok_bytes = ok_lines = ok_size = True
for pid, path, kind, sec, text, bs, be, ls, le, rid in P:
    ok_size &= len(text.split()) <= N
    if kind in ("txt", "md"):
        raw = open(os.path.join(D, path), "rb").read()
        ok_bytes &= text in raw[bs:be].decode()
        ok_lines &= ls == raw[:bs].count(b"\n") + 1 and le == raw[:be - 1].count(b"\n") + 1
check(ok_bytes, "every txt/md passage's text is in file[byte_start:byte_end]")
check(ok_lines, "every txt/md passage's line range matches its bytes")
check(ok_size, "no passage over %d words" % N)
lp = [p for p in P if p[1] == "long.txt"]
pairs = 0
ok_ov = True
for a, b in zip(lp, lp[1:]):
    if a[6] > b[5]:  # byte ranges overlap: two windows of one paragraph
        pairs += 1
        ok_ov &= a[4].split()[-M:] == b[4].split()[:M]
        long_raw = open(os.path.join(D, "long.txt"), "rb").read()
        ok_ov &= len(long_raw[b[5]:a[6]].split()) == M
check(pairs >= 4 and ok_ov, "consecutive windows of the 300-word paragraph overlap by "
      "exactly %d words (%d pairs)" % (M, pairs))
allw = []
for p in lp:
    allw += p[4].split()
check(lp[0][4] == "Intro line one.\nIntro line two." and lp[-1][4] == "Short tail."
      and set(long_words.split()) <= set(allw), "long.txt: paragraphs kept whole, every word in")
md = [p for p in P if p[1] == "notes.md"]
check([p[3] for p in md][:3] == ["", "Gripper care", "Firmware"] and "reboot" in md[2][4]
      and "```sh" in md[2][4], "markdown: headings are sections, fenced code kept")
kb = [p for p in P if p[1] == "kb.jsonl"]
check([(p[9], p[3], p[7]) for p in kb] == [("kb-1", "Lost badge", 1), ("2", "Parking", 3)]
      and kb[0][5] is None, "jsonl: one section a record, id/title/line kept")

# (b) HTML text against an html.parser extraction
class Extract(html.parser.HTMLParser):
    BLOCK = set("p div li br ul ol dl dt dd table tr td th thead tbody section article header "
                "footer nav main aside blockquote pre hr title html head body form figure "
                "figcaption caption address".split())
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.secs = [["", []]]
        self.cur, self.title, self.skip, self.inh = [], None, 0, False
    def end_para(self):
        t = " ".join("".join(self.cur).split())
        if t:
            self.secs[-1][1].append(t)
        self.cur = []
    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self.end_para(); self.inh = True; self.title = []
        elif tag in self.BLOCK:
            if self.inh: self.title.append(" ")
            else: self.end_para()
    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip -= 1
        elif re.fullmatch(r"h[1-6]", tag):
            self.end_para()
            if self.inh:
                self.secs.append([" ".join("".join(self.title).split()), []])
            self.inh = False
        elif tag in self.BLOCK:
            if self.inh: self.title.append(" ")
            else: self.end_para()
    def handle_data(self, data):
        if self.skip: return
        (self.title if self.inh else self.cur).append(data)
ex = Extract()
ex.feed(HTML); ex.close(); ex.end_para()
want = [(s, "\n\n".join(ps)) for s, ps in ex.secs if ps]
DBH = os.path.join(T, "html.db")
rc, out = run("--docs", os.path.join(D, "site"), "--out", DBH, "--chunk-tokens", "10000",
              "--overlap", "0")
got = [(p[3], p[4]) for p in rows(DBH)]
check(rc == 0 and got == want, "HTML sections and text equal html.parser's extraction")
if got != want:
    print("    got ", got, "\n    want", want)

# (c) BM25 ranking against an independent float64 BM25 (FTS5's formula)
sys.path.insert(0, os.path.join(root, "tests", "serve"))
from bm25_ref import bm25_top, tokens
docs = {p[0]: tokens(p[3]) + tokens(p[4]) for p in P}
c = sqlite3.connect(DB)
for q in ["Tern gripper suction cups", "vacation days policy", "Bramble fleet software",
          "founded bakery Harrowgate", "firmware update reboot"]:
    m = " OR ".join('"%s"' % w for w in q.split())
    got = c.execute("SELECT rowid, -bm25(passages_fts) FROM passages_fts WHERE passages_fts"
                    " MATCH ? ORDER BY bm25(passages_fts), rowid LIMIT 5", (m,)).fetchall()
    rc, out = run("--search", DB, "--query", q, "--top-k", "5")
    cli = [int(x) for x in re.findall(r"\(passage (\d+)\)", out)]
    ref = bm25_top(docs, q, 5)
    same = [g[0] for g in got] == [r[0] for r in ref] == cli and all(
        abs(g[1] - r[1]) <= 1e-6 * abs(r[1]) for g, r in zip(got, ref))
    check(rc == 0 and same and len(ref) == 5, "top-5 for %r: ids and scores as float64 BM25" % q)
    if not same:
        print("    fts5", got, "\n    ref ", ref, "\n    cli ", cli)
c.close()
rc, out = run("--search", DB, "--query", 'AND "( NEAR * - : ^', "--top-k", "3")
check(rc == 0, "a query of FTS5 syntax characters is not an error")
# one-letter words quote to 7 bytes each (' OR "a"'), more than the 3n + 8
# bytes match_expr once allocated: issue 31's heap overflow
for q in [" ".join(["a"] * 16), " ".join(["a"] * 4000), " ".join(['a"'] * 2700),
          "\t".join("x" * 3000)]:
    rc, out = run("--search", DB, "--query", q, "--top-k", "3")
    check(rc == 0, "a query of %d one-letter words (%d bytes) is searched: rc %d %s"
          % (len(q.split()), len(q), rc, out.strip().splitlines()[-1:] if rc else ""))
# a repeated word counts once (the same tokens to FTS5: case and diacritics
# folded): its copies are the same phrase, and bm25() costs about the square
# of the phrases matching a row
rc, once = run("--search", DB, "--query", "Tern gripper", "--top-k", "5")
rc2, rep = run("--search", DB, "--query", "tern Tern gripper TËRN térn gripper", "--top-k", "5")
check(rc == 0 and rc2 == 0 and once == rep and "(passage " in once,
      "repeated words (in other case, with diacritics) rank as the words once")
variants = [t + h + e for t in "tţťṫṭṯṱTŢŤ" for h in "hĥḣḥḧḩḫHĤ" for e in "eéèêëēĕėęěẹẻẽ"]
rc, once = run("--search", DB, "--query", "the", "--top-k", "5")
rc2, rep = run("--search", DB, "--query", " ".join(variants[:1000]), "--top-k", "5")
check(rc == 0 and rc2 == 0 and once == rep, "1000 spellings of 'the' rank as 'the'")

# (d) incremental updates
def index():
    return run("--docs", D, "--out", DB, "--chunk-tokens", str(N), "--overlap", str(M))
rc, out = index()
check(rc == 0 and "0 added, 0 changed, 8 unchanged, 0 removed" in out and rows() == P,
      "second run: all unchanged, passages identical")
with open(os.path.join(D, "handbook.txt"), "a") as f:
    f.write("\nA new paragraph about the quarterly offsite in Port Velling.\n")
rc, out = index()
P2 = rows()
other = lambda rs, name: [r for r in rs if r[1] != name]
check(rc == 0 and "0 added, 1 changed, 7 unchanged" in out and other(P2, "handbook.txt") ==
      other(P, "handbook.txt") and any("offsite" in r[4] for r in P2),
      "a changed file re-indexes only its rows")
os.remove(os.path.join(D, "kb.jsonl"))
rc, out = index()
P3 = rows()
check(rc == 0 and "7 unchanged, 1 removed" in out and not [r for r in P3 if r[1] == "kb.jsonl"]
      and P3 == other(P2, "kb.jsonl"), "a deleted file's rows are removed, the rest kept")
rc, out = run("--docs", D, "--out", DB, "--chunk-tokens", "80", "--overlap", "8")
check(rc == 0 and "rebuilt" in out and "7 added" in out, "other chunk settings rebuild")
rc, out = index()
P3 = rows()

# (e) a crash in the middle of an update leaves the previous index
for name in ("products.txt", "notes.md"):
    with open(os.path.join(D, name), "a") as f:
        f.write("\nAppended for the crash test.\n")
rc, out = run("--docs", D, "--out", DB, "--chunk-tokens", str(N), "--overlap", str(M),
              env={"EN_INDEX_FAIL_AFTER": "1"})
c = sqlite3.connect(DB)
integ = c.execute("PRAGMA integrity_check").fetchone()[0]
c.execute("INSERT INTO passages_fts(passages_fts, rank) VALUES('integrity-check', 1)")
c.close()
check(rc != 0 and integ == "ok" and rows() == P3,
      "abort() after 1 file inside the transaction: rc %d, integrity ok, rows as before" % rc)
rc, out = index()
check(rc == 0 and "2 changed" in out, "the next run applies the update: " + out.strip())

# (e2) a crash in the middle of the FIRST build (issue 31): the empty schema
# is committed before the build's transaction, so the file once read as a
# valid empty index ("no passage matches", exit 0). Readers refuse it, naming
# it and saying to rebuild; a build over it works.
DB1 = os.path.join(T, "first.db")
rc, out = run("--docs", D, "--out", DB1, "--chunk-tokens", str(N), "--overlap", str(M),
              env={"EN_INDEX_FAIL_AFTER": "1"})
rc2, out2 = run("--search", DB1, "--query", "vacation days")
check(rc != 0 and rc2 == 1 and DB1 in out2 and "rebuild" in out2,
      "abort() inside the first build: --search refuses the file: rc %d, %s" % (rc2, out2.strip()))
rc, out = run("--docs", D, "--out", DB1, "--chunk-tokens", str(N), "--overlap", str(M))
rc2, out2 = run("--search", DB1, "--query", "vacation days")
same = sorted(r[1:] for r in rows(DB1)) == sorted(r[1:] for r in rows())
check(rc == 0 and " added, 0 changed" in out and rc2 == 0 and "(passage " in out2 and same,
      "a build over it works, its passages those of the index of the same files: " +
      out.strip())

# (f) bad input
bad = os.path.join(T, "bad")
os.makedirs(bad)
with open(os.path.join(bad, "latin1.txt"), "wb") as f:
    f.write(b"caf\xe9 au lait\n")
before = rows()
rc, out = run("--docs", D, bad, "--out", DB, "--chunk-tokens", str(N), "--overlap", str(M))
check(rc == 1 and "latin1.txt" in out and "UTF-8" in out and rows() == before,
      "non-UTF-8 file: exit 1, named, index unchanged: " + out.strip().splitlines()[-1])
os.remove(os.path.join(bad, "latin1.txt"))
with open(os.path.join(bad, "x.jsonl"), "w") as f:
    f.write('{"id": "a", "title": "A", "text": "fine"}\n{"id": "b", "text": \n')
rc, out = run("--docs", bad, "--out", os.path.join(T, "b.db"))
check(rc == 1 and "x.jsonl:2" in out, "bad jsonl line: exit 1, file:line named: " +
      out.strip().splitlines()[-1])
rc, out = run("--docs", os.path.join(T, "missing"), "--out", os.path.join(T, "c.db"))
check(rc == 2 and "--docs" in out and "missing" in out, "missing --docs folder: " + out.strip())
rc, out = run("--docs", D, "--out", os.path.join(T, "no", "such", "dir", "x.db"))
check(rc == 1 and "--out" in out and "x.db" in out, "unwritable --out: " + out.strip())
with open(os.path.join(T, "junk.db"), "w") as f:
    f.write("not a database at all" * 100)
rc, out = run("--search", os.path.join(T, "junk.db"), "--query", "x")
check(rc == 1 and "junk.db" in out, "corrupt index: " + out.strip())
rc, out = run("--docs", D, "--out", DB, "--overlap", "300")
check(rc == 2 and "--overlap" in out, "--overlap >= --chunk-tokens: " + out.strip())

# (g) .txt title lines against a Python reading of the rule: a one-line
# paragraph of 1..12 words, starting with a letter, digit or non-ASCII
# character, not ending in . ! ? : ; , and followed by a paragraph that is not
# such a line, titles the paragraphs after it and is not passage text
def txt_paras(raw):
    out, pos = [], 0  # (start, end) byte spans, blank-line separated, trimmed
    for m in re.finditer(rb"(?:[^\n]*[^\s\n][^\n]*(?:\n|$))+", raw):
        a, b = m.start(), m.end()
        while raw[a:a + 1].isspace(): a += 1
        while raw[b - 1:b].isspace(): b -= 1
        out.append((a, b))
    return out
def title_like(t):
    return ("\n" not in t and 1 <= len(t.split()) <= 12 and (t[0].isalnum() and t[0].isascii()
            or not t[0].isascii()) and t[-1] not in ".!?:;,")
def txt_sections(raw):
    ps = txt_paras(raw)
    like = [title_like(raw[a:b].decode()) for a, b in ps]
    secs = [["", []]]
    for i, (a, b) in enumerate(ps):
        if like[i] and i + 1 < len(ps) and not like[i + 1]:
            secs.append([raw[a:b].decode(), []])
        else:
            secs[-1][1].append((a, b))
    return [(t, sp) for t, sp in secs if sp]
TD = os.path.join(T, "titles")
os.makedirs(TD)
with open(os.path.join(TD, "tricky.txt"), "w") as f:
    f.write("Opening words without a title.\n\n"
            "Part One\n\nChapter A\n\nFirst real paragraph, long enough.\nSecond line.\n\n"
            "Two lines\nare not a title\n\nText.\n\n"
            "A question title?\n\nText after a question.\n\n"
            "- a list item\n\nAfter the item.\n\n"
            "one two three four five six seven eight nine ten eleven twelve thirteen\n\n"
            "After the long line.\n\n"
            "  Indented Title  \r\n\r\nText after CRLF.\r\n\r\n"
            "Café Rules\n\nNo drinks.\n\n"
            "Alice Smith\n\nBob Jones\n\nCarol Day\n\n"
            "Trailing title\n")
names = sorted(os.path.join(root, "examples/company", x) for x in
               os.listdir(os.path.join(root, "examples/company")) if x.endswith(".txt"))
names.append(os.path.join(TD, "tricky.txt"))
DBT = os.path.join(T, "titles.db")
rc, out = run("--docs", *names, "--out", DBT, "--chunk-tokens", "100000", "--overlap", "0")
c = sqlite3.connect(DBT)
got = c.execute("SELECT f.root, f.path, p.section, p.text, p.byte_start, p.byte_end FROM"
                " passages p JOIN files f ON f.id = p.file_id ORDER BY p.id").fetchall()
c.close()
want = []
for name in names:
    raw = open(name, "rb").read()
    for t, sp in txt_sections(raw):
        a, b = sp[0][0], sp[-1][1]
        want.append((os.path.dirname(name), os.path.basename(name), t, raw[a:b].decode(), a, b))
check(rc == 0 and got == want, "txt title lines: sections, texts and byte ranges of %d passages "
      "(examples/company/*.txt, tricky.txt) equal the Python reading" % len(want))
if got != want:
    for g, w in zip(got, want):
        if g != w: print("    got ", g[:3], g[4:], "\n    want", w[:3], w[4:]); break
tr = [g[2] for g in got if g[1] == "tricky.txt"]
check(tr == ["", "Chapter A", "Indented Title", "Café Rules"], "tricky.txt: titles only where "
      "the rule says (not before a title, not with ?, a list marker, 13 words or at the end): %s"
      % tr)

# (h) --docs names files as well as folders (a shell glob): stored as the
# folder's rows, so switching between the two forms re-reads nothing
E = os.path.join(T, "files")
shutil.copytree(os.path.join(root, "examples/company"), E)
DBF = os.path.join(T, "files.db")
txts = sorted(os.path.join(E, x) for x in os.listdir(E) if x.endswith(".txt"))
rc, out = run("--docs", *txts, "--out", DBF)
check(rc == 0 and "files 3 added, 0 changed, 0 unchanged, 0 removed, 0 skipped" in out,
      "--docs FILE FILE FILE: the 3 files only: " + out.strip())
P_files = rows(DBF)
rc, out = run("--docs", E, "--out", DBF)
check(rc == 0 and "1 added, 0 changed, 3 unchanged" in out and
      [r for r in rows(DBF) if r[1].endswith(".txt")] == P_files,
      "then --docs FOLDER: the txt files unchanged (same rows), README.md added")
rc, out = run("--docs", txts[0], txts[1], txts[0], "--out", DBF)
check(rc == 0 and "0 added, 0 changed, 2 unchanged, 2 removed" in out and
      sorted({r[1] for r in rows(DBF)}) == sorted(os.path.basename(x) for x in txts[:2]),
      "then two files (one named twice): the others removed: " + out.strip())
rc, out = run("--docs", E, txts[0], "--out", DBF)
check(rc == 0 and "2 added, 0 changed, 2 unchanged, 0 removed" in out,
      "a folder and a file in it: the file counted once: " + out.strip())
rc, out = run("--docs", os.path.join(E, "nosuch.txt"), "--out", DBF)
check(rc == 2 and "nosuch.txt" in out and "no such file or folder" in out,
      "a missing --docs file: " + out.strip())

# (i) SIGKILL in the middle of a real update: 300 changed files, killed once
# the rollback journal exists (the transaction has written); the journal is
# hot, a read-only open (--search) rolls it back and ranks as before, the
# file is intact with the rows of before, and a re-run applies the update
import random, signal, time
K = os.path.join(T, "kill")
os.makedirs(K)
rng = random.Random(7)
vocab = ["tern", "wren", "heron", "bramble", "badge", "leave", "laptop", "cart", "dock", "site"]
for i in range(300):
    with open(os.path.join(K, "f%03d.txt" % i), "w") as f:
        for _ in range(20):
            f.write(" ".join("%s%d" % (rng.choice(vocab), rng.randrange(3000))
                             for _ in range(80)) + ".\n\n")
DBK = os.path.join(T, "kill.db")
def kill_mid_build(db):
    """Start a build into db, SIGKILL it once its journal exists; rc, hot"""
    p = subprocess.Popen([energon, "index", "--docs", K, "--out", db],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while not os.path.exists(db + "-journal") and p.poll() is None and time.time() - t0 < 30:
        time.sleep(0.001)
    time.sleep(0.2)
    p.send_signal(signal.SIGKILL)
    rc = p.wait()
    return rc, os.path.exists(db + "-journal") and os.path.getsize(db + "-journal") > 0
# the FIRST build killed: no committed build, so readers refuse the file
rc, hot = kill_mid_build(DBK)
check(rc == -signal.SIGKILL and hot, "SIGKILL mid first build: killed (rc %d), a hot journal "
      "left (%s)" % (rc, hot))
rc, out = run("--search", DBK, "--query", "tern12", "--top-k", "5")
# (the journal is rolled back when hot; one killed before its first sync is
# not hot and stays, harmless: the file then holds the schema alone)
check(rc == 1 and DBK in out and "rebuild" in out, "after it --search refuses the file "
      "(journal %s): rc %d, %s" % ("left" if os.path.exists(DBK + "-journal") else "rolled back",
                                   rc, out.strip()))
rc, out = run("--docs", K, "--out", DBK)
check(rc == 0 and "files 300 added" in out, "a build over it works: " + out.strip())
before_rows = rows(DBK)
q = ["--search", DBK, "--query", "tern12 wren7 badge99", "--top-k", "5"]
before_search = run(*q)
for i in range(300):
    with open(os.path.join(K, "f%03d.txt" % i), "a") as f:
        f.write("Changed for the kill test.\n")
before_bytes = open(DBK, "rb").read()
rc, hot = kill_mid_build(DBK)
changed = open(DBK, "rb").read() != before_bytes
check(rc == -signal.SIGKILL and hot, "SIGKILL mid-update: killed (rc %d), a hot journal left "
      "(%s), the index file %s" % (rc, hot, "already written" if changed else "not yet written"))
after_search = run(*q)
check(after_search == before_search and before_search[0] == 0 and
      not os.path.exists(DBK + "-journal"), "after the kill a read-only --search rolls the "
      "journal back and ranks as before")
c = sqlite3.connect(DBK)
integ = c.execute("PRAGMA integrity_check").fetchone()[0]
c.execute("INSERT INTO passages_fts(passages_fts, rank) VALUES('integrity-check', 1)")
c.close()
check(integ == "ok" and rows(DBK) == before_rows, "after the kill: integrity ok, FTS5 "
      "integrity-check ok, rows as before")
rc, out = run("--docs", K, "--out", DBK)
check(rc == 0 and "300 changed" in out and
      sum("Changed for the kill test." in r[4] for r in rows(DBK)) == 300,
      "a re-run applies the update: " + out.strip())

# (j) more bad input: an empty folder, an unreadable folder
EMPTY = os.path.join(T, "empty")
os.makedirs(EMPTY)
rc, out = run("--docs", EMPTY, "--out", os.path.join(T, "e.db"))
check(rc == 0 and "files 0 added" in out and "0 passages" in out and "warning" in out and
      EMPTY in out, "an empty folder: an empty index, exit 0, a warning naming it: " +
      out.strip())
# root reads any folder: as root, run that one as nobody (setpriv), if it can
as_user = []
if os.geteuid() == 0:
    as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    if not shutil.which("setpriv"):
        as_user = None
if as_user is None:
    print("  skip an unreadable folder: running as root without setpriv to drop it")
else:
    UW = os.path.join(T, "u")
    os.makedirs(os.path.join(UW, "unreadable"))
    os.chmod(T, 0o711)
    os.chmod(UW, 0o777)
    os.chmod(os.path.join(UW, "unreadable"), 0)
    p = subprocess.run(as_user + [energon, "index", "--docs", os.path.join(UW, "unreadable"),
                       "--out", os.path.join(UW, "u.db")], capture_output=True, text=True)
    os.chmod(os.path.join(UW, "unreadable"), 0o755)
    out = p.stdout + p.stderr
    if p.returncode in (126, 127):  # nobody cannot run the binary (a private build folder)
        print("  skip an unreadable folder: nobody cannot run %s: %s" % (energon, out.strip()))
    else:
        check(p.returncode == 1 and "unreadable" in out and "cannot read" in out,
              "an unreadable folder%s: exit 1, named: %s" % (" (as nobody)" if as_user else "",
                                                             out.strip()))

print("test_index: %d failure(s)" % len(fails))
sys.exit(1 if fails else 0)
PYEOF
