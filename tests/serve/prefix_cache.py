"""prefix_cache.py - KV blocks shared between requests that begin with the
same tokens (issue 14, "Prefix caching" in docs/serving.md).

Prompts of ~300 shared tokens (a story paragraph written here, so that no
other script's prompt begins like it) and a short suffix of their own,
completions endpoint, temperature 0, through the official openai client:

  1. request A (the prefix and suffix 0) alone, then again: the second
     finds its whole prompt cached but the block of its last token
     (usage.prompt_tokens_details.cached_tokens a multiple of 16 below
     prompt_tokens) and answers the same text;
  2. 16 requests (A and 15 other suffixes) at once from 16 threads: all
     succeed, each finds exactly the full blocks of the tokens it shares
     with a prompt sent before it (computed from /tokenize; the lookup
     matches whole 16-token blocks), and /metrics' prefix-cache hits grow
     by the responses' cached tokens;
  3. A and the 16 at a second server started with --no-prefix-cache
     (EN_URL_NOCACHE, else one started here): the same answers, no cached
     tokens, its prefix-cache metrics stay 0;
  4. each of the 16 alone, one by one, at the main server: the answers of
     step 2.
"""
import os
import threading
import time

from common import (CTX, MODEL, SLOW, Server, check, finish, health, metric, metrics, note,
                    openai_client, post, short)

BLOCK = 16
MAX_TOKENS = 24
STORY = [
    "Once there was a small brown dog named Pip who lived in a blue house by the river.",
    "Every morning Pip ran to the garden to look for his red ball under the old apple tree.",
    "One day the wind was strong and the ball rolled away into the tall green grass.",
    "Pip looked and looked, but he could not find it anywhere near the fence.",
    "A kind bird named Bella flew down from the tree and said she would help him look.",
    "They searched by the pond, behind the shed and under the big wooden bench.",
    "At last Bella saw something red shining in the sun next to a sleeping cat.",
    "Pip was very happy and thanked his friend, and they played together all day.",
]
# first words whose first token differs (stories260K's 512-piece vocabulary):
# two prompts share the prefix and no token more
SUFFIXES = [
    " The sun was warm and", " She said to Pip that", " He wanted to go to",
    " They went to the park and", " One day Pip saw a", " It was a big day for",
    " But the cat woke up and", " So Pip ran to his mom and", " When the rain came, Pip",
    " Later that night, Pip", " His mom gave him a", " On the way home, they",
    " Tom came to the garden and", " Lily had a new toy and", " Max the frog jumped and",
    " Oscar the owl said",
]
N = len(SUFFIXES)


def tokens(text, url=None):
    st, js, data = post("/tokenize", {"model": MODEL, "prompt": text}, url=url)
    if st != 200 or not isinstance(js, dict) or "tokens" not in js:
        raise RuntimeError(f"/tokenize answered {st}: {short(data)}")
    return js["tokens"]


def common_len(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def full_blocks(n):
    return n // BLOCK * BLOCK


# ---- the prompts: the story's sentences (again from the start if need be) up to ~300 tokens
prefix = STORY[0]
while len(tokens(prefix)) < 290:
    prefix += " " + STORY[len(prefix.split(". ")) % len(STORY)]
prompts = [prefix + s for s in SUFFIXES]
toks = [tokens(p) for p in prompts]
n_prefix = len(tokens(prefix))
n_shared = min(common_len(toks[0], t) for t in toks[1:])
longest = max(len(t) for t in toks)
note(f"shared prefix {n_prefix} tokens ({len(prefix)} chars), {n_shared} tokens common to all "
     f"{N} prompts ({full_blocks(n_shared) // BLOCK} full {BLOCK}-token blocks); prompts "
     f"{min(map(len, toks))}..{longest} tokens, max_tokens {MAX_TOKENS}, context {CTX}")
if longest + MAX_TOKENS > CTX:
    check(False, "prompts fit the context", f"{longest} + {MAX_TOKENS} > {CTX}")
    finish("prefix_cache")


def cached(usage):
    d = getattr(usage, "prompt_tokens_details", None)
    return None if d is None else getattr(d, "cached_tokens", None)


def send(client, i):
    r = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=MAX_TOKENS,
                                  temperature=0)
    return r.choices[0].text, r.choices[0].finish_reason, r.usage


def together(url):
    """The N requests at once from N threads: a list of (text, finish,
    usage) or the exception."""
    out = [None] * N
    barrier = threading.Barrier(N)

    def worker(i):
        c = openai_client(url)
        try:
            barrier.wait(60 * SLOW)
            out[i] = send(c, i)
        except Exception as e:  # noqa: BLE001 - reported as a FAIL line
            out[i] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def errors_of(results):
    return [(i, r) for i, r in enumerate(results) if isinstance(r, Exception)]


def describe_errors(errs):
    return "; ".join(f"#{i}: {type(e).__name__} {short(str(e), 80)}" for i, e in errs[:3])


def delta(m0, m1, name):
    a, b = metric(m0, name), metric(m1, name)
    return None if a is None or b is None else b - a


client = openai_client()

# ---- 1. A alone, twice
a1 = send(client, 0)
a2 = send(client, 0)
n_a = a1[2].prompt_tokens
want = full_blocks(n_a - 1)
check(n_a == len(toks[0]), "usage.prompt_tokens is /tokenize's count", f"{n_a} vs {len(toks[0])}")
check(cached(a1[2]) == 0, "the first request finds nothing cached",
      f"cached_tokens {cached(a1[2])} of {n_a}")
c2 = cached(a2[2])
check(c2 is not None and c2 > 0 and c2 % BLOCK == 0 and c2 < n_a and c2 == want,
      "the same request again reads its prompt from the cache",
      f"cached_tokens {c2} of {n_a} (want {want}: the full blocks before the last token's)")
check(a1[0] == a2[0] and a1[1] == a2[1] and a1[2].completion_tokens == a2[2].completion_tokens,
      "its answer is the same with the cache", f"{short(a1[0], 50)!r} vs {short(a2[0], 50)!r}")

# ---- 2. the 16 at once
# Each prompt's cached tokens: the full blocks of its longest common prefix
# with a prompt already cached. A (= prompt 0) certainly is (low); the other
# 15 may be, depending on when each got in (high); both equal when no two
# suffixes share a token.
low = [min(full_blocks(common_len(t, toks[0])), full_blocks(len(t) - 1)) for t in toks]
high = [min(full_blocks(max(common_len(t, u) for j, u in enumerate(toks) if j != i or i == 0)),
            full_blocks(len(t) - 1)) for i, t in enumerate(toks)]
m1 = metrics()
t0 = time.time()
conc = together(None)
t_conc = time.time() - t0
m2 = metrics()
errs = errors_of(conc)
check(not errs, f"{N} concurrent requests with the shared prefix all succeed",
      f"{N}/{N} in {t_conc:.2f} s" if not errs else describe_errors(errs))
ok = [i for i, r in enumerate(conc) if isinstance(r, tuple)]
got = {i: cached(conc[i][2]) for i in ok}
# a preempted request may find its own blocks when it is re-admitted
preempted = delta(m1, m2, "energon_preemptions_total") or 0
if preempted:
    high = [full_blocks(len(t) - 1) for t in toks]
bad = [i for i in ok if got[i] is None or not low[i] <= got[i] <= high[i]]
exact = sum(1 for i in range(N) if low[i] == high[i])
check(not bad and len(ok) == N, "each finds the full blocks it shares with an earlier prompt",
      f"cached_tokens {[got.get(i) for i in range(N)]}; {exact}/{N} exactly as predicted, "
      f"at least {full_blocks(n_shared)} each" if not bad else
      "; ".join(f"#{i}: {got[i]} not in [{low[i]}, {high[i]}]" for i in bad[:4]))
check(all(got.get(i) is not None and got[i] < conc[i][2].prompt_tokens for i in ok),
      "the block of the last prompt token is never shared")
hits, queries = (delta(m1, m2, "energon_prefix_cache_hits_total"),
                 delta(m1, m2, "energon_prefix_cache_queries_total"))
sum_cached = sum(v or 0 for v in got.values())
sum_full = sum(full_blocks(len(toks[i]) - 1) for i in ok)
# a preempted request looks its prompt up again when it is re-admitted
check(hits is not None and hits > 0
      and (preempted > 0 or (hits == sum_cached and queries == sum_full)),
      "metrics: prefix-cache hits and queries grew by the responses' figures",
      f"hits +{hits:.0f} (cached_tokens sum {sum_cached}), queries +{queries:.0f} "
      f"(full blocks {sum_full}), preemptions +{preempted:.0f}")
distinct = len(set(r[0] for r in conc if isinstance(r, tuple)))
note(f"hit ratio {hits / queries if queries else 0:.3f} ({hits:.0f} of {queries:.0f} looked-up "
     f"tokens); cached blocks {metric(m2, 'energon_prefix_cache_blocks'):.0f}, evictions "
     f"{metric(m2, 'energon_prefix_cache_evictions_total'):.0f}; {distinct} distinct answers "
     f"of {N}")

# ---- 3. a server without the cache: the same answers
own = None
url_nc = os.environ.get("EN_URL_NOCACHE", "")
if not url_nc:
    own = Server("nocache", "--model-name", MODEL, "--ctx", str(CTX), "--no-prefix-cache")
    url_nc = own.url
deadline = time.time() + 120 * SLOW
while health(url_nc) != 200 and time.time() < deadline:
    time.sleep(0.1)
client_nc = openai_client(url_nc)
nc_a = send(client_nc, 0)
nc = together(url_nc)
mnc = metrics(url_nc)
errs = errors_of(nc)
check(not errs, f"--no-prefix-cache server: A and {N} concurrent requests succeed",
      describe_errors(errs))
diff = [i for i in range(N) if not isinstance(nc[i], tuple) or not isinstance(conc[i], tuple)
        or nc[i][:2] != conc[i][:2]]
check(nc_a[:2] == a1[:2] and not diff, "every answer equals the cached server's",
      f"{N + 1}/{N + 1} identical" if not diff and nc_a[:2] == a1[:2] else
      f"A {short(nc_a[0], 40)!r} vs {short(a1[0], 40)!r}; differ: {diff[:6]}" +
      (f", e.g. #{diff[0]}: {short(str(nc[diff[0]]), 50)!r} vs {short(str(conc[diff[0]]), 50)!r}"
       if diff else ""))
nc_cached = [cached(r[2]) for r in [nc_a] + nc if isinstance(r, tuple)]
check(all(not c for c in nc_cached), "--no-prefix-cache: no cached tokens",
      f"cached_tokens {sorted(set(nc_cached), key=str)}")
check(all(metric(mnc, n) == 0 for n in ("energon_prefix_cache_hits_total",
                                        "energon_prefix_cache_queries_total",
                                        "energon_prefix_cache_blocks")),
      "--no-prefix-cache: its prefix-cache metrics stay 0",
      f"hits {metric(mnc, 'energon_prefix_cache_hits_total')}, queries "
      f"{metric(mnc, 'energon_prefix_cache_queries_total')}, blocks "
      f"{metric(mnc, 'energon_prefix_cache_blocks')}")
if own is not None:
    own.stop()

# ---- 4. each alone at the main server
m3 = metrics()
alone = []
for i in range(N):
    try:
        alone.append(send(client, i))
    except Exception as e:  # noqa: BLE001
        alone.append(e)
m4 = metrics()
diff = [i for i in range(N) if not isinstance(alone[i], tuple) or not isinstance(conc[i], tuple)
        or alone[i][:2] != conc[i][:2]]
check(not diff, "each of the 16 alone answers what it answered concurrently",
      f"{N}/{N} identical" if not diff else
      f"{len(diff)} differ, e.g. #{diff[0]}: {short(str(alone[diff[0]]), 60)!r} vs "
      f"{short(str(conc[diff[0]]), 60)!r}")
# each prompt is cached whole by now (unless blocks were evicted meanwhile)
evicted = delta(m2, m4, "energon_prefix_cache_evictions_total") or 0
got4 = [cached(r[2]) if isinstance(r, tuple) else None for r in alone]
want4 = [full_blocks(len(t) - 1) for t in toks]
check(all(g is not None for g in got4) and
      (got4 == want4 if not evicted
       else all(g % BLOCK == 0 and g <= w for g, w in zip(got4, want4))),
      "alone again: each finds its whole prompt cached but the last token's block",
      f"cached_tokens {got4} (evictions since step 2: {evicted:.0f})")
hits4 = delta(m3, m4, "energon_prefix_cache_hits_total") or 0
queries4 = delta(m3, m4, "energon_prefix_cache_queries_total") or 0
note(f"alone: hit ratio {hits4 / queries4 if queries4 else 0:.3f} ({hits4:.0f} of {queries4:.0f})")
finish("prefix_cache")
