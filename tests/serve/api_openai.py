"""api_openai.py - the official openai client drives the server (issue 5,
"What it must show" 1). Every expectation is computed here from other
answers of the server (the same request non-streamed, /tokenize, the greedy
text cut by our own logic) and parsed by the openai client, never a
hard-coded output:

  completions and chat, streamed and not: the same text at temperature 0,
  usage present and consistent, a final usage chunk with include_usage;
  stop strings; seed; max_tokens -> "length"; n=2; logprobs shapes;
  /v1/models; BadRequestError, NotFoundError, AuthenticationError (a
  second server with --api-key / --api-key-file) and RateLimitError (a
  server with --max-queue 1 --max-batch 1 under concurrent long requests).
"""
import math
import os
import threading

import openai

from common import (CTX, MODEL, TMP, Server, check, finish, note, openai_client, post, short,
                    tokenize)

client = openai_client()
PROMPT = "Once upon a time, there was a little dog named Max. One day, Max"
MSGS = [{"role": "user", "content": "Tell me a story about a boat and a frog."}]


def cmpl(**kw):
    args = dict(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=32)
    args.update(kw)
    return client.completions.create(**args)


def chat(**kw):
    args = dict(model=MODEL, messages=MSGS, temperature=0, max_tokens=32)
    args.update(kw)
    return client.chat.completions.create(**args)


def usage_ok(u, max_tokens, finish_reason):
    """What is wrong with a usage object, or None."""
    if u is None:
        return "no usage"
    if u.total_tokens != u.prompt_tokens + u.completion_tokens:
        return f"total {u.total_tokens} != {u.prompt_tokens} + {u.completion_tokens}"
    if not 0 < u.completion_tokens <= max_tokens:
        return f"completion_tokens {u.completion_tokens} outside 1..{max_tokens}"
    if finish_reason == "length" and u.completion_tokens != max_tokens:
        return f"finish 'length' but completion_tokens {u.completion_tokens} != max_tokens {max_tokens}"
    return None


def pick_stop(text):
    """A 4-character stop string from the middle of text whose first
    occurrence is not at the start, so the cut output is non-empty."""
    for i in list(range(len(text) // 2, len(text) - 4)) + list(range(1, len(text) // 2)):
        s = text[i:i + 4]
        if s.strip() and "\ufffd" not in s and text.find(s) >= 1:
            return s
    return None


def stream_text(chunks, chat_mode):
    parts, finishes, usage, n_text = [], [], None, 0
    for c in chunks:
        if c.usage is not None:
            usage = c
        for ch in c.choices:
            t = ch.delta.content if chat_mode else ch.text
            if t:
                parts.append(t)
                n_text += 1
            if ch.finish_reason:
                finishes.append(ch.finish_reason)
    return "".join(parts), finishes, usage, n_text


# ---- completions, not streamed
a = cmpl()
ca = a.choices[0]
check(a.object == "text_completion" and len(a.choices) == 1 and ca.index == 0 and a.id,
      "completions: object/id/choices shape", f"object {a.object!r}, {len(a.choices)} choice(s)")
check(ca.finish_reason in ("length", "stop"), "completions: finish_reason", ca.finish_reason)
err = usage_ok(a.usage, 32, ca.finish_reason)
check(err is None, "completions: usage consistent", err or
      f"prompt {a.usage.prompt_tokens}, completion {a.usage.completion_tokens}, total {a.usage.total_tokens}")
ntok = tokenize(PROMPT)
check(a.usage.prompt_tokens == ntok, "completions: usage.prompt_tokens equals /tokenize's count",
      f"usage {a.usage.prompt_tokens}, /tokenize {ntok}")
check(len(ca.text) > 0, "completions: non-empty text", short(ca.text, 80))
a2 = cmpl()
check(a2.choices[0].text == ca.text, "completions: temperature 0 is deterministic",
      "two identical requests, same text" if a2.choices[0].text == ca.text else
      f"{short(ca.text)!r} vs {short(a2.choices[0].text)!r}")

# ---- completions, streamed
chunks = list(cmpl(stream=True, stream_options={"include_usage": True}))
txt, fins, uchunk, n_text = stream_text(chunks, False)
check(txt == ca.text, "completions stream: concatenation equals the non-streamed text",
      f"{n_text} text chunks, {len(txt)} chars" if txt == ca.text else f"{short(txt)!r} vs {short(ca.text)!r}")
check(n_text > 1, "completions stream: several chunks", f"{n_text}")
check(fins == [ca.finish_reason], "completions stream: one finish_reason, same as non-streamed", f"{fins}")
check(uchunk is not None and chunks[-1] is uchunk and uchunk.choices == [],
      "completions stream: include_usage gives a final usage chunk with no choices",
      f"usage chunk at {chunks.index(uchunk) if uchunk in chunks else None} of {len(chunks)}")
if uchunk is not None:
    u = uchunk.usage
    check((u.prompt_tokens, u.completion_tokens, u.total_tokens) ==
          (a.usage.prompt_tokens, a.usage.completion_tokens, a.usage.total_tokens),
          "completions stream: usage equals the non-streamed usage",
          f"{u.prompt_tokens}/{u.completion_tokens}/{u.total_tokens}")
chunks = list(cmpl(stream=True))
check(all(c.usage is None for c in chunks), "completions stream: no usage without stream_options",
      f"{len(chunks)} chunks")
check(stream_text(chunks, False)[0] == ca.text, "completions stream (no usage): same text")

# ---- chat, not streamed
d = chat()
cd = d.choices[0]
check(d.object == "chat.completion" and cd.message.role == "assistant" and isinstance(cd.message.content, str),
      "chat: object, role assistant, string content", f"{d.object!r}, {cd.message.role!r}")
err = usage_ok(d.usage, 32, cd.finish_reason)
check(err is None, "chat: usage consistent", err or
      f"prompt {d.usage.prompt_tokens}, completion {d.usage.completion_tokens}")
n_user = tokenize(MSGS[0]["content"])
check(d.usage.prompt_tokens > n_user, "chat: prompt_tokens count the template around the message",
      f"{d.usage.prompt_tokens} > {n_user} of the bare message")
check(len(cd.message.content) > 0, "chat: non-empty answer", short(cd.message.content, 80))

chunks = list(chat(stream=True, stream_options={"include_usage": True}))
txt, fins, uchunk, n_text = stream_text(chunks, True)
check(txt == cd.message.content, "chat stream: concatenation equals the non-streamed answer",
      f"{n_text} text chunks" if txt == cd.message.content else f"{short(txt)!r} vs {short(cd.message.content)!r}")
check(all(c.object == "chat.completion.chunk" for c in chunks), "chat stream: chunk objects",
      f"{len(chunks)} chunks")
roles = [ch.delta.role for c in chunks for ch in c.choices if ch.delta.role]
check(roles[:1] == ["assistant"], "chat stream: first delta carries role assistant", f"{roles[:2]}")
check(fins == [cd.finish_reason], "chat stream: finish_reason same as non-streamed", f"{fins}")
check(uchunk is not None and uchunk.usage.completion_tokens == d.usage.completion_tokens and
      uchunk.usage.prompt_tokens == d.usage.prompt_tokens,
      "chat stream: final usage chunk equals the non-streamed usage",
      f"{uchunk.usage if uchunk else None}")

# ---- stop strings
for mode in ("completions", "chat"):
    base = cmpl(max_tokens=48) if mode == "completions" else chat(max_tokens=48)
    text = base.choices[0].text if mode == "completions" else base.choices[0].message.content
    s = pick_stop(text)
    if not check(s is not None, f"{mode} stop: a stop string found in the greedy text", short(text, 60)):
        continue
    want = text[:text.find(s)]
    for stops in ([s], ["\u2603never-there", s]):
        r = cmpl(max_tokens=48, stop=stops) if mode == "completions" else chat(max_tokens=48, stop=stops)
        got = r.choices[0].text if mode == "completions" else r.choices[0].message.content
        check(got == want and s not in got and r.choices[0].finish_reason == "stop",
              f"{mode} stop {stops!r}: output is the text before it, finish 'stop'",
              f"{len(got)} chars, finish {r.choices[0].finish_reason}, completion_tokens "
              f"{r.usage.completion_tokens} < {base.usage.completion_tokens}" if got == want else
              f"got {short(got)!r}, want {short(want)!r}, finish {r.choices[0].finish_reason}")
    st = list(cmpl(max_tokens=48, stop=[s], stream=True)) if mode == "completions" else \
        list(chat(max_tokens=48, stop=[s], stream=True))
    txt, fins, _, _ = stream_text(st, mode == "chat")
    check(txt == want and fins == ["stop"], f"{mode} stop, streamed: same cut text, finish 'stop'",
          f"{short(txt)!r} vs {short(want)!r}, {fins}")
r = cmpl(max_tokens=32, stop=["\u2603never-there"])
check(r.choices[0].text == ca.text and r.choices[0].finish_reason == ca.finish_reason,
      "stop string that never appears: output unchanged", r.choices[0].finish_reason)

# ---- seed
s1 = cmpl(temperature=1, seed=1234, max_tokens=24).choices[0].text
s2 = cmpl(temperature=1, seed=1234, max_tokens=24).choices[0].text
check(s1 == s2, "seed: same seed at temperature 1 gives the same text", short(s1, 60))
s3 = "".join(c.choices[0].text for c in cmpl(temperature=1, seed=1234, max_tokens=24, stream=True) if c.choices)
check(s3 == s1, "seed: streamed with the same seed gives the same text", short(s3, 60))
texts = {cmpl(temperature=1, seed=k, max_tokens=24).choices[0].text for k in range(1, 6)}
check(len(texts) >= 2, "seed: different seeds give different texts", f"{len(texts)} distinct of 5")
c1 = chat(temperature=1, seed=77, max_tokens=24).choices[0].message.content
c2 = chat(temperature=1, seed=77, max_tokens=24).choices[0].message.content
check(c1 == c2, "seed: chat, same seed, same answer", short(c1, 60))

# ---- max_tokens -> length
for mode in ("completions", "chat"):
    r = cmpl(max_tokens=5) if mode == "completions" else chat(max_tokens=5)
    check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5,
          f"{mode} max_tokens 5: finish 'length', completion_tokens 5",
          f"{r.choices[0].finish_reason}, {r.usage.completion_tokens}")
    full = ca.text if mode == "completions" else cd.message.content
    got = r.choices[0].text if mode == "completions" else r.choices[0].message.content
    check(full.startswith(got), f"{mode} max_tokens 5: a prefix of the 32-token answer", repr(got))

# ---- n = 2
r = cmpl(n=2)
idx = sorted(c.index for c in r.choices)
check(idx == [0, 1] and all(c.text == ca.text for c in r.choices),
      "completions n=2 at temperature 0: two choices (index 0, 1), each the n=1 text", f"indexes {idx}")
check(r.usage.completion_tokens == 2 * a.usage.completion_tokens and r.usage.prompt_tokens == a.usage.prompt_tokens,
      "completions n=2: usage counts both choices", f"completion_tokens {r.usage.completion_tokens} = 2 x "
      f"{a.usage.completion_tokens}, prompt_tokens {r.usage.prompt_tokens}")
r = chat(n=2, temperature=1, seed=5, max_tokens=16)
check(sorted(c.index for c in r.choices) == [0, 1] and all(isinstance(c.message.content, str) for c in r.choices),
      "chat n=2 at temperature 1: two choices", " | ".join(short(c.message.content, 30) for c in r.choices))
per = {}
for c in chat(n=2, stream=True):
    for ch in c.choices:
        per[ch.index] = per.get(ch.index, "") + (ch.delta.content or "")
check(sorted(per) == [0, 1] and per[0] == per[1] == cd.message.content,
      "chat n=2 streamed at temperature 0: chunks for index 0 and 1, each the n=1 answer", f"{sorted(per)}")

# ---- logprobs
r = chat(logprobs=True, top_logprobs=3, max_tokens=12)
lp = r.choices[0].logprobs
content = lp.content if lp else None
ok = content is not None and len(content) == r.usage.completion_tokens
check(ok, "chat logprobs: one entry per completion token", f"{len(content) if content else None} entries, "
      f"{r.usage.completion_tokens} tokens")
if content:
    bad = []
    for i, e in enumerate(content):
        tops = e.top_logprobs
        if not (math.isfinite(e.logprob) and e.logprob <= 0):
            bad.append(f"{i}: logprob {e.logprob}")
        elif len(tops) != 3:
            bad.append(f"{i}: {len(tops)} top_logprobs")
        elif any(tops[j].logprob < tops[j + 1].logprob for j in range(2)):
            bad.append(f"{i}: top_logprobs not sorted")
        elif abs(tops[0].logprob - e.logprob) > 1e-4 or tops[0].token != e.token:
            bad.append(f"{i}: greedy token {e.token!r} {e.logprob} is not the top one {tops[0].token!r} {tops[0].logprob}")
        elif sum(math.exp(t.logprob) for t in tops) > 1 + 1e-4:
            bad.append(f"{i}: top probabilities sum over 1")
    check(not bad, "chat logprobs: finite, <= 0, 3 sorted alternatives, greedy choice is the top one",
          "; ".join(bad[:3]) or f"first {content[0].token!r} {content[0].logprob:.4f}")
    if "\ufffd" not in r.choices[0].message.content:
        joined = "".join(e.token for e in content)
        check(joined.strip() == r.choices[0].message.content.strip(),
              "chat logprobs: tokens spell the answer", f"{short(joined, 60)!r}")
r = cmpl(logprobs=3, max_tokens=12)
lp = r.choices[0].logprobs
n = r.usage.completion_tokens
ok = (lp is not None and len(lp.tokens or []) == n and len(lp.token_logprobs or []) == n
      and len(lp.top_logprobs or []) == n)
check(ok, "completions logprobs=3: tokens, token_logprobs, top_logprobs, one per token",
      f"{n} tokens" if ok else f"{lp}")
if ok:
    bad = [i for i in range(n) if not (1 <= len(lp.top_logprobs[i]) <= 3 and
                                        abs(max(lp.top_logprobs[i].values()) - lp.token_logprobs[i]) < 1e-4
                                        and lp.token_logprobs[i] <= 0)]
    check(not bad, "completions logprobs: greedy token's logprob is the best of its top 3", f"bad at {bad[:5]}")
    if "\ufffd" not in r.choices[0].text:
        check("".join(lp.tokens) == r.choices[0].text, "completions logprobs: tokens spell the text",
              short("".join(lp.tokens), 60))

# ---- /tokenize, /detokenize, a prompt given as token ids
st, tk, raw = post("/tokenize", {"model": MODEL, "prompt": PROMPT})
toks = tk.get("tokens") if st == 200 and isinstance(tk, dict) else None
check(isinstance(toks, list) and len(toks) == ntok and all(isinstance(t, int) for t in toks),
      "/tokenize: a list of ids, as many as counted", short(raw, 100))
if toks:
    st, dt, raw = post("/detokenize", {"model": MODEL, "tokens": toks})
    back = dt.get("prompt") if st == 200 and isinstance(dt, dict) else None
    check(back == PROMPT, "/detokenize(/tokenize(prompt)) gives the prompt back", short(raw, 100))
    r = cmpl(prompt=toks)
    check(r.choices[0].text == ca.text and r.usage.prompt_tokens == a.usage.prompt_tokens,
          "completions with the prompt as /tokenize's ids: same text and prompt_tokens as the string",
          f"prompt_tokens {r.usage.prompt_tokens} vs {a.usage.prompt_tokens}" + (
              "" if r.choices[0].text == ca.text else f"; {short(r.choices[0].text, 60)!r} vs {short(ca.text, 60)!r}"))

# ---- models
ms = client.models.list().data
ids = [m.id for m in ms]
check(MODEL in ids, "/v1/models lists the model", f"{ids}")
mml = [getattr(m, "max_model_len", None) for m in ms if m.id == MODEL]
check(mml == [CTX], "/v1/models: max_model_len is the context", f"{mml} vs {CTX}")

# ---- errors through the client
def expect_error(name, cls, fn):
    try:
        fn()
    except cls as e:
        return check(True, name, f"{cls.__name__} {e.status_code}: {short(e.message, 90)}")
    except Exception as e:  # another error class is a failure too
        return check(False, name, f"{type(e).__name__}: {short(str(e), 120)}")
    return check(False, name, "the request succeeded")


expect_error("BadRequestError: temperature -1", openai.BadRequestError, lambda: chat(temperature=-1))
expect_error("BadRequestError: max_tokens -5", openai.BadRequestError, lambda: cmpl(max_tokens=-5))
expect_error("BadRequestError: no messages", openai.BadRequestError, lambda: chat(messages=[]))
expect_error("BadRequestError: top_p 2, streamed", openai.BadRequestError, lambda: list(chat(top_p=2, stream=True)))
expect_error("BadRequestError: prompt longer than the context", openai.BadRequestError,
             lambda: cmpl(prompt="Once upon a time " * CTX))
expect_error("NotFoundError: unknown model", openai.NotFoundError, lambda: chat(model="no-such-model"))

KEY = "sk-energon-test-0123456789"
srv = Server("keyed", "--api-key", KEY, "--model-name", MODEL)
try:
    good = openai_client(srv.url, key=KEY)
    r = good.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=32)
    check(r.choices[0].message.content == cd.message.content, "--api-key: the right key is served",
          "same answer as the main server")
    expect_error("AuthenticationError: wrong key", openai.AuthenticationError,
                 lambda: openai_client(srv.url, key="sk-wrong").chat.completions.create(
                     model=MODEL, messages=MSGS, max_tokens=4))
    expect_error("AuthenticationError: wrong key on /v1/models", openai.AuthenticationError,
                 lambda: openai_client(srv.url, key="sk-wrong").models.list())
finally:
    srv.stop()
kf = os.path.join(TMP, "api_key.txt")
with open(kf, "w") as f:
    f.write(KEY + "\n")
srv = Server("keyfile", "--api-key-file", kf)
try:
    ids = [m.id for m in openai_client(srv.url, key=KEY).models.list().data]
    check(len(ids) == 1 and ids[0], "--api-key-file: the key from the file is accepted; default model name",
          f"{ids}")
    expect_error("AuthenticationError: wrong key (--api-key-file)", openai.AuthenticationError,
                 lambda: openai_client(srv.url, key=KEY + "x").completions.create(
                     model=ids[0], prompt=PROMPT, max_tokens=4))
finally:
    srv.stop()

# ---- a full queue answers 429: one running, one waiting, the rest refused
srv = Server("queue1", "--max-queue", "1", "--max-batch", "1", "--model-name", MODEL)
try:
    results = []
    lock = threading.Lock()
    long_n = CTX - tokenize(PROMPT) - 8
    start = threading.Barrier(12)

    def one():
        c = openai_client(srv.url)
        start.wait()
        try:
            r = c.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=long_n)
            res = ("ok", r.usage.completion_tokens)
        except openai.RateLimitError as e:
            res = ("429", e.status_code)
        except Exception as e:
            res = ("other", f"{type(e).__name__}: {short(str(e), 80)}")
        with lock:
            results.append(res)

    ts = [threading.Thread(target=one) for _ in range(12)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    kinds = [k for k, _ in results]
    n429, nok = kinds.count("429"), kinds.count("ok")
    check(n429 >= 1 and nok >= 1 and nok + n429 == 12,
          "RateLimitError: --max-queue 1 --max-batch 1 under 12 concurrent long requests",
          f"{nok} served, {n429} RateLimitError (429), others {[v for k, v in results if k == 'other']}")
    r = openai_client(srv.url).completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=32)
    check(r.choices[0].text == ca.text, "after the 429s the server answers normally", "same text")
finally:
    srv.stop()

finish("api_openai")
