"""response_format.py - constrained answers through the official openai client
(issue 16, docs/grammar.md "The server"), checked by Python alone:

  - {"type": "json_object"}: 12 chat requests at temperature 1 (seeds 1..12)
    sent at once, half streamed, beside 6 unconstrained temperature-0
    requests: each answer that ended by itself ("stop") is a JSON object for
    json.loads; one cut by max_tokens ("length") is a JSON prefix (closing
    what is open makes json.loads accept it); the streamed deltas join to
    the same kind of text; the unconstrained answers equal their answers
    alone (constrained neighbours change nothing for them);
  - {"type": "json_schema"}: 12 schemas (schemas.py: nested objects,
    arrays, enums, anyOf, oneOf, $refs and a recursive one, formats, const,
    optional properties) x 4
    seeds, half streamed, all at once beside unconstrained requests: every
    answer ends by itself and validates with the jsonschema package;
    unsupported keywords are 400s naming them;
  - {"type": "grammar", "grammar": TEXT} through extra_body: 8 answers match
    the same pattern as a Python regular expression and end with "stop";
    a completions request takes it too;
  - {"type": "regex", "regex": RE}: 6 answers, half streamed, fullmatch RE
    in Python's re and end with "stop";
  - a schema with string patterns and integer ranges is one of the 12;
  - bad input is a 400 naming the field (response_format, .type, .grammar
    with the grammar's line, .regex, .json_schema), and the server keeps
    answering.
"""
import json
import re
import threading

from common import MODEL, check, finish, note, openai_client, post, short


def json_prefix_ok(text):
    """True when text is a prefix of some JSON value: close what is open
    (a string, an escape, a number, a key waiting for its value, arrays and
    objects) and let json.loads judge."""
    stack, in_str, esc, uni = [], False, False, -1
    for ch in text:
        if in_str:
            if uni >= 0:
                if ch not in "0123456789abcdefABCDEF":
                    return False
                uni = uni + 1 if uni < 3 else -1
            elif esc:
                esc = False
                if ch == "u":
                    uni = 0
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            stack.append(ch)
        elif ch in "]}":
            if not stack:
                return False
            stack.pop()
    tail = ""
    if in_str:
        tail += "0" * (4 - uni) if uni >= 0 else ("n" if esc else "")
        tail += '"'
    body = (text + tail).rstrip()
    if body and body[-1] in "-+.eE":
        body += "0"
    if body.endswith(":"):
        body += "null"
    elif body.endswith(","):
        body += '"k":null' if stack and stack[-1] == "{" else "null"
    elif stack and stack[-1] == "{" and body.endswith('"'):
        # a key just closed (or a value): try both
        for extra in (":null", ""):
            if _closes(body + extra, stack):
                return True
        return False
    return _closes(body, stack)


def _closes(body, stack):
    closing = "".join("]" if c == "[" else "}" for c in reversed(stack))
    try:
        json.loads(body + closing)
        return True
    except ValueError:
        return False


client = openai_client()
results = {}


def ask(i, kw, stream):
    try:
        if stream:
            parts, fin = [], None
            for ch in client.chat.completions.create(stream=True, **kw):
                if ch.choices:
                    parts.append(ch.choices[0].delta.content or "")
                    fin = ch.choices[0].finish_reason or fin
            results[i] = ("".join(parts), fin)
        else:
            r = client.chat.completions.create(**kw)
            results[i] = (r.choices[0].message.content, r.choices[0].finish_reason)
    except Exception as ex:  # noqa: BLE001 - reported as a failed check
        results[i] = (None, repr(ex))


QUESTIONS = ["Describe a cat as JSON.", "A JSON object for a car, please.", "Give me JSON.",
             "Once upon a time"]
plain = [dict(model=MODEL, messages=[{"role": "user", "content": "Tell a story %d" % k}],
              temperature=0, max_tokens=24) for k in range(6)]
alone = []
for kw in plain:
    ask("alone", kw, False)
    alone.append(results["alone"])
jobs = []
for s in range(12):
    jobs.append(("j%d" % s, dict(model=MODEL, temperature=1, seed=s + 1, max_tokens=96,
                                 messages=[{"role": "user", "content": QUESTIONS[s % 4]}],
                                 response_format={"type": "json_object"}), s % 2 == 1))
for k, kw in enumerate(plain):
    jobs.append(("p%d" % k, kw, k % 2 == 1))
th = [threading.Thread(target=ask, args=job) for job in jobs]
for t in th:
    t.start()
for t in th:
    t.join()
n_stop = n_obj = n_len = n_prefix = 0
bad = []
for s in range(12):
    text, fin = results["j%d" % s]
    if fin == "stop":
        n_stop += 1
        try:
            ok = isinstance(json.loads(text), dict)
        except (ValueError, TypeError):
            ok = False
        n_obj += ok
    elif fin == "length":
        n_len += 1
        ok = text.startswith("{") and json_prefix_ok(text)
        n_prefix += ok
    else:
        ok = False
    if not ok:
        bad.append((text, fin))
check(n_obj == n_stop and n_prefix == n_len and n_stop + n_len == 12,
      "json_object: 12 answers (half streamed): %d ended by themselves, all JSON objects: %d; "
      "%d cut by max_tokens, all JSON prefixes: %d" % (n_stop, n_obj, n_len, n_prefix),
      short(bad, 300))
note("json_object answers: %s" % short([results["j%d" % s][0] for s in range(3)], 240))
same = sum(results["p%d" % k] == alone[k] for k in range(6))
check(same == 6, "6 unconstrained temperature-0 answers beside them equal their answers alone "
      "(%d/6)" % same)

# a grammar through extra_body
GRAMMAR = 'root ::= "ID-" [A-Z]{2} [0-9]{3,5} ( "/" [a-z]{1,6} )?'
pat = re.compile(r"ID-[A-Z]{2}[0-9]{3,5}(/[a-z]{1,6})?")
got = []
for s in range(8):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give an id."}], temperature=1,
        seed=s, max_tokens=40, extra_body={"response_format": {"type": "grammar",
                                                                "grammar": GRAMMAR}})
    got.append((r.choices[0].message.content, r.choices[0].finish_reason))
ok = [g for g in got if g[1] == "stop" and pat.fullmatch(g[0] or "")]
check(len(ok) == 8, "grammar (extra_body): %d of 8 answers match the pattern and ended by "
      "themselves" % len(ok), short(got, 300))
c = client.completions.create(model=MODEL, prompt="The code is", max_tokens=40, temperature=1,
                              seed=3, extra_body={"response_format": {"type": "grammar",
                                                                      "grammar": GRAMMAR}})
check(pat.fullmatch(c.choices[0].text or "") is not None and c.choices[0].finish_reason == "stop",
      "completions with a grammar: %r" % c.choices[0].text)

# a regular expression through extra_body
REGEX = r"(yes|no): [a-z]{2,8}( [0-9]{1,3})?"
got = []
for s in range(6):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Answer."}], temperature=1,
              seed=s, max_tokens=40, extra_body={"response_format": {"type": "regex",
                                                                      "regex": REGEX}})
    if s % 2:
        text, fin = "", None
        for ch in client.chat.completions.create(stream=True, **kw):
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                fin = ch.choices[0].finish_reason or fin
        got.append((text, fin))
    else:
        r = client.chat.completions.create(**kw)
        got.append((r.choices[0].message.content, r.choices[0].finish_reason))
ok = [g for g in got if g[1] == "stop" and re.fullmatch(REGEX, g[0] or "")]
check(len(ok) == 6, "regex (extra_body): %d of 6 answers, half streamed, match it in Python's re "
      "and ended by themselves" % len(ok), short(got, 300))

# JSON Schema: 10 schemas x 4 seeds, half streamed, at once, beside the
# unconstrained requests again; every answer must end by itself and
# validate (jsonschema; formats uuid and email checked, date shapes only)
import jsonschema  # noqa: E402 - installed by scripts/install-deps

import schemas  # noqa: E402
from schemas import RECURSIVE  # noqa: E402

# string pattern and integer ranges (models/regex.c, json_schema.c)
PATTERN = {"type": "object", "properties": {
    "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"},
    "qty": {"type": "integer", "minimum": 1, "maximum": 250},
    "temp": {"type": "integer", "exclusiveMinimum": -40, "exclusiveMaximum": 60},
    "tag": {"type": "string", "pattern": "^(red|green|blue)[0-9]?$"}},
    "required": ["code", "qty", "temp", "tag"], "additionalProperties": False}
SCHEMAS = schemas.SCHEMAS + [RECURSIVE, PATTERN]
N_SCHEMA = 4 * len(SCHEMAS)

checker = schemas.checker()
jobs = []
for i, sch in enumerate(SCHEMAS):
    for seed in range(4):
        rf = {"type": "json_schema", "json_schema": {"name": "s%d" % i, "schema": sch,
                                                     "strict": True}}
        jobs.append(("s%d_%d" % (i, seed), dict(
            model=MODEL, temperature=1, seed=seed, max_tokens=200, response_format=rf,
            messages=[{"role": "user", "content": "Answer in JSON."}]), seed % 2 == 1))
for k, kw in enumerate(plain):
    jobs.append(("q%d" % k, kw, k % 2 == 0))
th = [threading.Thread(target=ask, args=job) for job in jobs]
for t in th:
    t.start()
for t in th:
    t.join()
valid, bad = 0, []
for i, sch in enumerate(SCHEMAS):
    for seed in range(4):
        text, fin = results["s%d_%d" % (i, seed)]
        try:
            jsonschema.validate(json.loads(text), sch, format_checker=checker)
            ok = fin == "stop"
        except Exception as ex:  # noqa: BLE001 - the failure is the finding
            ok = False
            text = "%s (%s)" % (text, short(str(ex), 80))
        valid += ok
        if not ok:
            bad.append((i, text, fin))
check(valid == N_SCHEMA, "json_schema: %d of %d answers (12 schemas x 4, half streamed) ended by "
      "themselves and validate with jsonschema" % (valid, N_SCHEMA), short(bad, 400))
note("json_schema answers: %s" % short([results["s%d_0" % i][0] for i in (0, 4, 6)], 300))
same = sum(results["q%d" % k] == alone[k] for k in range(6))
check(same == 6, "unconstrained temperature-0 answers beside 48 schema requests equal alone "
      "(%d/6)" % same)

# bad input
msgs = [{"role": "user", "content": "x"}]
for what, sch, needle in [("patternProperties", {"type": "object", "patternProperties": {
                              "^a": {"type": "integer"}}}, "'patternProperties'"),
                          ("multipleOf", {"type": "integer", "multipleOf": 3}, "'multipleOf'"),
                          ("a wrong type", {"type": "strin"}, "'strin'"),
                          ("false", False, "accepts nothing"),
                          ("an empty language (lengths)", {"type": "string", "minLength": 5,
                                                           "maxLength": 2}, "below minLength"),
                          ("an empty language (enum)", {"enum": []}, "non-empty"),
                          ("an empty language (items)", {"type": "array", "minItems": 3,
                                                         "maxItems": 1}, "below minItems"),
                          ("a dangling $ref", {"$ref": "#/$defs/x"}, "names no definition"),
                          ("a pattern with a lookahead", {"type": "string",
                                                          "pattern": "a(?=b)"}, "position 1"),
                          ("an empty integer range", {"type": "integer", "minimum": 5,
                                                      "maximum": 1}, "minimum"),
                          ("a number bound", {"type": "number", "minimum": 2.5}, "minimum")]:
    st, js, raw = post("/v1/chat/completions", {"model": MODEL, "messages": msgs,
                                                "response_format": {"type": "json_schema",
                                                "json_schema": {"name": "x", "schema": sch}}})
    err = (js or {}).get("error") or {}
    check(st == 400 and err.get("param") == "response_format.json_schema.schema" and
          needle in (err.get("message") or ""),
          "json_schema with %s -> 400 naming it" % what, "%s %s" % (st, short(raw, 200)))
BAD = [("not an object", "text", "response_format"),
       ("missing type", {}, "response_format.type"),
       ("unknown type", {"type": "yaml"}, "response_format.type"),
       ("json_schema without schema", {"type": "json_schema", "json_schema": {"name": "a"}},
        "response_format.json_schema.schema"),
       ("grammar missing", {"type": "grammar"}, "response_format.grammar"),
       ("grammar not a string", {"type": "grammar", "grammar": 5}, "response_format.grammar"),
       ("grammar syntax", {"type": "grammar", "grammar": 'root ::= "a"\nroot ::= "b"'},
        "response_format.grammar"),
       ("grammar undefined rule", {"type": "grammar", "grammar": "root ::= x"},
        "response_format.grammar"),
       ("regex missing", {"type": "regex"}, "response_format.regex"),
       ("regex with a backreference", {"type": "regex", "regex": "(a)\\1"},
        "response_format.regex")]
for what, rf, param in BAD:
    st, js, raw = post("/v1/chat/completions", {"model": MODEL, "messages": msgs,
                                                "response_format": rf})
    err = (js or {}).get("error") or {}
    check(st == 400 and err.get("param") == param, "%s -> 400 naming %s" % (what, param),
          "%s %s" % (st, short(raw, 200)))
st, js, raw = post("/v1/chat/completions", {"model": MODEL, "messages": msgs, "response_format":
                                            {"type": "grammar", "grammar": 'root ::= "a"\nroot ::= "b"'}})
check("line 2" in (((js or {}).get("error") or {}).get("message") or ""),
      "a grammar error names its line", short(raw, 200))
r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0,
                                   response_format={"type": "text"})
check(r.choices[0].finish_reason in ("stop", "length"), "the server still answers (type text)")
finish("response_format")
