"""chat_cli.py - `energon chat` with piped input (issue 5, "What it must
show" 8). Two questions on stdin give two answers on stdout; each must be
the API's temperature-0 answer to the same conversation (the second
question carries the first exchange as history), in order. Both against
the running server (--url) and in-process (--model DIR).
"""
import re
import subprocess

from common import ENERGON, MODEL, MODEL_DIR, SLOW, URL, check, finish, note, post, short

Q = ["Where did Pip find the blue lantern?", "What was the name of the moth?"]

hlp = subprocess.run([ENERGON, "chat", "--help"], capture_output=True, text=True)
help_text = hlp.stdout + hlp.stderr
opts = []
if "--temperature" in help_text:
    opts += ["--temperature", "0"]
MAXT = 48
if "--max-tokens" in help_text:
    opts += ["--max-tokens", str(MAXT)]
else:
    m = re.search(r"--max-tokens\D*default (\d+)", help_text)
    MAXT = int(m.group(1)) if m else MAXT
    note(f"energon chat has no --max-tokens; comparing with max_tokens {MAXT}")


def api(messages):
    st, js, raw = post("/v1/chat/completions", {"model": MODEL, "messages": messages, "temperature": 0,
                                                "max_tokens": MAXT})
    if st != 200:
        raise RuntimeError(f"API answered {st}: {short(raw)}")
    return js["choices"][0]["message"]["content"]


a1 = api([{"role": "user", "content": Q[0]}])
a2 = api([{"role": "user", "content": Q[0]}, {"role": "assistant", "content": a1},
          {"role": "user", "content": Q[1]}])
note(f"API answers: {short(a1, 60)!r} / {short(a2, 60)!r}")

for how, args in (("--url", ["--url", URL]), ("--model (in-process)", ["--model", MODEL_DIR, "--threads", "1"])):
    try:
        p = subprocess.run([ENERGON, "chat", *args, *opts], input="\n".join(Q) + "\n", capture_output=True,
                           text=True, timeout=120 * SLOW)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, err, rc = (e.stdout or b"").decode(errors="replace"), (e.stderr or b"").decode(errors="replace"), "timeout"
    i1 = out.find(a1.strip())
    i2 = out.find(a2.strip(), i1 + len(a1.strip())) if i1 >= 0 else -1
    check(rc == 0, f"energon chat {how}: exits 0 at the end of the piped input", f"exit {rc} {short(err, 200)}")
    check(i1 >= 0, f"energon chat {how}: first answer equals the API's", f"at {i1}" if i1 >= 0 else
          f"stdout {short(out, 200)!r}")
    check(i2 >= 0, f"energon chat {how}: second answer (with the first exchange as history) equals the API's",
          f"at {i2}" if i2 >= 0 else f"stdout {short(out, 300)!r}, want {short(a2, 80)!r}")

finish("chat_cli")
