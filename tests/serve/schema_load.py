"""schema_load.py - many structured answers in one batch (issue 16): N
requests (default 200; EN_SCHEMA_LOAD_N) over the 10 schemas of schemas.py,
N/10 seeds each at temperature 1, half streamed, sent 48 at a time through
the official openai client together with 8 unconstrained temperature-0
requests. Every constrained answer must end by itself ("stop") and
validate with the jsonschema package; each unconstrained answer must equal
the same request sent alone beforehand.

Runs against the main server of test_serve (EN_URL, EN_MODEL_NAME) or any
other: tests/test_schema_load.sh points it at SmolLM2-135M-Instruct.
"""
import concurrent.futures as cf
import json
import os
import time

import jsonschema

from common import ASAN, MODEL, check, finish, note, openai_client, short
from schemas import SCHEMAS, checker

N = int(os.environ.get("EN_SCHEMA_LOAD_N", "60" if ASAN else "200"))
PLAIN = ["Tell me a story about a dog.", "What is the capital of France?",
         "Once upon a time", "Write a haiku about rain.", "Name three colours.",
         "How are you today?", "Lily found a shiny stone.", "Count to five."]


def ask(client, kw, stream):
    if not stream:
        r = client.chat.completions.create(**kw)
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, fin = "", None
    for ch in client.chat.completions.create(stream=True, **kw):
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            fin = ch.choices[0].finish_reason or fin
    return text, fin


def main():
    client = openai_client()
    plain = [dict(model=MODEL, temperature=0, max_tokens=32,
                  messages=[{"role": "user", "content": q}]) for q in PLAIN]
    alone = [ask(client, kw, False)[0] for kw in plain]
    jobs = []
    for k in range(N):
        i, seed = k % len(SCHEMAS), k // len(SCHEMAS)
        rf = {"type": "json_schema", "json_schema": {"name": "s%d" % i, "schema": SCHEMAS[i],
                                                     "strict": True}}
        jobs.append((("s", i, seed), dict(
            model=MODEL, temperature=1, seed=seed, max_tokens=200, response_format=rf,
            messages=[{"role": "user", "content": "Answer in JSON."}]), k % 2 == 1))
    # the unconstrained requests go in among the first constrained ones
    for q, kw in enumerate(plain):
        jobs.insert(4 + 5 * q, (("q", q), kw, q % 2 == 0))
    t0 = time.time()
    with cf.ThreadPoolExecutor(48) as pool:
        futs = {pool.submit(ask, client, kw, st): key for key, kw, st in jobs}
        res = {}
        for f in cf.as_completed(futs):
            try:
                res[futs[f]] = f.result()
            except Exception as e:  # noqa: BLE001 - the failure is the finding
                res[futs[f]] = (f"error: {e}", None)
    secs = time.time() - t0
    fmt = checker()
    valid, bad = 0, []
    for key, kw, st in jobs:
        if key[0] != "s":
            continue
        text, fin = res[key]
        try:
            jsonschema.validate(json.loads(text), SCHEMAS[key[1]], format_checker=fmt)
            ok = fin == "stop"
        except Exception as ex:  # noqa: BLE001
            ok = False
            text = f"{text} ({short(str(ex), 80)})"
        valid += ok
        if not ok:
            bad.append((key, text, fin))
    check(valid == N, f"{valid} of {N} schema answers (10 schemas, half streamed, 48 at a time) "
          f"ended by themselves and validate with jsonschema", short(bad, 400))
    same = [res[("q", q)][0] == alone[q] for q in range(len(PLAIN))]
    check(all(same), f"unconstrained temperature-0 answers in the batch equal alone "
          f"({sum(same)}/{len(same)})", short([res[("q", q)][0] for q in range(8)
                                               if not same[q]], 300))
    note(f"{N} schema requests + {len(PLAIN)} plain in {secs:.1f} s; "
         f"e.g. {short([res[('s', i, 0)][0] for i in (0, 2, 4)], 240)}")
    return finish("schema_load")


if __name__ == "__main__":
    raise SystemExit(main())
