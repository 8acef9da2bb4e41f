#!/usr/bin/env python3
"""Cross-check for `energon bench serve`: the same closed-loop load test
written independently in Python (standard library only: threads and
http.client), printing the same JSON keys, so that the C client's figures
can be compared with a second measurement of the same server.

C threads share N streaming POST /v1/completions requests (temperature 0,
max_tokens M, stream_options.include_usage); prompts are words sized to
about P tokens after one short probe request reads the tokenizer's words
per token from usage. TTFT: request sent -> first chunk with text; ITL:
gaps between chunks with text; TPOT: (E2EL - TTFT) / (output tokens - 1).
Python's GIL adds client-side delay at high concurrency: compare at low C.

usage: serve_bench.py --url http://127.0.0.1:8080 [--concurrency 1]
                      [--requests 64] [--prompt-tokens 128] [--max-tokens 64]
                      [--api-key KEY] [--seed 0]
"""
import argparse
import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse

WORDS = ("report meeting budget travel policy holiday office laptop access review customer "
         "invoice delivery warehouse schedule question answer please explain how when where "
         "should could the and with for from about after before every team project").split()


def request(url, key, prompt, max_tokens):
    """One streamed completion: (ok, ttft, itls, e2el, prompt_tokens, output_tokens, err)."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    hdr = {"Content-Type": "application/json"}
    if key:
        hdr["Authorization"] = "Bearer " + key
    t0 = time.perf_counter()
    ttft, last, itls, chunks, usage, done = None, None, [], 0, None, False
    try:
        conn.request("POST", "/v1/completions", body, hdr)
        r = conn.getresponse()
        if r.status != 200:
            return False, None, [], 0, 0, 0, f"HTTP {r.status}: {r.read()[:200]!r}"
        for raw in r:  # http.client reads the chunked body line by line
            line = raw.decode().rstrip("\r\n")
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            now = time.perf_counter()
            ev = json.loads(data)
            if ev.get("usage"):
                usage = ev["usage"]
            ch = ev.get("choices") or []
            if ch and ch[0].get("text"):
                if ttft is None:
                    ttft = now - t0
                else:
                    itls.append(now - last)
                last = now
                chunks += 1
    except (OSError, http.client.HTTPException, ValueError) as e:
        return False, None, [], 0, 0, 0, str(e)
    finally:
        conn.close()
    e2el = time.perf_counter() - t0
    if not done:
        return False, None, [], 0, 0, 0, "no [DONE]"
    pt = usage["prompt_tokens"] if usage else 0
    ot = usage["completion_tokens"] if usage else chunks
    return True, ttft, itls, e2el, pt, ot, ""


def summary(name, v, out):
    v = sorted(v)
    n = len(v)

    def pct(q):
        pos = q * (n - 1)
        lo = int(pos)
        return v[lo] + (pos - lo) * (v[lo + 1] - v[lo]) if lo + 1 < n else v[lo]

    out[f"mean_{name}_ms"] = 1e3 * statistics.fmean(v) if n else None
    out[f"median_{name}_ms"] = 1e3 * pct(0.5) if n else None
    out[f"p99_{name}_ms"] = 1e3 * pct(0.99) if n else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--api-key")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    url = a.url.rstrip("/").removesuffix("/v1")
    rng = random.Random(a.seed)

    def prompt(n):
        return " ".join(rng.choice(WORDS) for _ in range(max(1, n))) + "?"

    ok, _, _, _, pt, _, err = request(url, a.api_key, prompt(24), 1)
    if not ok:
        raise SystemExit(f"serve_bench: first request failed: {err}")
    wpt = 24 / pt if pt else 0.75
    for _ in range(2):  # warm-up, not counted
        request(url, a.api_key, prompt(round(a.prompt_tokens * wpt)), a.max_tokens)
    prompts = [prompt(round(a.prompt_tokens * rng.uniform(0.75, 1.25) * wpt))
               for _ in range(a.requests)]
    results, lock, nxt = [None] * a.requests, threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= a.requests:
                return
            results[i] = request(url, a.api_key, prompts[i], a.max_tokens)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(min(a.concurrency, a.requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dur = time.perf_counter() - t0
    good = [r for r in results if r[0]]
    tin, tout = sum(r[4] for r in good), sum(r[5] for r in good)
    out = {"bench": "serve", "client": "python", "concurrency": a.concurrency,
           "successful_requests": len(good), "failed_requests": a.requests - len(good),
           "duration_s": dur, "total_input_tokens": tin, "total_output_tokens": tout,
           "request_throughput": len(good) / dur, "output_throughput": tout / dur,
           "total_token_throughput": (tin + tout) / dur}
    summary("ttft", [r[1] for r in good if r[1] is not None], out)
    summary("tpot", [(r[3] - r[1]) / (r[5] - 1) for r in good if r[1] is not None and r[5] > 1],
            out)
    summary("itl", [x for r in good for x in r[2]], out)
    summary("e2el", [r[3] for r in good], out)
    bad = [r[6] for r in results if not r[0]]
    if bad:
        out["first_error"] = bad[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
