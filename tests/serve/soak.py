"""soak.py - thousands of requests leave memory flat (issue 5, "What it
must show" 6). 8 client threads send a mix: non-streamed completions and
chat, streamed ones read to the end, streams dropped after a chunk, and
bad requests, all with short max_tokens. The server's resident size
(VmRSS, /proc/PID/status) after a warm-up of the same mix is compared with
the one after the soak: it must grow by at most 10% or 4 MiB, whichever is
larger. Threads and open file descriptors must not grow either, and the
KV cache must be empty at the end.

Count: EN_SOAK_REQUESTS, default 3000 (600 under AddressSanitizer, whose
quarantine of freed memory also makes RSS meaningless: there the RSS
figures are printed, and leaks are left to LeakSanitizer when the server
exits at the end of the suite). The soak also stops after EN_SOAK_SECONDS
(default 240) on a machine too busy for the count; at least a third of the
count must be done.
"""
import json
import os
import random
import socket
import threading
import time

from common import (ASAN, MODEL, PID, URL, alive, check, finish, health, http_json, metric, metrics,
                    n_fds, note, post, proc_status, split_url)

N = int(os.environ.get("EN_SOAK_REQUESTS") or (600 if ASAN else 3000))
MAX_S = float(os.environ.get("EN_SOAK_SECONDS") or 240)
WARM = max(100, N // 10)
THREADS = 8
words = "the otter rang the brass bell and the frogs woke up on the river".split()


def drop_stream(rng):
    host, port = split_url(URL)
    s = socket.create_connection((host, port), timeout=30)
    body = json.dumps({"model": MODEL, "prompt": " ".join(rng.choices(words, k=rng.randint(2, 30))),
                       "max_tokens": 64, "stream": True}).encode()
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    s.recv(1024)
    s.close()
    return 200


def one(rng):
    """Send one request of the mix; returns the status."""
    k = rng.random()
    prompt = " ".join(rng.choices(words, k=rng.randint(1, 40)))
    mt = rng.randint(1, 8)
    if k < 0.35:
        return post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": mt,
                                        "temperature": rng.choice([0, 0.8])})[0]
    if k < 0.6:
        return post("/v1/chat/completions", {"model": MODEL, "max_tokens": mt, "seed": rng.randint(0, 9),
                                             "messages": [{"role": "user", "content": prompt}],
                                             "logprobs": True, "top_logprobs": 2})[0]
    if k < 0.8:
        st, _, data = http_json("POST", "/v1/chat/completions",
                                {"model": MODEL, "max_tokens": mt, "stream": True, "temperature": 0,
                                 "stream_options": {"include_usage": True},
                                 "messages": [{"role": "user", "content": prompt}]})
        return st if b"[DONE]" in data else -1
    if k < 0.9:
        return drop_stream(rng)
    bad = rng.choice(['{"model": "%s", "messages": [' % MODEL,
                      {"model": MODEL, "messages": "x"},
                      {"model": MODEL, "prompt": "x", "max_tokens": -1},
                      {"model": "nope", "prompt": "x"}])
    st = http_json("POST", "/v1/completions" if isinstance(bad, dict) and "prompt" in bad
                   else "/v1/chat/completions", bad)[0]
    return 400 if st in (400, 404) else -st


def run(n, seed, max_s):
    counts = {}
    lock = threading.Lock()
    todo = list(range(n))
    deadline = time.time() + max_s

    def worker(t):
        rng = random.Random(seed * 100 + t)
        while True:
            with lock:
                if not todo or time.time() > deadline:
                    return
                todo.pop()
            try:
                st = one(rng)
            except Exception as e:
                st = type(e).__name__
            with lock:
                counts[st] = counts.get(st, 0) + 1

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return counts


def settle():
    """Wait until the server is idle (dropped streams cancelled)."""
    for _ in range(200):
        ms = metrics()
        if metric(ms, "energon_requests_running") == 0 and metric(ms, "energon_kv_cache_blocks_used") == 0:
            return ms
        time.sleep(0.05)
    return metrics()


t0 = time.time()
c_warm = run(WARM, 1, MAX_S / 4)
settle()
time.sleep(0.3)
before, fd_before = proc_status(), n_fds()
t1 = time.time()
counts = run(N, 2, MAX_S)
t_soak = time.time() - t1
ms = settle()
time.sleep(0.3)
after, fd_after = proc_status(), n_fds()

unexpected = {k: v for k, v in counts.items() if k not in (200, 400)}
done = sum(counts.values())
check(not unexpected, f"soak: {done} requests, every one answered as expected",
      f"{counts} in {t_soak:.1f} s ({done / t_soak:.0f} req/s; warm-up {sum(c_warm.values())}: {c_warm})")
check(done >= N // 3, "soak: enough requests within the time limit",
      f"{done} of {N} in {t_soak:.0f} s (limit {MAX_S:.0f} s)")
rb, ra = before["VmRSS"], after["VmRSS"]
margin = max(0.10 * rb, 4096)
msg = f"VmRSS after warm-up {rb / 1024:.1f} MiB, after soak {ra / 1024:.1f} MiB ({(ra - rb) / 1024:+.1f} MiB)"
if ASAN:
    note(f"soak under AddressSanitizer: {msg} (not judged: ASan's quarantine holds freed memory)")
else:
    check(ra - rb <= margin, "soak: resident memory flat", msg + f", allowed +{margin / 1024:.1f} MiB")
check(after["Threads"] <= before["Threads"] + 2, "soak: no thread growth",
      f"threads {before['Threads']} -> {after['Threads']}")
check(fd_after <= fd_before + 2, "soak: no file descriptor growth", f"open fds {fd_before} -> {fd_after}")
check(metric(ms, "energon_kv_cache_blocks_used") == 0 and metric(ms, "energon_requests_waiting") == 0,
      "soak: KV cache empty and queue empty afterwards",
      f"blocks used {metric(ms, 'energon_kv_cache_blocks_used')}, waiting {metric(ms, 'energon_requests_waiting')}")
check(alive(PID) and health() == 200, "soak: server alive, /health 200", f"total {time.time() - t0:.1f} s")

finish("soak")
