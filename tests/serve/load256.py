"""load256.py - 256 connections at once against a server with a small queue
(issue 17). A server of its own (--max-batch 8 --max-queue 32, so that most
of a burst of 256 is over the limit) gets 256 client threads that connect
first, wait on one barrier and then all send together, each a kind:

  plain        non-streamed completions or chat, read to the end
  stream       streamed completions or chat, read to data: [DONE]
  slow         (N_SLOW of them) a streamed chat request of n=8 answers with
               top_logprobs 20 (~1.5 KiB of SSE a token, ~3 MiB in all: more
               than the ~2 MiB the kernel's socket buffers take, so the
               server's writer blocks) on a socket with a 4 KiB receive
               buffer, sent before the burst and never read until the storm
               is over; then its first bytes are read (an answer must have
               come) and it is reset
  cut_head     the request head cut at a random byte, then closed
  cut_body     the head and part of the body, then closed
  cut_chunk    streamed, closed (RST) after the first SSE event
  cut_wait     non-streamed, closed 0-50 ms after sending

Every connection but the slow ones goes on with more requests of its kind
(new connections) until it has sent ROUNDS. Checks:
  - every request sent in full and not abandoned got a well-formed answer:
    200 with a JSON completion or an SSE stream ending in [DONE], or 429 /
    503 with an OpenAI error object; nothing else, no reset, no hang;
  - the server counted (energon_requests_total) exactly one answer per
    request whose head it received (all but cut_head): none lost;
  - afterwards /health is ok, a normal request is answered, the KV cache
    and queue are empty, and the server exits 0 on SIGTERM;
  - open fds (/proc/PID/fd) after the storm equal those before it, and
    resident memory (VmRSS) is within RSS_MARGIN of before (see there).
The warm-up is a burst of 256 plain requests, so that thread stacks and
malloc arenas have had their first growth before the 'before' figures.
Under a sanitizer build (EN_ASAN=1) fewer rounds run and RSS is printed,
not judged. One summary line: requests, answers by status, client aborts,
RSS before / peak / after, fds before / peak / after.
"""
import fcntl
import json
import os
import random
import select
import socket
import struct
import termios
import threading
import time

from common import (ASAN, CTX, MODEL, SLOW, Server, check, error_shape, finish, health, metric,
                    metrics, n_fds, note, proc_status, split_url)

N_CONN = 256
ROUNDS = int(os.environ.get("EN_LOAD_ROUNDS") or (6 if ASAN else 12))
SEED = int(os.environ.get("EN_LOAD_SEED") or 17)
TSAN = os.environ.get("EN_TSAN", "0") == "1"
# Resident memory may end this much above where it was after the warm-up:
# each of the storm's connections runs on a thread of its own, and glibc
# keeps up to 40 MiB of exited threads' stacks for reuse and the arenas
# that threads' allocations went to (8 per core); the warm-up's burst
# touches most of that once, and what is left is bounded here (seen: +3 to
# +5 MiB, the same after 1,000 requests as after 6,000). A leak of 8 KiB
# per request (the storm sends ~3,000) would exceed it.
RSS_MARGIN_KIB = 20 * 1024
# Their 4 x 8 engine requests fill --max-batch 8 --max-queue 32 at first;
# 2 under a sanitizer, whose slower steps would otherwise keep the burst
# waiting behind them (and answered 429) for most of the storm.
N_SLOW = 2 if ASAN else 4
KINDS = [("plain", 30), ("stream", 22), ("cut_head", 8), ("cut_body", 8),
         ("cut_chunk", 10), ("cut_wait", 12)]
GEN_ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
words = "the otter rang the brass bell and the frogs woke up on the river bank".split()

srv = Server("load256", "--model-name", MODEL, "--max-batch", "8", "--max-queue", "32",
             "--timeout", str(int(120 * SLOW)))
HOST, PORT = split_url(srv.url)
PID = srv.pid


# ------------------------------------------------------------- raw HTTP

def request_bytes(path, body):
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {HOST}:{PORT}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    return head, data


def connect(rcvbuf=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:  # before connect: the window is agreed in the handshake
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(90 * SLOW)
    s.connect((HOST, PORT))
    return s


def reset_close(s):
    """Close with RST (SO_LINGER 0): the harshest way to vanish."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def read_all(s):
    buf = b""
    while True:
        d = s.recv(65536)
        if not d:
            return buf
        buf += d


def dechunk(body):
    out, i = b"", 0
    while True:
        j = body.index(b"\r\n", i)
        n = int(body[i:j].split(b";")[0], 16)
        if n == 0:
            return out
        out += body[j + 2:j + 2 + n]
        i = j + 2 + n + 2


def parse_response(raw):
    """(status, headers dict, body bytes) of a whole HTTP/1.1 response."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        raise ValueError(f"no end of head in {len(raw)} bytes")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hd = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hd[k.strip().lower()] = v.strip()
    if hd.get("transfer-encoding", "").lower() == "chunked":
        body = dechunk(body)
    elif "content-length" in hd and len(body) != int(hd["content-length"]):
        raise ValueError(f"body of {len(body)} bytes, Content-Length {hd['content-length']}")
    return status, hd, body


def judge(status, hd, body, stream):
    """None when the answer is well-formed, else what is wrong."""
    if status in (429, 503):
        try:
            why = error_shape(json.loads(body))
        except ValueError:
            why = "body is not JSON"
        if not why and status == 429 and "retry-after" not in hd:
            why = "no Retry-After header"
        return f"{status}: {why}" if why else None
    if status != 200:
        return f"status {status}: {body[:120]!r}"
    if not stream:
        try:
            js = json.loads(body)
        except ValueError:
            return "200 body is not JSON"
        ok = js.get("object") in ("chat.completion", "text_completion") and js.get("choices")
        return None if ok else f"200 body is not a completion: {body[:120]!r}"
    events = [e for e in body.decode().split("\n\n") if e]
    if not events or events[-1] != "data: [DONE]":
        return f"stream does not end with [DONE] ({len(events)} events, last {events[-1:]!r})"
    for e in events[:-1]:
        if not e.startswith("data: "):
            return f"not an SSE data line: {e[:80]!r}"
        try:
            c = json.loads(e[6:])
        except ValueError:
            return f"SSE event is not JSON: {e[:80]!r}"
        if "choices" not in c:
            return f"SSE event without choices: {e[:80]!r}"
    return None


# ------------------------------------------------------------- clients

def make_body(rng, stream, long=False):
    prompt = " ".join(rng.choices(words, k=rng.randint(2, 24)))
    chat = rng.random() < 0.5
    b = {"model": MODEL, "max_tokens": rng.randint(2, 24), "temperature": rng.choice([0, 0.7])}
    if long:  # a slow reader's: ~3 MiB of SSE (temperature 1: eos is rare)
        chat = True
        b.update(max_tokens=CTX // 2, n=8, logprobs=True, top_logprobs=20, temperature=1.0,
                 seed=rng.randint(0, 999))
    if chat:
        b["messages"] = [{"role": "user", "content": prompt}]
    else:
        b["prompt"] = prompt
    if stream:
        b["stream"] = True
        if rng.random() < 0.5:
            b["stream_options"] = {"include_usage": True}
    return ("/v1/chat/completions" if chat else "/v1/completions"), b


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.status = {}      # answers read in full, by status
        self.aborts = {}      # requests the client abandoned, by kind
        self.bad = []         # what was wrong, for the FAIL line
        self.sent_head = 0    # requests whose whole head was sent (the server counts those)
        self.requests = 0

    def add(self, **kw):
        with self.lock:
            for k, v in kw.items():
                if k == "status":
                    self.status[v] = self.status.get(v, 0) + 1
                elif k == "abort":
                    self.aborts[v] = self.aborts.get(v, 0) + 1
                elif k == "bad":
                    self.bad.append(v)
                else:
                    setattr(self, k, getattr(self, k) + v)


def cut_after_first_event(s, tally):
    """cut_chunk: read up to the first SSE event of a 200 and reset the
    connection: returns None. Anything else (an error answer) returns
    the bytes read so far, for the caller to read the rest and judge."""
    buf = b""
    while True:
        d = s.recv(4096)
        if not d:
            break
        buf += d
        head, sep, rest = buf.partition(b"\r\n\r\n")
        if sep and (not head.startswith(b"HTTP/1.1 200") or b"data: " in rest):
            break
    if buf.startswith(b"HTTP/1.1 200") and b"data: " in buf:
        reset_close(s)
        tally.add(abort="cut_chunk")
        return None
    return buf


def one_request(kind, rng, tally, s=None, held=None):
    """Send one request of `kind` on s (connected now when None)."""
    stream = kind in ("stream", "slow", "cut_chunk")
    path, body = make_body(rng, stream, long=(kind == "slow"))
    head, data = request_bytes(path, body)
    s = s or connect(4096 if kind == "slow" else None)
    tally.add(requests=1)
    try:
        if kind == "cut_head":
            s.sendall(head[:rng.randint(1, len(head) - 1)])
            time.sleep(rng.random() * 0.05)
            s.close()
            tally.add(abort=kind)
            return
        tally.add(sent_head=1)
        if kind == "cut_body":
            s.sendall(head + data[:rng.randint(0, len(data) - 1)])
            time.sleep(rng.random() * 0.05)
            s.close()  # FIN, so that the server still reads the head it was sent
            tally.add(abort=kind)
            return
        s.sendall(head + data)
        if kind == "slow":
            held.append(s)  # read after the storm (check_slow)
            return
        if kind == "cut_wait":
            time.sleep(rng.random() * 0.05)
            s.close()
            tally.add(abort=kind)
            return
        raw = b""
        if kind == "cut_chunk":
            raw = cut_after_first_event(s, tally)
            if raw is None:
                return
        raw += read_all(s)
        st, hd, b = parse_response(raw)
        why = judge(st, hd, b, stream)
        tally.add(status=st)
        if why:
            tally.add(bad=f"{kind} {path}: {why}")
        if st == 429:
            time.sleep(0.1 + rng.random() * 0.5)  # less than Retry-After asks
    except (OSError, ValueError) as e:
        tally.add(bad=f"{kind} {path}: {type(e).__name__}: {e}")
    finally:
        if kind != "slow":
            s.close()


def check_slow(held, tally):
    """The slow readers' first bytes: an answer's head (200 or 429/503).
    Returns (heads by status, bytes each had waiting unread)."""
    heads, unread = {}, []
    for s in held:
        try:
            unread.append(struct.unpack("i", fcntl.ioctl(s, termios.FIONREAD, b"\0" * 4))[0])
            s.settimeout(10 * SLOW)
            first = s.recv(64)
            st = first[9:12].decode("latin-1")
            heads[st] = heads.get(st, 0) + 1
            if not first.startswith((b"HTTP/1.1 200", b"HTTP/1.1 429", b"HTTP/1.1 503")):
                tally.add(bad=f"slow reader: first bytes {first!r}")
        except OSError as e:
            tally.add(bad=f"slow reader: {type(e).__name__}: {e}")
        reset_close(s)  # unread data left: the kernel sends RST anyway
        tally.add(abort="slow")
    return heads, unread


def storm(plan, rounds, tally, held):
    """len(plan) connections, opened first, sending together once the
    server has accepted them all (a connect returns when the kernel has
    queued it, before the server has). Returns (threads left running,
    server fds when the barrier opened)."""
    fd_idle = quiet_fds()
    socks = [connect(4096 if k == "slow" else None) for k, _ in plan]
    deadline = time.time() + 30 * SLOW
    while n_fds(PID) < fd_idle + len(plan) and time.time() < deadline:
        time.sleep(0.02)
    fd_open = n_fds(PID)
    # The slow readers' streams start first, so that they are running (and
    # then blocked on their full sockets) when the burst comes: sent here,
    # and waited for until the answer's head has come back on each.
    slow = [i for i, (kind, _) in enumerate(plan) if kind == "slow"]
    for i in slow:
        one_request("slow", plan[i][1], tally, socks[i], held)
    poll = select.poll()
    for i in slow:
        poll.register(socks[i], select.POLLIN)
    ready, deadline = set(), time.time() + 30 * SLOW
    while len(ready) < len(slow) and time.time() < deadline:
        ready.update(fd for fd, _ in poll.poll(100))
    barrier = threading.Barrier(len(plan) - len(slow))

    def worker(i):
        kind, rng = plan[i]
        try:
            barrier.wait(timeout=60 * SLOW)
            one_request(kind, rng, tally, socks[i], held)
            for _ in range(rounds - 1):
                one_request(kind, rng, tally, None, held)
        except Exception as e:  # a FAIL line, not a dead thread
            tally.add(bad=f"{kind} worker: {type(e).__name__}: {e}")

    ts = [threading.Thread(target=worker, args=(i,), daemon=True)
          for i in range(len(plan)) if plan[i][0] != "slow"]
    for t in ts:
        t.start()
    for t in ts:
        t.join(600 * SLOW)
    return sum(t.is_alive() for t in ts), fd_open - fd_idle


# ------------------------------------------------------------- server side

def quiet_fds():
    """The server's open fds with no request in flight: the least of a few
    samples, since the socket of the last /metrics call may still be
    closing on the server's side when the client has its answer."""
    time.sleep(0.3)
    low = n_fds(PID)
    for _ in range(10):
        time.sleep(0.05)
        low = min(low, n_fds(PID))
    return low


class Monitor(threading.Thread):
    """Peak VmRSS and open fds of the server, sampled every 20 ms."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop, self.rss, self.fds = threading.Event(), 0, 0

    def run(self):
        while not self.stop.is_set():
            try:
                self.rss = max(self.rss, proc_status(PID)["VmRSS"])
                self.fds = max(self.fds, n_fds(PID))
            except (OSError, KeyError):
                pass
            time.sleep(0.02)


def gen_counts(ms):
    """energon_requests_total of the two generation endpoints, by status."""
    out = {}
    for name, labels, v in ms:
        if name == "energon_requests_total" and labels.get("endpoint") in GEN_ENDPOINTS:
            st = int(labels["status"])
            out[st] = out.get(st, 0) + int(v)
    return out


def settle(fd_target=None, count_target=None, base=None):
    """Wait (up to 20 s, stretched for sanitizers) for an idle server:
    nothing running or waiting, no KV blocks, and fds / counted requests
    at their targets when given. Returns the last /metrics."""
    deadline = time.time() + 20 * SLOW
    while True:
        ms = metrics(srv.url)
        idle = (metric(ms, "energon_requests_running") == 0 and
                metric(ms, "energon_requests_waiting") == 0 and
                metric(ms, "energon_kv_cache_blocks_used") == 0)
        fds_ok = fd_target is None or n_fds(PID) <= fd_target
        cnt_ok = count_target is None or sum(gen_counts(ms).values()) - base >= count_target
        if (idle and fds_ok and cnt_ok) or time.time() > deadline:
            return ms
        time.sleep(0.1)


def plan_of(rng, n, kinds, n_slow=0):
    names = [k for k, w in kinds for _ in range(w)]
    kinds = ["slow"] * n_slow + [rng.choice(names) for _ in range(n - n_slow)]
    return [(k, random.Random(rng.random())) for k in kinds]


t_start = time.time()
rng = random.Random(SEED)
# warm-up: a burst of 256 plain requests (thread stacks, arenas, the model's pages)
warm = Tally()
left, _ = storm(plan_of(rng, N_CONN, [("plain", 1)]), 1, warm, [])
settle()
time.sleep(0.5)
base_counts = gen_counts(metrics(srv.url))
fd0 = quiet_fds()
rss0 = proc_status(PID)["VmRSS"]
note(f"warm-up: {warm.requests} plain requests, answers {dict(sorted(warm.status.items()))}; "
     f"server RSS {rss0 / 1024:.1f} MiB, {fd0} fds")
check(not warm.bad and not left, "load256: warm-up burst answered", "; ".join(warm.bad[:3]))

mon = Monitor()
mon.start()
tally, held = Tally(), []
t1 = time.time()
left, n_open = storm(plan_of(rng, N_CONN, KINDS, N_SLOW), ROUNDS, tally, held)
t_storm = time.time() - t1
fd_held = n_fds(PID)  # the slow readers' connections still open on the server
slow_heads, slow_unread = check_slow(held, tally)
ms = settle(fd_target=fd0, count_target=tally.sent_head, base=sum(base_counts.values()))
time.sleep(1.0)  # anything still closing has closed
mon.stop.set()
mon.join()
after_counts = gen_counts(metrics(srv.url))
fd1 = quiet_fds()
rss1 = proc_status(PID)["VmRSS"]
delta = {k: after_counts.get(k, 0) - base_counts.get(k, 0) for k in after_counts}
delta = {k: v for k, v in sorted(delta.items()) if v}

n_abort = sum(tally.aborts.values())
answered = sum(tally.status.values())
n200, n429 = tally.status.get(200, 0), tally.status.get(429, 0)
print(f"load256: {tally.requests} requests on {N_CONN} connections x {ROUNDS} rounds in "
      f"{t_storm:.1f} s: answers {dict(sorted(tally.status.items()))}, client aborts {n_abort} "
      f"{dict(sorted(tally.aborts.items()))}, server counted {delta}; slow readers' answers "
      f"{slow_heads}, {min(slow_unread, default=0)}..{max(slow_unread, default=0)} bytes unread "
      f"each, {fd_held - fd0} connections open at the end of the storm; RSS before "
      f"{rss0 / 1024:.1f} MiB, peak {mon.rss / 1024:.1f} MiB, after {rss1 / 1024:.1f} MiB; "
      f"fds before {fd0}, peak {mon.fds}, after {fd1}", flush=True)

check(n_open >= N_CONN, f"load256: the server held all {N_CONN} connections at once",
      f"{n_open} sockets open when the clients started sending")
check(not left, "load256: every client finished", f"{left} threads still running")
check(slow_heads == {"200": N_SLOW} and fd_held - fd0 >= N_SLOW,
      "load256: the slow readers got 200 and the server still held them at the storm's end",
      f"answers {slow_heads}, {fd_held - fd0} server connections open")
check(not tally.bad, "load256: every request sent in full and kept got a well-formed answer",
      f"{answered} answers" if not tally.bad
      else f"{len(tally.bad)} bad: " + "; ".join(tally.bad[:5]))
check(answered + n_abort == tally.requests,
      "load256: each request answered or abandoned by its client",
      f"{answered} + {n_abort} of {tally.requests}")
check(n429 > 0 and n200 > 0,
      "load256: the burst went over the queue (429s) and requests got through (200s)",
      f"{n200} x 200, {n429} x 429")
srv_total = sum(delta.values())
check(srv_total == tally.sent_head and delta.get(429, 0) >= n429,
      "load256: the server answered every request whose head it got, none lost",
      f"server counted {srv_total} ({delta}), clients sent {tally.sent_head} heads; "
      f"429: server {delta.get(429, 0)}, clients read {n429}")
used, run, wait = (metric(ms, k) for k in ("energon_kv_cache_blocks_used",
                                           "energon_requests_running", "energon_requests_waiting"))
check(used == 0 and run == 0 and wait == 0,
      "load256: afterwards no KV blocks used, nothing running or waiting",
      f"blocks {used}, running {run}, waiting {wait}")
check(fd1 == fd0, "load256: open fds back where they were",
      f"{fd0} before, {mon.fds} peak, {fd1} after")
rss_msg = (f"{rss0 / 1024:.1f} MiB before, {mon.rss / 1024:.1f} MiB peak, "
           f"{rss1 / 1024:.1f} MiB after ({(rss1 - rss0) / 1024:+.1f} MiB, "
           f"allowed +{RSS_MARGIN_KIB / 1024:.0f} MiB)")
if ASAN:
    note(f"RSS under a sanitizer build, not judged: {rss_msg}")
else:
    check(rss1 - rss0 <= RSS_MARGIN_KIB, "load256: resident memory back near where it was",
          rss_msg)

st = health(srv.url)
path, body = make_body(random.Random(1), False)
s = connect()
s.sendall(b"".join(request_bytes(path, body)))
code, hd, b = parse_response(read_all(s))
s.close()
check(st == 200 and code == 200 and judge(code, hd, b, False) is None,
      "load256: after the storm /health is ok and a request is answered",
      f"/health {st}, request {code}")
rc = srv.stop()
check(rc == 0, "load256: the server exits 0 on SIGTERM",
      f"exit {rc}" + ("" if rc == 0 else "\n" + srv.tail()))
note(f"load256 total {time.time() - t_start:.1f} s{' (ThreadSanitizer build)' if TSAN else ''}")
finish("load256")
