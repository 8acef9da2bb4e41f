"""disconnect.py - a client that goes away frees its KV blocks (issue 5,
"What it must show" 4). A long streaming request (a prompt whose greedy
continuation runs to max_tokens, checked first) is read for a few chunks,
then its socket is closed: within two seconds /metrics must show
energon_kv_cache_blocks_used 0 and energon_requests_running 0, and the
generation counter must have grown by far less than max_tokens (so the
request was stopped, not finished). Then four streams at once, and a
non-streamed request abandoned before its answer.
"""
import json
import socket
import time

from common import (CTX, MODEL, SLOW, URL, check, finish, metric, metrics, note, post, short,
                    split_url, story_text, tokenize)

PROMPTS = ["Once upon a time, there was a little girl named Lily. She",
           "One day, a big red ball rolled into the garden. The",
           " ".join(story_text().split()[:40])]

# a prompt that does not end (eos) before max_tokens at temperature 0
chosen = None
for p in PROMPTS:
    n = CTX - tokenize(p) - 4
    st, js, raw = post("/v1/completions", {"model": MODEL, "prompt": p, "max_tokens": n, "temperature": 0})
    if st == 200 and js["choices"][0]["finish_reason"] == "length":
        chosen = (p, n, js["usage"]["completion_tokens"])
        break
    note(f"prompt {p[:30]!r}: {st}, finish {js['choices'][0]['finish_reason'] if st == 200 else short(raw)}")
if not check(chosen is not None, "a prompt whose greedy continuation runs to max_tokens",
             f"{chosen[1]} tokens" if chosen else "none of the prompts"):
    finish("disconnect")
PROMPT, MAXT, _ = chosen


def open_stream(prompt, max_tokens, stream=True):
    host, port = split_url(URL)
    s = socket.create_connection((host, port), timeout=30 * SLOW)
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": stream}).encode()
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    return s


def read_events(s, n):
    """Read until n SSE data events have arrived; return the raw bytes."""
    buf = b""
    while buf.count(b"data:") < n:
        d = s.recv(4096)
        if not d:
            break
        buf += d
    return buf


def wait_idle(deadline_s):
    """Poll /metrics until no blocks are used and nothing runs; returns
    (seconds taken or None, last blocks used, last running)."""
    t0 = time.time()
    while True:
        ms = metrics()
        used, run = metric(ms, "energon_kv_cache_blocks_used"), metric(ms, "energon_requests_running")
        if used == 0 and run == 0:
            return time.time() - t0, used, run
        if time.time() - t0 > deadline_s:
            return None, used, run
        time.sleep(0.01)


def linger_close(s):
    # RST instead of FIN: the harshest way for a client to vanish
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()


g0 = metric(metrics(), "energon_generation_tokens_total")
s = open_stream(PROMPT, MAXT)
buf = read_events(s, 4)
head = buf.split(b"\r\n", 1)[0].decode(errors="replace")
ms = metrics()
used_during = metric(ms, "energon_kv_cache_blocks_used")
check(head.endswith("200 OK") and buf.count(b"data:") >= 4 and used_during > 0,
      "long stream started: 200, chunks arriving, KV blocks in use",
      f"{head!r}, {buf.count(b'data:')} events, {used_during:.0f} blocks used")
s.close()
took, used, run = wait_idle(2.0 * SLOW)
g1 = metric(metrics(), "energon_generation_tokens_total")
check(took is not None, "after closing the socket: kv_cache_blocks_used 0 and requests_running 0",
      f"in {took:.2f} s" if took is not None else f"after {2.0 * SLOW:.0f} s: blocks {used}, running {run}")
check(g1 - g0 < MAXT, "the abandoned request stopped generating",
      f"{g1 - g0:.0f} tokens generated of max_tokens {MAXT}")

# four at once, closed abruptly (RST)
g0 = metric(metrics(), "energon_generation_tokens_total")
socks = [open_stream(PROMPT, MAXT) for _ in range(4)]
for s in socks:
    read_events(s, 2)
for s in socks:
    linger_close(s)
took, used, run = wait_idle(2.0 * SLOW)
g1 = metric(metrics(), "energon_generation_tokens_total")
check(took is not None and g1 - g0 < 4 * MAXT, "four streams reset at once: blocks and running back to 0",
      (f"in {took:.2f} s, " if took is not None else f"blocks {used}, running {run}, ") +
      f"{g1 - g0:.0f} of {4 * MAXT} tokens generated")

# a non-streamed request abandoned before its answer
s = open_stream(PROMPT, MAXT, stream=False)
time.sleep(0.02)
s.close()
took, used, run = wait_idle(5.0 * SLOW)
check(took is not None, "abandoned non-streamed request: blocks and running back to 0",
      f"in {took:.2f} s" if took is not None else f"blocks {used}, running {run}")

st, js, raw = post("/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 16, "temperature": 0})
check(st == 200 and js["usage"]["completion_tokens"] == 16, "server answers normally after the disconnects",
      f"{st}")

finish("disconnect")
