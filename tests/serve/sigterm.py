"""sigterm.py - SIGTERM while requests run (issue 5, "What it must show" 7).
Runs last, against the main server: 12 long temperature-0 requests (half
streamed) are started and seen running in /metrics, then the server gets
SIGTERM. Every one must complete in full (the same text, finish reason and
usage as the same request sent alone beforehand, streams ending with
[DONE]); the process must go away, and afterwards a new connection is
refused. test_serve.sh then checks the exit status is 0 (under ASan that
also means LeakSanitizer found no leak in the whole session).
"""
import json
import os
import signal
import socket
import threading
import time

from common import (CTX, MODEL, PID, SLOW, URL, alive, check, finish, metric, metrics, note, post, short,
                    sse_events, split_url, stream_post, tokenize)

PROMPTS = ["Once upon a time, there was a little girl named Lily. She",
           "One day, a big red ball rolled into the garden. The",
           "Tom and his dog went to the park. They"]
N = 12

# requests long enough to be still running when the signal arrives
refs = []
for i in range(N):
    p = PROMPTS[i % len(PROMPTS)]
    mt = CTX - tokenize(p) - 4 - i
    if SLOW > 1:  # ASan: long enough to be running at the signal, short enough to drain soon
        mt = min(mt, 160 - i)
    st, js, raw = post("/v1/completions", {"model": MODEL, "prompt": p, "max_tokens": mt, "temperature": 0})
    if st != 200:
        check(False, "reference requests before SIGTERM", f"{st} {short(raw)}")
        finish("sigterm")
    refs.append((p, mt, js["choices"][0]["text"], js["choices"][0]["finish_reason"],
                 js["usage"]["completion_tokens"]))

results = [None] * N
started = [threading.Event() for _ in range(N)]


def worker(i):
    p, mt = refs[i][0], refs[i][1]
    body = {"model": MODEL, "prompt": p, "max_tokens": mt, "temperature": 0}
    try:
        if i % 2 == 0:
            body.update(stream=True, stream_options={"include_usage": True})
            conn, r = stream_post("/v1/completions", body)
            text, fin, usage, done = "", None, None, False
            started[i].set()
            for d in sse_events(r):
                c = json.loads(d)
                for ch in c.get("choices") or []:
                    text += ch.get("text") or ""
                    fin = ch.get("finish_reason") or fin
                usage = c.get("usage") or usage
            # sse_events stops at [DONE] or at the end of the body
            rest = r.read()
            done = True
            conn.close()
            results[i] = (text, fin, usage["completion_tokens"] if usage else None, done, len(rest))
        else:
            started[i].set()
            st, js, raw = post("/v1/completions", body)
            results[i] = (js["choices"][0]["text"], js["choices"][0]["finish_reason"],
                          js["usage"]["completion_tokens"], st == 200, 0) if st == 200 else ("", f"HTTP {st}", 0, False, 0)
    except Exception as e:
        results[i] = ("", f"{type(e).__name__}: {e}", 0, False, 0)


threads = [threading.Thread(target=worker, args=(i,)) for i in range(N)]
for t in threads:
    t.start()
for e in started:
    e.wait(30 * SLOW)
running = 0
# all N admitted before the signal (on a loaded machine the last clients can
# take seconds to connect; one not yet connected at the signal is refused,
# which is right but not what this checks)
deadline = time.time() + 30 * SLOW
while time.time() < deadline:
    running = metric(metrics(), "energon_requests_running") or 0
    if running >= N:
        break
    time.sleep(0.002)
os.kill(PID, signal.SIGTERM)
t_sig = time.time()
check(running >= 2, "requests running when SIGTERM is sent", f"{running:.0f} of {N} running")

# A new connection while the running requests drain: the server has
# stopped accepting, so it must be refused (or answered 503) at once, not
# left hanging in the listen backlog until the process exits.
probe = {}


def probe_new_connection():
    t0 = time.time()
    try:
        st, js, raw = post("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2}, timeout=60)
        probe["how"] = f"HTTP {st}"
        probe["ok"] = st == 503
    except ConnectionRefusedError:
        probe["how"], probe["ok"] = "connection refused", True
    except OSError as e:
        probe["how"], probe["ok"] = f"{type(e).__name__}: {e}", False
    probe["s"] = time.time() - t0


time.sleep(0.05)
pt = threading.Thread(target=probe_new_connection)
pt.start()
pt.join(2.0 * SLOW)
busy = sum(t.is_alive() for t in threads)
if pt.is_alive():
    check(False, "a new connection during the drain is refused at once",
          f"no answer after {2.0 * SLOW:.0f} s while {busy} request(s) still run")
else:
    check(probe["ok"], "a new connection during the drain is refused at once",
          f"{probe['how']} after {probe['s']:.2f} s ({busy} request(s) still running)")

for t in threads:
    t.join(120 * SLOW)
bad = []
for i, r in enumerate(results):
    p, mt, text, fin, ntok = refs[i]
    if r is None or r[0] != text or r[1] != fin or r[2] != ntok or not r[3]:
        bad.append(f"#{i} ({'stream' if i % 2 == 0 else 'plain'}): got {short(r[1] if r else None)} "
                   f"{r[2] if r else None} tokens, {len(r[0]) if r else 0} chars; want {fin} {ntok}, {len(text)} chars")
check(not bad, "every request running at SIGTERM completed in full (same text, finish, usage)",
      f"{N}/{N} complete, {sum(r[2] for r in results if r)} tokens, the last {time.time() - t_sig:.2f} s after "
      f"the signal" if not bad else "; ".join(bad[:3]))

pt.join(60 * SLOW)
if "how" in probe and not probe["ok"]:
    note(f"the drain-time connection ended with {probe['how']} after {probe['s']:.2f} s")
deadline = time.time() + 30 * SLOW
while alive(PID) and time.time() < deadline:
    time.sleep(0.02)
check(not alive(PID), "the server exits after the drain", f"{time.time() - t_sig:.2f} s after SIGTERM")
host, port = split_url(URL)
try:
    socket.create_connection((host, port), timeout=5).close()
    refused = "connected"
except ConnectionRefusedError:
    refused = "refused"
except OSError as e:
    refused = type(e).__name__
check(refused == "refused", "new connections are refused afterwards", refused)

finish("sigterm")
