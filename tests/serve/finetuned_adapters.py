"""Adapters written by `energon finetune`, served together (issue 14).

test_serve.sh trains LoRA adapters on the test's base model (EN_MODEL_DIR)
with `energon finetune`, each on a different text of examples/company, and
starts a server (EN_URL, pid EN_SERVER_PID) with the base as EN_MODEL_NAME,
two of them by name (--adapter NAME=RUN_DIR), --adapter-dir EN_FT_DIR and
--max-lora-rank 64. Checks:
  - the third adapter, trained while the server runs, was handed over by
    `energon finetune --serve-url` (EN_FT_HANDED set): it is listed;
  - 32 concurrent temperature-0 requests spread over the base and the three
    adapters (8 prompts x 4 models): each answer's text and token count
    equal `energon generate` (with --adapter RUN_DIR for an adapter) on the
    same prompt; the adapters answer differently from the base;
  - the engine ran them in fewer steps than any schedule that never mixes
    two models in one step could (that needs, per model, as many steps as
    its longest answer);
  - refusals: an adapter of another base (400 naming the mismatch), a rank
    over --max-lora-rank (400 naming it), a corrupt adapter_model.safetensors
    (400), after which the server still answers;
  - resident memory: a large adapter (rank 64 on all seven targets) raises
    the server's VmRSS by at least half its size while loaded, and after
    ten load / request / unload cycles (after three to warm up) the VmRSS is
    back where it was within a quarter of the adapter's size, where keeping
    each would cost forty quarters; /metrics adapters loaded and draining
    come back too.
"""
import concurrent.futures as cf
import json
import os
import shutil
import subprocess
import threading
import time

from common import (ASAN, ENERGON, MODEL, MODEL_DIR, SLOW, check, finish, http_json, metric, metrics,
                    note, post, proc_status)

FT = os.environ["EN_FT_DIR"]
# tests/gpu/finetuned_adapters.sh: the server runs on this device; generate
# is run on it too, and VmRSS says nothing of adapters in GPU memory
DEVICE = os.environ.get("EN_DEVICE", "cpu")
HANDED = os.environ.get("EN_FT_HANDED", "")
DEPTS = ["handbook", "policies", "products"]  # the run directories FT/dept-NAME
MAXT = 24
PROMPTS = ["Once upon a time", "The new employee asked", "Our products are", "Lily and Ben went",
           "Every Monday the team", "The little dog saw", "Please remember that", "One day, Tom"]


def models():
    st, js, _ = http_json("GET", "/v1/models")
    return {m["id"]: m for m in (js or {}).get("data", [])} if st == 200 else {}


def complete(model, prompt):
    st, js, raw = post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": MAXT,
                                           "temperature": 0})
    if st != 200:
        return ("error", st, raw[:200])
    c = js["choices"][0]
    return (c["text"], js["usage"]["completion_tokens"], js["usage"]["prompt_tokens"])


def generate(run_dir, prompt):
    cmd = [ENERGON, "generate", "--model", MODEL_DIR, "--prompt", prompt, "--max-tokens",
           str(MAXT), "--temperature", "0", "--json", "--threads", "1", "--device", DEVICE]
    if run_dir:
        cmd += ["--adapter", run_dir]
    env = dict(os.environ)
    if os.environ.get("EN_GEN_LD"):  # a device machine's unpacked libraries
        env["LD_LIBRARY_PATH"] = os.environ["EN_GEN_LD"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300 * SLOW, env=env)
    if p.returncode != 0:
        return ("error", p.returncode, p.stderr[-200:])
    js = json.loads(p.stdout)
    return (js["text"], len(js["ids"]), js["prompt_tokens"])


def rss():
    return proc_status()["VmRSS"]


# ---- the third adapter arrives while serving
third = "dept-" + DEPTS[2]
if HANDED:
    check(third in models() and models()[third].get("parent") == MODEL,
          f"energon finetune --serve-url handed {third} to the server", f"{sorted(models())}")
else:  # the hand-off failed (test_serve.sh said why): load it here to go on
    st, js, raw = post("/v1/adapters", {"name": third, "path": third})
    note(f"POST /v1/adapters {third}: {st} {raw[:160]!r}")
ms = models()
check(all(f"dept-{d}" in ms and ms[f"dept-{d}"]["parent"] == MODEL for d in DEPTS),
      "/v1/models lists the three fine-tuned adapters with the base as parent", f"{sorted(ms)}")

# ---- 32 requests over the four models at once
names = [MODEL] + [f"dept-{d}" for d in DEPTS]
runs = {MODEL: None, **{f"dept-{d}": os.path.join(FT, f"dept-{d}") for d in DEPTS}}
reqs = [(m, p) for p in PROMPTS for m in names]
served = [None] * len(reqs)
gate = threading.Barrier(len(reqs))


def run_one(i):
    gate.wait()
    served[i] = complete(*reqs[i])


m0 = metrics()
threads = [threading.Thread(target=run_one, args=(i,)) for i in range(len(reqs))]
for t in threads:
    t.start()
for t in threads:
    t.join()
m1 = metrics()
with cf.ThreadPoolExecutor(2) as ex:
    ref = list(ex.map(lambda r: generate(runs[r[0]], r[1]), reqs))
same = [i for i in range(len(reqs)) if served[i][0] != "error" and served[i] == ref[i]]
bad = [i for i in range(len(reqs)) if i not in same]
check(len(same) == len(reqs),
      f"{len(reqs)} concurrent requests over the base and 3 adapters: each equals energon "
      f"generate (--adapter RUN_DIR)", f"{len(same)}/{len(reqs)} identical" +
      "".join(f"; {reqs[i][0]} {reqs[i][1]!r}: served {served[i]!r} vs {ref[i]!r}"
              for i in bad[:2]))
moved = sum(1 for i, (m, _) in enumerate(reqs) if m != MODEL and
            served[i][0] != served[i - names.index(m)][0])
check(moved >= 3 * len(PROMPTS) // 2, "the adapters answer differently from the base",
      f"{moved}/{3 * len(PROMPTS)} adapter answers differ from the base's on the same prompt")
steps = metric(m1, "energon_engine_steps_total") - metric(m0, "energon_engine_steps_total")
unmixed = sum(max(served[i][1] for i, r in enumerate(reqs) if r[0] == m and
                  served[i][0] != "error") for m in names)
check(steps < unmixed, "the four models' requests shared engine steps",
      f"{steps:.0f} steps; a schedule never mixing models needs at least {unmixed}")
note(f"answers of {sum(s[1] for s in served if s[0] != 'error')} tokens in {steps:.0f} steps")

# ---- refusals
foreign = os.path.join(FT, "foreign")
shutil.copytree(os.environ["EN_FOREIGN_ADAPTER"], foreign)
corrupt = os.path.join(FT, "corrupt")
shutil.copytree(os.path.join(FT, "dept-handbook"), corrupt,
                ignore=shutil.ignore_patterns("checkpoints"))
sf = os.path.join(corrupt, "adapter_model.safetensors")
with open(sf, "r+b") as f:
    f.truncate(os.path.getsize(sf) // 2)
for body, want, word, what in (
        ({"name": "foreign", "path": "foreign"}, 400, "another base model", "an adapter of another base"),
        ({"name": "over", "path": "over"}, 400, "rank", "rank 96 over --max-lora-rank 64"),
        ({"name": "corrupt", "path": "corrupt"}, 400, "safetensors", "a truncated safetensors")):
    st, js, raw = post("/v1/adapters", body)
    msg = ((js or {}).get("error") or {}).get("message", raw[:200])
    check(st == want and word.lower() in str(msg).lower(), f"POST /v1/adapters with {what}: {want}",
          f"{st} {msg}")
    if what.startswith("an adapter of"):
        note(f"mismatch message: {msg}")
again = complete("dept-handbook", PROMPTS[0])
check(again == served[1], "after the refusals the server still answers as before", f"{again!r}")

# ---- resident memory over load / unload cycles
ADAPTER_BYTES = os.path.getsize(os.path.join(FT, "big", "adapter_model.safetensors"))
mk = metrics()
base_loaded = metric(mk, "energon_lora_adapters_loaded")


def cycle(i):
    st, _, raw = post("/v1/adapters", {"name": f"big{i}", "path": "big"})
    during = rss()
    ans = complete(f"big{i}", PROMPTS[i % len(PROMPTS)])
    st2, _, _ = http_json("DELETE", f"/v1/adapters/big{i}")
    return st, st2, ans, during, raw


for i in range(3):  # warm: the connection threads' malloc arenas, the request path
    cycle(100 + i)
time.sleep(0.2)
r0 = rss()
results = [cycle(i) for i in range(1, 11)]
deadline = time.time() + 10 * SLOW
while metric(metrics(), "energon_lora_adapters_draining") != 0 and time.time() < deadline:
    time.sleep(0.05)
time.sleep(0.2)
r1 = rss()
peak = max(r[3] for r in results)
ok = all(r[0] == 200 and r[1] == 200 and r[2][0] != "error" for r in results)
check(ok, "ten load / request / unload cycles of a rank-64 adapter on all targets succeed",
      f"{[r[:2] for r in results if r[0] != 200 or r[1] != 200][:2]}")
grown, left, kb = peak - r0, r1 - r0, ADAPTER_BYTES // 1024
if DEVICE != "cpu":
    note(f"VmRSS not checked: the adapters live in {DEVICE} memory ({r0} kB before, {r1} after)")
else:
    check(grown >= kb / 2, "VmRSS while the large adapter is loaded shows it",
          f"+{grown} kB over {r0} kB; adapter file {kb} kB")
    if ASAN:  # AddressSanitizer keeps freed memory in quarantine: RSS cannot come back
        note(f"VmRSS after the ten unloads not checked under ASan ({r0} kB before, {r1} after)")
    else:
        check(left <= kb / 4, "VmRSS after the ten unloads is back where it was before them "
              "(within a quarter of the adapter; ten kept would be forty)",
              f"{r0} kB before, {r1} kB after (adapter {kb} kB)")
me = metrics()
check(metric(me, "energon_lora_adapters_loaded") == base_loaded and
      metric(me, "energon_lora_adapters_draining") == 0,
      "/metrics: adapters loaded back to before the cycles, none draining",
      f"loaded {metric(me, 'energon_lora_adapters_loaded')} (was {base_loaded})")
finish("finetuned_adapters")
