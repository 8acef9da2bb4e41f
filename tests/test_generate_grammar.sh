#!/usr/bin/env bash
# test_generate_grammar.sh ENERGON - `energon generate --grammar FILE`
# (docs/grammar.md) checked by Python, independently of the matcher:
#  - stories260K, a phone-number grammar, 12 seeds at temperature 1: every
#    output matches the same pattern as a Python regular expression, and
#    ends with finish "stop" (nothing more can follow);
#  - stories260K, JSON objects of bounded size, 12 seeds: every output ends
#    by the grammar (finish "stop") and is a JSON object for json.loads;
#  - SmolLM2-135M-Instruct (its GGUF, when install-deps fetched it), --chat
#    at temperature 0 with json.gbnf: the answer parses with json.loads;
#  - bad input: a missing grammar file, a syntax error (file and line
#    named), --grammar with --ignore-eos: exit 2.
set -u
ENERGON=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$ROOT/.venv-test/bin/python
[ -x "$PY" ] || PY=python3
MODEL=$ROOT/../shared/models/stories260K/stories260K.gguf
[ -f "$MODEL" ] || MODEL=/work/shared/models/stories260K/stories260K.gguf
if [ ! -f "$MODEL" ]; then
    echo "SKIP: $MODEL missing (the shared models folder)"
    exit 77
fi
SMOL=${ENERGON_SMOLLM2_GGUF:-${ENERGON_CACHE:-$HOME/.cache/energon}/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
T=$(mktemp -d /tmp/en_gen_grammar_XXXXXX)
trap 'rm -rf "$T"' EXIT
export OMP_WAIT_POLICY=passive
"$PY" - "$ENERGON" "$ROOT" "$T" "$MODEL" "$SMOL" <<'PYEOF'
import json, os, re, subprocess, sys

energon, root, T, model, smol = sys.argv[1:6]
fails = []


def check(cond, what):
    print(("  ok   " if cond else "  FAIL ") + what)
    if not cond:
        fails.append(what)


def gen(*args, model_path=model):
    p = subprocess.run([energon, "generate", "--model", model_path, "--json", "--threads", "1",
                        *args], capture_output=True, text=True)
    out = None
    if p.returncode == 0:
        out = json.loads(p.stdout.strip().splitlines()[-1])
    return p.returncode, out, p.stderr


phone = os.path.join(T, "phone.gbnf")
with open(phone, "w") as f:
    f.write('# a phone number\nroot ::= "+" [1-9] [0-9]{0,2} " " ( [0-9]{3} "-" ){1,2} [0-9]{4}\n')
pat = re.compile(r"\+[1-9][0-9]{0,2} ([0-9]{3}-){1,2}[0-9]{4}")
got = []
for seed in range(1, 13):
    rc, out, err = gen("--grammar", phone, "--prompt", "Call me at", "--seed", str(seed),
                       "--max-tokens", "64")
    got.append((rc, out and out["text"], out and out["finish_reason"]))
ok = [g for g in got if g[0] == 0 and g[2] == "stop" and pat.fullmatch(g[1])]
check(len(ok) == 12, "phone grammar: %d of 12 outputs match the pattern, finish stop: %s"
      % (len(ok), [g[1] for g in got[:4]]))

# JSON objects of bounded size (strings of at most 12 characters, at most 4
# members, flat arrays of at most 3 values), so that a tiny model's
# sampled output ends within --max-tokens
obj = os.path.join(T, "object.gbnf")
with open(obj, "w") as f:
    f.write(r"""root   ::= "{" ws ( "}" | member ( "," ws member ){0,3} "}" )
member ::= string ws ":" ws value ws
value  ::= string | number | "true" | "false" | "null" | array
array  ::= "[" ws ( "]" | scalar ws ( "," ws scalar ws ){0,2} "]" )
scalar ::= string | number
string ::= "\"" char{0,12} "\""
char   ::= [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
number ::= "-"? ( "0" | [1-9] [0-9]{0,5} ) ( "." [0-9]{1,3} )? ( [eE] [-+]? [0-9]{1,2} )?
ws     ::= " "?
""")
n_stop = n_obj = 0
texts = []
for seed in range(1, 13):
    rc, out, err = gen("--grammar", obj, "--prompt", "Once upon a time", "--seed", str(seed),
                       "--max-tokens", "400")
    if rc != 0:
        check(False, "object grammar seed %d: exit %d: %s" % (seed, rc, err[-300:]))
        continue
    text = out["text"]
    texts.append(text)
    if out["finish_reason"] == "stop":
        n_stop += 1
        try:
            n_obj += isinstance(json.loads(text), dict)
        except ValueError as e:
            print("    not JSON: %r (%s)" % (text, e))
check(n_stop == 12 and n_obj == 12, "object grammar: %d of 12 outputs ended by the grammar, "
      "%d of them JSON objects for json.loads: %r" % (n_stop, n_obj, texts[:2]))

if os.path.exists(smol):
    rc, out, err = gen("--grammar", os.path.join(root, "examples/grammars/json.gbnf"), "--chat",
                       "--prompt", "Describe a cat as a JSON object with fields name, age and "
                       "color.", "--temperature", "0", "--max-tokens", "120", model_path=smol)
    val = None
    try:
        val = json.loads(out["text"]) if out else None
    except ValueError:
        pass
    check(rc == 0 and out["finish_reason"] == "stop" and isinstance(val, dict),
          "SmolLM2 --chat with json.gbnf: a JSON object: %r" % (out and out["text"]))
else:
    print("  skip SmolLM2-135M-Instruct: %s missing (scripts/get-smollm2)" % smol)

def bad(args, want, what):
    p = subprocess.run([energon, "generate", "--model", model, "--prompt", "x", *args],
                       capture_output=True, text=True)
    check(p.returncode == 2 and all(w in p.stderr for w in want),
          "%s: exit %d: %s" % (what, p.returncode, p.stderr.strip()[-200:]))

bad(["--grammar", os.path.join(T, "nope.gbnf")], ["--grammar", "nope.gbnf"], "missing grammar")
broken = os.path.join(T, "broken.gbnf")
with open(broken, "w") as f:
    f.write('root ::= "a" b\n\nb ::= [z-a]\n')
bad(["--grammar", broken], ["broken.gbnf", "line 3", "below its start"], "grammar syntax error")
bad(["--grammar", phone, "--ignore-eos"], ["--ignore-eos"], "--grammar with --ignore-eos")

print("test_generate_grammar: %d failure(s)" % len(fails))
sys.exit(1 if fails else 0)
PYEOF
