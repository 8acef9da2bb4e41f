"""chat_page_sources.py - the chat page's sources (issue 15) in headless
Chromium (browser.py). EN_URL is a server with --index: the page finds that
out by itself (POST /v1/retrieve: body[data-retrieval-probe] "on"), and
GET /?q=TEXT&max_tokens=N&retrieval=K must send "retrieval": {"top_k": K}
and list K sources under the answer (K 3, or 1 when the test model's
context, EN_CTX, is under 2048 tokens: three passages would not fit). They are
compared with the "citations" of a direct non-streamed POST of the same chat
(temperature 0, same max_tokens, retrieval top_k 3): index, file, section,
lines and passage text; each link's target holds that text and clicking the
link opens it; a '*' marks exactly the sources whose "[n]" is in the answer,
and each "[n]" marker of the answer is a link to an existing source.
EN_URL_NOINDEX (a server without --index, optional): the same page sends no
"retrieval" and shows no sources. Screenshot: $EN_TMP/chat_page_sources.png.
"""
import base64
import json
import os
import re
import time
import urllib.parse

from browser import Browser
from common import CTX, MODEL, SLOW, TMP, URL, check, finish, note, post, short

QUESTION = "How many days of annual leave do employees get?"
MAXT = 24
K = 3 if CTX >= 2048 else 1
NOINDEX = os.environ.get("EN_URL_NOINDEX", "")

DOM = """JSON.stringify({
  state: document.body.dataset.state,
  answer: (document.querySelector('#answer-last') || {}).textContent,
  docs: document.querySelector('#docs').checked,
  probe: document.body.dataset.retrievalProbe,
  cites: [...document.querySelectorAll('#answer-last a.cite')].map(a => ({
    text: a.textContent, href: a.getAttribute('href'),
    target: !!document.getElementById(a.getAttribute('href').slice(1))})),
  sources: [...document.querySelectorAll('#sources-last li')].map(li => {
    const a = li.querySelector('a.source');
    const t = a && document.getElementById(a.getAttribute('href').slice(1));
    const p = t && t.querySelector('.passage');
    return {index: +li.dataset.index, file: li.dataset.file, section: li.dataset.section,
            line_start: +li.dataset.lineStart, line_end: +li.dataset.lineEnd,
            link: a ? a.textContent : null, target: t ? t.tagName : null,
            passage: p ? p.textContent : null};
  })})"""

# clicks each source link and reports whether its passage is then shown
CLICK = """JSON.stringify([...document.querySelectorAll('#sources-last a.source')].map(a => {
  a.click();
  const t = document.getElementById(a.getAttribute('href').slice(1));
  const p = t.querySelector('.passage');
  return {open: t.open, shown: p.getBoundingClientRect().height > 0};
}))"""


# the page's own marker rendering on a made-up answer (junk test models rarely cite)
RENDER = """(() => { const d = document.createElement('div');
  renderAnswer(d, 'a [2] b [1][7] c[3]', [{index: 1}, {index: 2}, {index: 3}], 5);
  return JSON.stringify({html: d.innerHTML, text: d.textContent}); })()"""
RENDER_WANT = ('a <a class="cite" href="#src-5-2">[2]</a> b <a class="cite" href="#src-5-1">[1]</a>[7] '
               'c<a class="cite" href="#src-5-3">[3]</a>')


def run_page(base, shot, query):
    """Opens base/?q=QUESTION&query..., waits for the answer; returns (dom, clicks, sent request)."""
    url = f"{base}/?" + urllib.parse.urlencode({"q": QUESTION, "max_tokens": MAXT, **query})
    b = Browser()
    dom, clicks, sent = {}, None, None
    try:
        tid = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = b.send("Target.attachToTarget", {"targetId": tid, "flatten": True})["sessionId"]
        b.send("Network.enable", session=sid)
        b.send("Page.enable", session=sid)
        b.send("Page.navigate", {"url": url}, session=sid)

        def ev(expr):
            r = b.send("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session=sid)
            return json.loads(r.get("result", {}).get("value") or "null")

        deadline = time.time() + 60 * SLOW
        while time.time() < deadline:
            dom = ev("JSON.stringify({state: document.body ? document.body.dataset.state : null,"
                     " probe: document.body ? document.body.dataset.retrievalProbe : null})")
            if dom.get("state") in ("done", "error"):
                break
            time.sleep(0.1)
        if dom.get("state") == "done":
            dom = ev(DOM)
            clicks = ev(CLICK)
            dom["render"] = ev(RENDER)
        if shot:
            png = b.send("Page.captureScreenshot", {"format": "png"}, session=sid)
            with open(os.path.join(TMP, shot), "wb") as f:
                f.write(base64.b64decode(png["data"]))
        for e in b.events:
            if e.get("method") == "Network.requestWillBeSent":
                req = e["params"]["request"]
                if req["url"].endswith("/v1/chat/completions") and req.get("method") == "POST":
                    pd = req.get("postData")
                    if pd is None and req.get("hasPostData"):
                        pd = b.send("Network.getRequestPostData",
                                    {"requestId": e["params"]["requestId"]}, session=sid).get("postData")
                    sent = json.loads(pd) if pd else {}
    finally:
        b.close()
    return dom, clicks, sent


dom, clicks, sent = run_page(URL, "chat_page_sources.png", {"retrieval": K})
check(dom.get("state") == "done", "page sources: the question was answered", f"state {dom.get('state')!r}")
note(f"the page sent: {short(json.dumps(sent), 300)}")
check(dom.get("probe") == "on" and dom.get("docs"),
      "page sources: the page finds the server's index (POST /v1/retrieve) and 'Use documents' is on",
      f"probe {dom.get('probe')!r}")
check(sent is not None and sent.get("retrieval") == {"top_k": K},
      f"page sources: the request carries retrieval top_k {K}", short(json.dumps(sent), 160))

st, js, raw = post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}],
                                            "temperature": 0, "max_tokens": MAXT, "retrieval": {"top_k": K}})
check(st == 200, "page sources: the API answers the same grounded chat", f"HTTP {st} {short(raw, 200)}")
want = js["choices"][0]["message"]["content"] if st == 200 else ""
cits = js.get("citations", []) if st == 200 else []
srcs = dom.get("sources") or []
answer = dom.get("answer") or ""
check(answer == want, "page sources: #answer-last equals the API's grounded answer",
      f"{short(want, 80)!r}" if answer == want else f"page {short(answer, 80)!r} vs API {short(want, 80)!r}")
check(len(cits) == K and len(srcs) == K, f"page sources: {K} sources listed, {K} citations from the API",
      f"page {len(srcs)}, API {len(cits)}")
keys = ("index", "file", "section", "line_start", "line_end")
for i, (s, c) in enumerate(zip(srcs, cits)):
    want_c = {k: c[k] if c[k] is not None else "" for k in keys}
    got = {k: s[k] for k in keys}
    title = f"[{c['index']}] {c['file']}" + (f", {c['section']}" if c["section"] else "") + \
        f" (lines {c['line_start']}-{c['line_end']})"
    check(got == want_c, f"page sources: source {i + 1}'s file, section and lines equal the API's citation",
          f"{title}" if got == want_c else f"page {got} vs API {want_c}")
    cited = f"[{c['index']}]" in want
    check(cited == c.get("cited"), f"page sources: source {i + 1}: '[n] in the answer' agrees with the API's cited",
          f"{cited}")
    check(s["link"] == title + (" *" if cited else ""),
          f"page sources: source {i + 1}'s link reads '{title}'" + (" with '*' (cited)" if cited else ""),
          repr(s["link"]))
    check(s["target"] == "DETAILS" and s["passage"] == c["text"],
          f"page sources: source {i + 1}'s link target holds the passage text",
          f"{len(c['text'])} chars" if s["passage"] == c["text"] else
          f"target {s['target']}, {short(s['passage'] or '', 60)!r} vs {short(c['text'], 60)!r}")
check(clicks is not None and len(clicks) == K and all(x["open"] and x["shown"] for x in clicks),
      "page sources: clicking each source link shows its passage", json.dumps(clicks))
markers = [m for m in re.findall(r"\[(\d+)\]", want) if 1 <= int(m) <= len(cits)]
dc = dom.get("cites") or []
check(len(dc) == len(markers) and all(x["target"] and x["href"] == f"#src-1-{x['text'][1:-1]}" for x in dc),
      "page sources: each [n] marker in the answer links to source n",
      f"{len(markers)} markers in the answer, {len(dc)} links")

r = dom.get("render") or {}
check(r.get("html") == RENDER_WANT and r.get("text") == "a [2] b [1][7] c[3]",
      "page sources: markers [n] of existing sources become links to #src-TURN-n, others stay text",
      short(r.get("html") or "", 200))

if NOINDEX:
    dom2, _, sent2 = run_page(NOINDEX, None, {})
    check(dom2.get("state") == "done" and sent2 is not None and "retrieval" not in sent2 and
          dom2.get("probe") == "off" and not dom2.get("docs") and not dom2.get("sources"),
          "page sources: a server without --index: no retrieval sent, no sources shown",
          f"state {dom2.get('state')!r}, sent {short(json.dumps(sent2), 100)}")
else:
    note("EN_URL_NOINDEX not set: the page against a server without --index is not checked")

finish("chat_page_sources")
