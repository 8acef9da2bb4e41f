#!/usr/bin/env python3
"""Labelled cases for test_regex (models/regex.c and json_schema.c's
pattern and number ranges), each label from an independent reference:

- patterns: for each regular expression, strings labelled by Python's re:
  "full" = re.fullmatch (the whole text is a sentence), "search" =
  re.search (JSON Schema's unanchored `pattern`, ECMA-262's
  RegExp.prototype.test). The strings are hand-written examples, their
  mutations (a character deleted, inserted, replaced or doubled) and
  random strings, all over an alphabet that avoids the characters where
  Python's re and ECMA-262 disagree: '\\r', U+2028, U+2029 ('.' excludes
  them in ECMA-262 only) and non-ASCII spaces (\\s). Python runs with
  re.ASCII (ECMA-262's \\d \\w \\s are ASCII, but for \\s's non-ASCII
  spaces, left out) and with each final '$' written '\\Z' (Python's '$'
  also matches before a final newline; ECMA-262's does not).
- schemas: JSON texts labelled by the jsonschema package
  (Draft202012Validator): string patterns, integer ranges and sign-bounded
  numbers. A pattern case where jsonschema's re.search (Unicode, '$'
  before a final newline) and the ECMA-262 reading above disagree is
  left out.

Writes tests/fixtures/grammar/regex_cases.json:
  {"patterns": [{"pattern": P, "cases": [[TEXT, JSON_INNER, FULL, SEARCH], ...]}],
   "schemas": [{"schema": S, "cases": [[JSON_TEXT, VALID], ...]}]}
JSON_INNER is json.dumps(TEXT, ensure_ascii=False) without its quotes:
the text as a JSON string holds it.

    .venv-test/bin/python tests/gen/gen_regex_cases.py
"""
import json
import os
import random
import re

import jsonschema

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "grammar", "regex_cases.json")
rng = random.Random(16)

ALPHABET = ["a", "b", "c", "x", "y", "z", "A", "Z", "0", "1", "5", "9", " ", "\n", "\t", "\x01",
            "\x00", '"', "\\", "/", "-", ".", "@", "é", "中", "😀", "_", "+", "(", ")"]

# (pattern, hand-written strings: matches and near misses)
PATTERNS = [
    (r"^[a-z]+$", ["abc", "a", "", "aBc", "abc1", "z"]),
    (r"^\d{3}-\d{4}$", ["555-1234", "55-1234", "555-12345", "5551234", "abc-defg"]),
    (r"^[A-Z][a-z]{1,5}( [A-Z][a-z]{1,5})?$", ["Ada", "Ada Lovela", "A", "Ada lovelace",
                                              "Adaline Byron", "Ab Cd"]),
    (r"abc", ["abc", "xabcx", "ab", "aabbcc", "ABC", "abcabc"]),
    (r"^(?:\+1 )?\(\d{3}\) \d{3}-\d{4}$", ["(555) 123-4567", "+1 (555) 123-4567",
                                          "+1(555) 123-4567", "(55) 123-4567"]),
    (r"^[^@\s]+@[^@\s]+\.[a-z]{2,4}$", ["a@b.cd", "ab@cd.efgh", "a@b.c", "a b@c.de",
                                       "a@@b.cd", "é@中.com"]),
    (r"colou?r", ["color", "colour", "colouur", "a colour b", "colr"]),
    (r"^(cat|dog|bird)s?$", ["cat", "cats", "dogs", "birds", "bir", "catss", "cow"]),
    (r"^a*b+c?$", ["b", "abc", "aaabbb", "ac", "abcc", "bc"]),
    (r"x{2,3}y{0,2}$", ["xx", "xxxyy", "xxxxyy", "xyy", "axxy", "xxyyy"]),
    (r"^[0-9a-fA-F]{4,8}$", ["beef", "DEADBEEF", "abc", "123456789", "12g4"]),
    (r"^\w+\s\w+$", ["hello world", "a_1\tb", "hello  world", "héllo world", "a\nb"]),
    (r"^.{2,4}$", ["ab", "abcd", "a", "abcde", "a\nb", "中😀", "\x01\x00"]),
    (r"^[^a-c]*$", ["", "xyz", "xay", "中é", '"\\']),
    (r"^(ab|a)(bc|c)$", ["abc", "abbc", "ac", "ab", "abcc"]),
    (r"^(a?b?)*c$", ["c", "abc", "bac", "aabbc", "abca", "d"]),
    (r"^((a|b)?c?){2,3}$", ["", "ac", "acbc", "acbcac", "acbcacbc", "cccc", "aaa"]),
    (r"^\S+$", ["abc", "a b", "é中", "", "a\tb"]),
    (r"^\D\W$", ["a.", "a1", "1.", " é", "\n\n"]),
    (r'"quoted"', ['"quoted"', 'say "quoted" it', "quoted", '"quoted']),
    (r"\\", ["\\", "a\\b", "ab", "\\\\"]),
    (r"^[\n\t ]+$", ["\n", " \t\n", "", "a", "\x01"]),
    (r"^é+ü?中$", ["é中", "ééü中", "e中", "éü"]),
    (r"^\u00e9\x41$", ["éA", "é", "eA", "éAA"]),
    (r"^[\u0000-\u001f]$", ["\x00", "\x01", "\n", "\x1f", " ", "\x00\x01"]),
    (r'^[^"\\]*$', ["abc", 'a"b', "a\\b", "", "\n\x01"]),
    (r"^(?:[a-z]+\.)*[a-z]+$", ["a.b.c", "abc", "a..b", ".a", "a.", "ab.cd"]),
    (r"^a|b$", ["a", "ax", "xb", "b", "xa", "bx", "ab"]),
    (r"^$", ["", "a", "\n"]),
    (r"", ["", "a", "\n\x00"]),
    (r"^[-+]?(0|[1-9][0-9]*)(\.[0-9]+)?$", ["0", "-1.5", "+10", "01", "1.", ".5", "12.50"]),
    (r"a.c", ["abc", "a\nc", "a中c", "xa c", "ac"]),
    (r"^a{0}b$", ["b", "ab", ""]),
    (r"^(|x)y+?$", ["y", "xy", "xyyy", "x", "xxy"]),
    (r"\.\/\-\$", ["./-$", "a./-$b", "./-", "x/-$"]),
    (r"^[\w.-]+$", ["a.b-c_d", "a b", "", "-.", "é"]),
    (r"😀{2}", ["😀😀", "a😀😀b", "😀", "😀a😀"]),
    (r"^(a|b|c){1,3}?x*?$", ["a", "abcx", "abcd", "xx", "cbaxx"]),
    (r"^[a\-z]+$", ["a-z", "b", "az-", "-"]),
    (r"^[\d\s]{2}[^\d\s]$", ["1 a", "  1", "\t9x", "12"]),
]


def ecma(p):
    """p for Python with ECMA-262's '$': each '$' outside a class -> \\Z."""
    out, i, cls = [], 0, False
    while i < len(p):
        ch = p[i]
        if ch == "\\":
            out.append(p[i:i + 2])
            i += 2
            continue
        if ch == "[" and not cls:
            cls = True
        elif ch == "]" and cls:
            cls = False
        out.append("\\Z" if ch == "$" and not cls else ch)
        i += 1
    return "".join(out)


def mutate(s):
    k = rng.randrange(4)
    i = rng.randint(0, len(s))
    c = rng.choice(ALPHABET)
    if k == 0 and s:
        i = min(i, len(s) - 1)
        return s[:i] + s[i + 1:]
    if k == 1:
        return s[:i] + c + s[i:]
    if k == 2 and s:
        i = min(i, len(s) - 1)
        return s[:i] + c + s[i + 1:]
    if s:
        i = min(i, len(s) - 1)
        return s[:i] + s[i] + s[i:]
    return c


def rand_string(alpha):
    return "".join(rng.choice(alpha) for _ in range(rng.randint(0, 6)))


def strings_for(pattern, hand):
    lits = [ch for ch in pattern if ch not in "\\^$()[]{}|*+?." and ch != "\r"]
    alpha = ALPHABET + lits * 2
    out = list(hand)
    for h in hand:
        for _ in range(4):
            out.append(mutate(h))
        out.append(rand_string(alpha) + h + rand_string(alpha))
    for _ in range(12):
        out.append(rand_string(alpha))
    seen, res = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            res.append(s)
    return res


def pattern_cases():
    res = []
    for pattern, hand in PATTERNS:
        rx = re.compile(ecma(pattern), re.ASCII)
        cases = []
        for s in strings_for(pattern, hand):
            inner = json.dumps(s, ensure_ascii=False)[1:-1]
            cases.append([s, inner, int(rx.fullmatch(s) is not None),
                          int(rx.search(s) is not None)])
        full = sum(c[2] for c in cases)
        assert 0 < full < len(cases) or pattern in ("",), (pattern, full)
        res.append({"pattern": pattern, "cases": cases})
    return res


INT_SCHEMAS = [
    {"minimum": 0, "maximum": 100},
    {"minimum": -5, "maximum": 5},
    {"minimum": 1},
    {"maximum": -1},
    {"exclusiveMinimum": 0, "exclusiveMaximum": 10},
    {"minimum": 1234, "maximum": 98765},
    {"minimum": -1000, "maximum": -10},
    {"minimum": -99, "maximum": 1000000},
    {"minimum": 0.5, "maximum": 10.5},
    {"exclusiveMinimum": -3.5, "maximum": 7.2},
    {"minimum": 7, "maximum": 7},
    {"minimum": 999999999999990},
    {"maximum": -9999999999999990},
    {"minimum": 10, "exclusiveMinimum": 12, "maximum": 300, "exclusiveMaximum": 250},
]

NUM_SCHEMAS = [
    {"minimum": 0},
    {"exclusiveMinimum": 0},
    {"maximum": 0},
    {"exclusiveMaximum": 0},
    {"minimum": 0, "maximum": 0.0},
]

NUM_VALUES = [0, 0.0, -0.0, 1, -1, 0.5, -0.5, 1e-05, -1e-05, 1.5e+20, -2.5e+30, 3, 123.25,
              -0.001, 0.00000001, 2.0, "1", None]


def int_values(s):
    pts = [0, 1, -1, 2, -2, 100, -100, 10 ** 15, -(10 ** 15), 9999999999999999,
           -9999999999999999, 5.5, "5"]
    for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if k in s:
            b = int(s[k])
            pts += [b - 2, b - 1, b, b + 1, b + 2]
    lo = max([int(s.get("minimum", -10 ** 6)), int(s.get("exclusiveMinimum", -10 ** 6))])
    hi = min([int(s.get("maximum", 10 ** 6)), int(s.get("exclusiveMaximum", 10 ** 6))])
    if lo <= hi:
        pts += [rng.randint(lo, hi) for _ in range(6)]
    pts += [rng.randint(-2000, 2000) for _ in range(4)]
    return [p for p in pts if not isinstance(p, int) or abs(p) < 10 ** 16]


PATTERN_SCHEMAS = [r"^[a-z]+$", r"^\d{3}-\d{4}$", r"colou?r", r'^[^"\\]*$', r"a.c",
                   r"^[\n\t ]+$", r"\\", r'"quoted"', r"^(cat|dog|bird)s?$", r""]


def schema_cases(pats):
    res = []
    v = jsonschema.Draft202012Validator
    by_pattern = {p["pattern"]: p for p in pats}
    dropped = 0
    for p in PATTERN_SCHEMAS:
        schema = {"type": "string", "pattern": p}
        cases = []
        for s, _inner, _full, search in by_pattern[p]["cases"]:
            ok = int(v(schema).is_valid(s))
            if ok != search:
                dropped += 1  # Python's re and ECMA-262 disagree here
                continue
            cases.append([json.dumps(s, ensure_ascii=False), ok])
        cases.append([json.dumps(5), 0])
        res.append({"schema": schema, "cases": cases})
    for b in INT_SCHEMAS:
        schema = dict(b, type="integer")
        vals = int_values(b)
        cases = [[json.dumps(x), int(v(schema).is_valid(x))] for x in vals]
        res.append({"schema": schema, "cases": cases})
    for b in NUM_SCHEMAS:
        schema = dict(b, type="number")
        cases = [[json.dumps(x), int(v(schema).is_valid(x))] for x in NUM_VALUES]
        res.append({"schema": schema, "cases": cases})
    obj = {"type": "object", "required": ["id", "code"], "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 999},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "score": {"type": ["number", "null"], "exclusiveMinimum": 0}}}
    vals = [{"id": 1, "code": "ABC"}, {"id": 999, "code": "XYZ", "score": 0.5},
            {"id": 0, "code": "ABC"}, {"id": 1000, "code": "ABC"}, {"id": 5, "code": "AB"},
            {"id": 5, "code": "abc"}, {"id": 5, "code": "ABC", "score": 0},
            {"id": 5, "code": "ABC", "score": None}, {"id": -5, "code": "ABC"}]
    res.append({"schema": obj, "cases": [[json.dumps(x, ensure_ascii=False),
                                          int(v(obj).is_valid(x))] for x in vals]})
    return res, dropped


def main():
    pats = pattern_cases()
    schemas, dropped = schema_cases(pats)
    with open(OUT, "w") as f:  # one case a line
        for key, groups in (("patterns", pats), ("schemas", schemas)):
            f.write('{"%s": [\n' % key if key == "patterns" else '], "%s": [\n' % key)
            for gi, g in enumerate(groups):
                head = {k: g[k] for k in g if k != "cases"}
                f.write(json.dumps(head)[:-1] + ', "cases": [\n')
                f.write(",\n".join(json.dumps(c) for c in g["cases"]))
                f.write("\n]}%s\n" % ("," if gi + 1 < len(groups) else ""))
        f.write("]}\n")
    with open(OUT) as f:
        assert json.load(f) == {"patterns": pats, "schemas": schemas}
    n = sum(len(p["cases"]) for p in pats)
    m = sum(len(s["cases"]) for s in schemas)
    print("%s: %d patterns, %d strings (%d full matches, %d search matches); %d schemas, "
          "%d values (%d valid; %d dropped where Python's re and ECMA-262 disagree)" %
          (OUT, len(pats), n, sum(c[2] for p in pats for c in p["cases"]),
           sum(c[3] for p in pats for c in p["cases"]), len(schemas), m,
           sum(c[1] for s in schemas for c in s["cases"]), dropped))


if __name__ == "__main__":
    main()
