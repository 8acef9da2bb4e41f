"""browser.py - headless Chromium driven over the DevTools pipe protocol
(--remote-debugging-pipe: JSON messages ending in NUL on fds 3 and 4, so no
WebSocket library is needed), for the chat page tests (chat_page.py,
chat_page_sources.py). Importing it exits 77 (a skip) when Debian's chromium
is not installed.
"""
import json
import os
import select
import shutil
import subprocess
import sys
import time

from common import SLOW, TMP

chromium = shutil.which("chromium") or shutil.which("chromium-browser")
if not chromium:
    name = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    print(f"SKIP {name}: Debian's chromium is not installed (scripts/install-deps installs it)")
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
