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
import select
import shutil
import subprocess
import sys
import time
import urllib.parse

from common import MODEL, SLOW, TMP, URL, check, finish, note, post, short

QUESTION = "Where did Pip find the blue lantern?"
MAXT = 40

chromium = shutil.which("chromium") or shutil.which("chromium-browser")
if not chromium:
    print("SKIP chat_page: Debian's chromium is not installed (scripts/install-deps installs it)")
    sys.exit(77)


class Browser:
    def __init__(self):
        cmd_r, self.cmd_w = os.pipe()    # we write commands, Chromium reads fd 3
        self.ev_r, ev_w = os.pipe()      # Chromium writes fd 4, we read
        prof = os.path.join(TMP, "chromium-profile")

        def fds():  # in the child: our pipe ends become fds 3 and 4
            a, b = os.dup(cmd_r), os.dup(ev_w)
            a, b = os.dup2(a, 100), os.dup2(b, 101)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.log = open(os.path.join(TMP, "chromium.log"), "w")
        self.proc = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--no-proxy-server", "--remote-debugging-pipe", f"--user-data-dir={prof}", "--window-size=1000,800", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, preexec_fn=fds, close_fds=False)
        os.close(cmd_r)
        os.close(ev_w)
        self.buf = b""
        self.next_id = 0
        self.events = []

    def _read_msg(self, timeout):
        while b"\0" not in self.buf:
            r, _, _ = select.select([self.ev_r], [], [], timeout)
            if not r:
                return None
            d = os.read(self.ev_r, 1 << 16)
            if not d:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self.buf += d
        msg, _, self.buf = self.buf.partition(b"\0")
        return json.loads(msg)

    def send(self, method, params=None, session=None, timeout=30.0):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout * SLOW
        while time.time() < deadline:
            m = self._read_msg(max(0.01, deadline - time.time()))
            if m is None:
                break
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            if "method" in m:
                self.events.append(m)
        raise RuntimeError(f"{method}: no answer from Chromium")

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


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
