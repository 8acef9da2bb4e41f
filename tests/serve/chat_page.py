"""chat_page.py - the chat page in a real browser (issue 5, "What it must
show" 5). Debian's headless Chromium, driven through the DevTools protocol
over a pipe (--remote-debugging-pipe: JSON messages ending in NUL on fds 3
and 4, so no WebSocket library is needed), opens GET /?q=TEXT&max_tokens=N;
the page sends TEXT by itself and streams the answer. We wait until
document.body.dataset.state is "done", then check: more than one streamed
chunk, and the text of #answer-last equals the non-streamed API answer to
the same one-message chat at temperature 0 with the same max_tokens.
We also record the request the page sent (Network domain) and report it.
A screenshot is left in $EN_TMP/chat_page.png.
"""
import base64
import json
import os
import time
import urllib.parse

from browser import Browser
from common import MODEL, SLOW, TMP, URL, check, finish, note, post, short

QUESTION = "Where did Pip find the blue lantern?"
MAXT = 40

page_url = f"{URL}/?" + urllib.parse.urlencode({"q": QUESTION, "max_tokens": MAXT})
b = Browser()
try:
    tid = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    sid = b.send("Target.attachToTarget", {"targetId": tid, "flatten": True})["sessionId"]
    b.send("Network.enable", session=sid)
    b.send("Page.enable", session=sid)
    b.send("Page.navigate", {"url": page_url}, session=sid)
    state = {}
    deadline = time.time() + 60 * SLOW
    expr = ("JSON.stringify({state: document.body ? document.body.dataset.state : null,"
            " chunks: document.body ? document.body.dataset.chunks : null,"
            " answer: (document.querySelector('#answer-last') || {}).textContent,"
            " answerText: (document.querySelector('#answer-last') || {}).innerText})")
    while time.time() < deadline:
        r = b.send("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session=sid)
        state = json.loads(r.get("result", {}).get("value") or "{}")
        if state.get("state") in ("done", "error"):
            break
        time.sleep(0.1)
    # the API key stays with the tab (sessionStorage), never in localStorage
    # (issue 31, finding 9): typed in, it is kept for this tab only
    kexpr = ("(() => { const k = document.getElementById('key'); k.value = 'sk-page-test';"
             " k.dispatchEvent(new Event('change'));"
             " return JSON.stringify({local: localStorage.getItem('energon.apiKey'),"
             " session: sessionStorage.getItem('energon.apiKey')}); })()")
    r = b.send("Runtime.evaluate", {"expression": kexpr, "returnByValue": True}, session=sid)
    key_store = json.loads(r.get("result", {}).get("value") or "{}")
    shot = b.send("Page.captureScreenshot", {"format": "png"}, session=sid)
    with open(os.path.join(TMP, "chat_page.png"), "wb") as f:
        f.write(base64.b64decode(shot["data"]))
    sent = None
    for ev in b.events:
        if ev.get("method") == "Network.requestWillBeSent":
            req = ev["params"]["request"]
            if req["url"].endswith("/v1/chat/completions") and req.get("method") == "POST":
                pd = req.get("postData")
                if pd is None and req.get("hasPostData"):
                    pd = b.send("Network.getRequestPostData", {"requestId": ev["params"]["requestId"]},
                                session=sid).get("postData")
                sent = json.loads(pd) if pd else {}
finally:
    b.close()

check(key_store.get("local") is None and key_store.get("session") == "sk-page-test",
      "the page keeps the API key in sessionStorage (this tab), not localStorage", f"{key_store}")
chunks = int(state.get("chunks") or 0)
answer = state.get("answer")
check(state.get("state") == "done", "chat page: the question was sent and the answer finished",
      f"state {state.get('state')!r} ({page_url})")
check(chunks > 1, "chat page: the answer was streamed in several chunks", f"{chunks} chunks")
if sent is not None:
    note(f"the page sent: {short(json.dumps(sent), 300)}")
check(sent is not None and sent.get("stream") is True and
      (sent.get("messages") or [{}])[-1].get("content") == QUESTION,
      "chat page: it sent the question as a streaming chat request", short(json.dumps(sent), 120))

st, js, raw = post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}],
                                            "temperature": 0, "max_tokens": MAXT})
want = js["choices"][0]["message"]["content"] if st == 200 else None
check(st == 200 and answer == want, "chat page: #answer-last equals the non-streamed API answer (temperature 0)",
      f"{len(want or '')} chars: {short(want or '', 80)!r}" if answer == want else
      f"page {short(answer or '', 100)!r} vs API {short(want or raw, 100)!r}")

finish("chat_page")
