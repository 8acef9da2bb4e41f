"""slowclients.py - thousands of slow clients do not lock the server out
(issue 31, finding 5). Against a server of its own (--request-timeout RT),
N connections from 127.0.0.1 each send one byte of a request head every
2 s (a slowloris); a connection the server cuts is opened again at once, so
that N are dripping throughout. Meanwhile a prober asks GET /health and a
short POST /v1/completions in turns, each on a new connection, every 0.25 s.

Checks: the server held N dripping connections at once (its
energon_http_connections gauge); every probe answered 200 within 1 s
(sanitizer builds: 1 s x SLOW); each dripper was cut at the deadline,
between RT and RT + 1.5 s after it connected (none earlier: the idle
timeout never fired, since each sent a byte every 2 s); after the drippers
close, the server's connection count comes back down and it still answers.
Bounded: DURATION seconds of dripping, all to 127.0.0.1.
"""
import os
import resource
import selectors
import socket
import statistics
import threading
import time

from common import MODEL, SLOW, ASAN, Server, check, finish, http, metric, metrics, note, split_url

N = int(os.environ.get("EN_SLOW_CLIENTS", "400" if ASAN else "2000"))
RT = float(os.environ.get("EN_SLOW_RT", "6"))
DURATION = float(os.environ.get("EN_SLOW_DURATION", "16"))
DRIP_S = 2.0
LIMIT_S = 1.0 * SLOW

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = N + 256
if soft < want:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    soft = min(want, hard)
if soft < want:
    note(f"open-file limit {soft}: {soft - 256} slow clients instead of {N}")
    N = soft - 256

# EN_SLOW_CLIENTS above 4000 needs a larger --max-connections: EN_SLOW_MAXCONN
MAXCONN = os.environ.get("EN_SLOW_MAXCONN")
srv = Server("slowclients", "--model-name", MODEL, "--request-timeout", f"{RT:g}", "--timeout", "30",
             "--quiet", *(["--max-connections", MAXCONN] if MAXCONN else []))
URL = srv.url
host, port = split_url(URL)
HEAD = (f"GET /health HTTP/1.1\r\nHost: {host}\r\nX-Slow: " + "a" * 4000 + "\r\n\r\n").encode()

sel = selectors.DefaultSelector()
drippers = {}  # socket -> [connected_at, bytes sent, next drip time]
lifetimes = []  # seconds from connect to the server's cut
early = []  # cut before the deadline
refused = [0]


def open_one(now):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect((host, port))
    except BlockingIOError:
        pass
    except OSError:
        refused[0] += 1
        s.close()
        return
    # spread the drips over the 2 s period
    drippers[s] = [now, 0, now + (len(drippers) % 200) / 100.0]
    sel.register(s, selectors.EVENT_READ)


def cut(s, now):
    t0 = drippers.pop(s)[0]
    sel.unregister(s)
    s.close()
    return now - t0


probes = []  # (what, status, seconds)
stop = threading.Event()


def prober():
    i = 0
    while not stop.is_set():
        t0 = time.time()
        try:
            if i % 2 == 0:
                st, _, _ = http("GET", "/health", url=URL, timeout=10)
                what = "health"
            else:
                st, _, _ = http("POST", "/v1/completions",
                                {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4,
                                 "temperature": 0}, url=URL, timeout=10)
                what = "completion"
        except OSError as e:
            st, what = f"error {e}", "health" if i % 2 == 0 else "completion"
        probes.append((what, st, time.time() - t0))
        i += 1
        stop.wait(0.25)


# ---- open N drippers, in batches (the listen backlog is finite)
t_start = time.time()
while len(drippers) < N and time.time() - t_start < 30:
    now = time.time()
    for _ in range(min(200, N - len(drippers))):
        open_one(now)
    time.sleep(0.05)
note(f"{len(drippers)} slow clients connected in {time.time() - t_start:.1f} s")
th = threading.Thread(target=prober, daemon=True)
th.start()

peak_seen = 0
last_metrics = 0.0
t_end = time.time() + DURATION
while time.time() < t_end:
    now = time.time()
    for key, _ in sel.select(timeout=0.01):
        s = key.fileobj
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        if data:
            continue  # an answer would mean the head was complete: never here
        life = cut(s, now)
        (lifetimes if life >= RT - 0.2 else early).append(life)
        open_one(now)
    for s, st in list(drippers.items()):
        if st[2] <= now and st[1] < len(HEAD) - 4:
            try:
                s.send(HEAD[st[1]:st[1] + 1])
                st[1] += 1
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                life = cut(s, now)
                (lifetimes if life >= RT - 0.2 else early).append(life)
                open_one(now)
                continue
            st[2] = now + DRIP_S
    if now - last_metrics > 1.0:
        last_metrics = now
        try:
            peak_seen = max(peak_seen, int(metric(metrics(URL), "energon_http_connections") or 0))
        except OSError:
            pass
stop.set()
th.join(10)

health_t = [t for w, st, t in probes if w == "health" and st == 200]
comp_t = [t for w, st, t in probes if w == "completion" and st == 200]
bad = [(w, st, round(t, 3)) for w, st, t in probes if st != 200]
note(f"probes: {len(health_t)} /health, {len(comp_t)} completions; "
     f"max {max(health_t, default=0):.3f} / {max(comp_t, default=0):.3f} s")
check(peak_seen >= N, f"the server held {N} slow connections at once",
      f"energon_http_connections peaked at {peak_seen} (client side {len(drippers)}, "
      f"connect errors {refused[0]})")
check(not bad and len(health_t) >= DURATION * 1.5 and max(health_t, default=99) < LIMIT_S,
      f"/health answered within {LIMIT_S:g} s throughout, beside {N} slow clients",
      f"{len(health_t)} answers, median {statistics.median(health_t) if health_t else 0:.3f} s, "
      f"max {max(health_t, default=0):.3f} s; failures {bad[:3]}")
check(not bad and len(comp_t) >= DURATION * 1.5 and max(comp_t, default=99) < LIMIT_S,
      f"a completion answered within {LIMIT_S:g} s throughout, beside {N} slow clients",
      f"{len(comp_t)} answers, median {statistics.median(comp_t) if comp_t else 0:.3f} s, "
      f"max {max(comp_t, default=0):.3f} s")
lt = sorted(lifetimes)
check(len(lt) >= N // 2 and not early and lt[0] >= RT - 0.2 and lt[-1] <= RT + 1.5 * SLOW,
      f"each dripping client was cut at --request-timeout {RT:g} s",
      f"{len(lt)} cut, after {lt[0] if lt else 0:.2f} .. {lt[-1] if lt else 0:.2f} s "
      f"(median {statistics.median(lt) if lt else 0:.2f}); cut early: {len(early)}")

for s in list(drippers):
    cut(s, time.time())
deadline = time.time() + 10 * SLOW
left = None
while time.time() < deadline:
    left = int(metric(metrics(URL), "energon_http_connections") or 0)
    if left <= 2:
        break
    time.sleep(0.2)
check(left is not None and left <= 2, "the connections are gone once the clients close",
      f"energon_http_connections {left}")
st, _, _ = http("GET", "/health", url=URL)
check(st == 200, "/health 200 afterwards", f"{st}")
check(srv.stop() == 0, "the server exits 0 on SIGTERM", srv.tail(5) if srv.proc.returncode else "")
finish("slowclients")
