"""concurrency.py - 32 concurrent clients (issue 5, "What it must show" 2).

Each of 32 requests (completions and chat, prompts from a few tokens to a
few hundred, temperature 0) is first sent alone, one after the other; then
all 32 at once from 32 threads. Every answer must be the same text as the
one it got alone (the engine's batch-invariant mode), all must succeed,
and /metrics must show that they ran together (energon_requests_running
sampled above 1) and count exactly the tokens the responses report.
"""
import threading
import time

from common import (CTX, MODEL, check, finish, metric, metrics, note, openai_client, short, story_text,
                    tokenize)

words = story_text().split()
reqs = []
# prompt lengths in words: a few to a few hundred (capped by the context below)
lengths = [2, 3, 5, 8, 12, 20, 30, 45, 60, 80, 100, 130, 160, 200, 240, 280]
for i in range(32):
    n = lengths[i % len(lengths)]
    start = (i * 37) % max(1, len(words) - n)
    text = " ".join(words[start:start + n])
    max_tokens = 8 + (i * 13) % 41
    ntok = tokenize(text)
    # stay inside the context: prompt + template + max_tokens
    while ntok + max_tokens + 40 > CTX:
        text = " ".join(text.split()[: int(len(text.split()) * 0.8)])
        ntok = tokenize(text)
    if i % 4 == 3:
        reqs.append(("chat", dict(messages=[{"role": "user", "content": text}], max_tokens=max_tokens)))
    else:
        reqs.append(("completions", dict(prompt=text, max_tokens=max_tokens)))
    reqs[-1][1]["_ntok"] = ntok
ntoks = [r[1].pop("_ntok") for r in reqs]
note(f"32 requests: {sum(1 for r in reqs if r[0] == 'chat')} chat, prompts {min(ntoks)}..{max(ntoks)} tokens, "
     f"max_tokens {min(r[1]['max_tokens'] for r in reqs)}..{max(r[1]['max_tokens'] for r in reqs)}")


def send(client, kind, kw):
    if kind == "chat":
        r = client.chat.completions.create(model=MODEL, temperature=0, **kw)
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage
    r = client.completions.create(model=MODEL, temperature=0, **kw)
    return r.choices[0].text, r.choices[0].finish_reason, r.usage


client = openai_client()
alone = []
t0 = time.time()
for kind, kw in reqs:
    alone.append(send(client, kind, kw))
t_alone = time.time() - t0

def settled_metrics():
    """/metrics once energon_requests_total has stopped moving: the server
    counts a request when its connection is done, just after the client
    has its answer (a read right away could miss the last one)."""
    last, ms = None, metrics()
    for _ in range(40):
        total = sum(v for n, l, v in ms if n == "energon_requests_total" and
                    "completions" in l.get("endpoint", ""))
        if total == last:
            break
        last = total
        time.sleep(0.05)
        ms = metrics()
    return ms


m0 = settled_metrics()
samples = {"running": 0, "waiting": 0, "blocks": 0, "n": 0}
stop_sampling = threading.Event()


def sampler():
    while not stop_sampling.is_set():
        try:
            ms = metrics()
        except Exception:
            continue
        samples["running"] = max(samples["running"], metric(ms, "energon_requests_running") or 0)
        samples["waiting"] = max(samples["waiting"], metric(ms, "energon_requests_waiting") or 0)
        samples["blocks"] = max(samples["blocks"], metric(ms, "energon_kv_cache_blocks_used") or 0)
        samples["n"] += 1
        time.sleep(0.005)


together = [None] * 32
barrier = threading.Barrier(32)


def worker(i):
    c = openai_client()
    barrier.wait()
    try:
        together[i] = send(c, *reqs[i])
    except Exception as e:
        together[i] = e


st = threading.Thread(target=sampler)
st.start()
threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
t0 = time.time()
for t in threads:
    t.start()
for t in threads:
    t.join()
t_together = time.time() - t0
stop_sampling.set()
st.join()
m1 = settled_metrics()

errors = [(i, r) for i, r in enumerate(together) if isinstance(r, Exception)]
check(not errors, "32 concurrent clients all succeed",
      f"{32 - len(errors)}/32 in {t_together:.2f} s (sent alone one by one: {t_alone:.2f} s)" if not errors else
      "; ".join(f"#{i}: {type(e).__name__} {short(str(e), 80)}" for i, e in errors[:3]))
diff = [i for i, r in enumerate(together) if not isinstance(r, Exception) and r[0] != alone[i][0]]
check(not diff, "every temperature-0 answer equals the same request sent alone",
      "32/32 identical" if not diff else
      f"{len(diff)} differ, e.g. #{diff[0]} ({reqs[diff[0]][0]}, {ntoks[diff[0]]} prompt tokens): "
      f"alone {short(alone[diff[0]][0], 60)!r} vs together {short(together[diff[0]][0], 60)!r}")
same_usage = all(isinstance(r, tuple) and r[1] == alone[i][1] and r[2].completion_tokens == alone[i][2].completion_tokens
                 and r[2].prompt_tokens == alone[i][2].prompt_tokens for i, r in enumerate(together))
check(same_usage, "finish reasons and usage equal alone and together")
check(samples["running"] > 1, "metrics: requests ran concurrently",
      f"energon_requests_running max {samples['running']:.0f}, waiting max {samples['waiting']:.0f}, "
      f"kv blocks used max {samples['blocks']:.0f} ({samples['n']} samples)")


def delta(name, **labels):
    a, b = metric(m0, name, **labels), metric(m1, name, **labels)
    return None if a is None or b is None else b - a


ok_req = sum(r for n, l, r in m1 if n == "energon_requests_total" and "completions" in l.get("endpoint", "")
             and l.get("status") == "200") - \
    sum(r for n, l, r in m0 if n == "energon_requests_total" and "completions" in l.get("endpoint", "")
        and l.get("status") == "200")
check(ok_req == 32, "metrics: energon_requests_total{endpoint=~completions, status=200} grew by 32", f"{ok_req:.0f}")
good = [r for r in together if isinstance(r, tuple)]
p_sum = sum(r[2].prompt_tokens for r in good)
g_sum = sum(r[2].completion_tokens for r in good)
dp, dg = delta("energon_prompt_tokens_total"), delta("energon_generation_tokens_total")
check(dp == p_sum, "metrics: energon_prompt_tokens_total grew by the responses' prompt tokens", f"{dp} vs {p_sum}")
check(dg == g_sum, "metrics: energon_generation_tokens_total grew by the responses' completion tokens",
      f"{dg} vs {g_sum}")
dt = delta("energon_time_to_first_token_seconds_count")
check(dt == 32, "metrics: time-to-first-token histogram counted 32 requests", f"{dt}")
b_inf = [v for n, l, v in m1 if n == "energon_time_to_first_token_seconds_bucket" and l.get("le") == "+Inf"]
c_all = metric(m1, "energon_time_to_first_token_seconds_count")
check(b_inf and b_inf[0] == c_all, "metrics: ttft +Inf bucket equals its count", f"{b_inf} vs {c_all}")
check(metric(m1, "energon_kv_cache_blocks_used") == 0 and metric(m1, "energon_requests_running") == 0,
      "metrics: no KV blocks and no running request after the 32",
      f"blocks {metric(m1, 'energon_kv_cache_blocks_used')}, total {metric(m1, 'energon_kv_cache_blocks_total')}")

finish("concurrency")
