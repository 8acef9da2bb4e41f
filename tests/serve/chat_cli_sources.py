"""chat_cli_sources.py - `energon chat` with retrieval (issue 15), piped.
EN_URL is a server with --index EN_INDEX. `energon chat --url URL
--retrieval --show-sources --one-line` must print the API's grounded
answer (a direct non-streamed POST with "retrieval": {"top_k": K}, K 3, or
1 when EN_CTX is under 2048 tokens,
temperature 0, the same max_tokens) on one line, then one line per
citation, "  [n] FILE, SECTION (lines A-B)" ("FILE (lines A-B)" when the
section is empty) with '*' after [n] when the API says it is cited; the same
with --model EN_MODEL_DIR --index EN_INDEX (in-process); without
--show-sources stdout is the answer line alone. Against EN_URL_NOINDEX (no
--index) --retrieval fails with exit 1 and says retrieval_not_enabled.
"""
import os
import subprocess

from common import CTX, ENERGON, MODEL, MODEL_DIR, SLOW, URL, check, finish, note, post, short

Q = "How many days of annual leave do employees get?"
MAXT = 24
K = 3 if CTX >= 2048 else 1  # a small test model's context holds one passage
INDEX = os.environ.get("EN_INDEX", "")
NOINDEX = os.environ.get("EN_URL_NOINDEX", "")
OPTS = ["--temperature", "0", "--max-tokens", str(MAXT), "--one-line", "--retrieval-top-k", str(K)]


def chat(args):
    try:
        p = subprocess.run([ENERGON, "chat", *args], input=Q + "\n", capture_output=True, text=True,
                           timeout=120 * SLOW)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        return "timeout", (e.stdout or b"").decode(errors="replace"), (e.stderr or b"").decode(errors="replace")


st, js, raw = post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": Q}],
                                            "temperature": 0, "max_tokens": MAXT, "retrieval": {"top_k": K}})
if not check(st == 200 and len(js.get("citations", [])) == K,
             f"chat sources: the API's grounded answer has {K} citations", f"HTTP {st} {short(raw, 200)}"):
    finish("chat_cli_sources")
answer = js["choices"][0]["message"]["content"].replace("\n", " ").replace("\r", " ")
want = [answer]
for c in js["citations"]:
    title = c["file"] + (f", {c['section']}" if c["section"] else "")
    want.append(f"  [{c['index']}]{'*' if c['cited'] else ''} {title} (lines {c['line_start']}-{c['line_end']})")
note("want:\n    " + "\n    ".join(short(w, 100) for w in want))

runs = [("--url", ["--url", URL, "--retrieval"])]
if INDEX and MODEL_DIR:
    runs.append(("--model --index (in-process)", ["--model", MODEL_DIR, "--threads", "1", "--index", INDEX]))
else:
    note("EN_INDEX or EN_MODEL_DIR not set: in-process chat --index is not checked")
for how, args in runs:
    rc, out, err = chat(args + OPTS + ["--show-sources"])
    got = out.split("\n")
    check(rc == 0, f"chat sources {how}: exits 0", f"exit {rc} {short(err, 200)}")
    check(got[:1] == want[:1], f"chat sources {how}: the answer line equals the API's grounded answer",
          short(got[0] if got else "", 80) if got[:1] == want[:1] else f"{short(out, 200)!r}")
    check(got[1:] == want[1:] + [""], f"chat sources {how}: {K} source lines equal the API's citations",
          f"{got[1:]!r}" if got[1:] != want[1:] + [""] else f"{K} lines")
    rc, out, err = chat(args + OPTS)
    check(rc == 0 and out == want[0] + "\n", f"chat sources {how}: without --show-sources stdout is the answer only",
          f"{short(out, 200)!r} exit {rc}")

if NOINDEX:
    rc, out, err = chat(["--url", NOINDEX, "--retrieval"] + OPTS)
    check(rc == 1 and "retrieval_not_enabled" in err and out == "\n",
          "chat sources: --retrieval against a server without --index fails, naming retrieval_not_enabled",
          f"exit {rc}, stderr {short(err.strip(), 200)!r}")
for bad, why in ((["--url", URL, "--index", INDEX or "x.db"], "--index with --url"),
                 (["--url", URL, "--show-sources"], "--show-sources without retrieval"),
                 (["--model", MODEL_DIR or "m", "--retrieval"], "--retrieval without --url"),
                 (["--model", MODEL_DIR or "m", "--index", "/nonexistent.db"], "a missing --index")):
    rc, out, err = chat(bad)
    check(rc not in (0, "timeout") and err.strip() != "", f"chat sources: {why} is refused",
          f"exit {rc}: {short(err.strip().splitlines()[0] if err.strip() else '', 150)}")

finish("chat_cli_sources")
