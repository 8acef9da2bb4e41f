#!/usr/bin/env python3
"""Byte strings for test_grammar's JSON check, each labelled by Python's json
module (the independent reference): 1 when json.loads accepts the UTF-8
text (NaN / Infinity refused, as RFC 8259 does), else 0. Valid documents
are random values serialised with random whitespace and escapes; invalid
ones are mutations of valid ones (a byte deleted, inserted, replaced or
doubled, a cut, a swapped pair) and a few hand-written edge cases.

Writes tests/fixtures/grammar/json_cases.txt: one case a line,
"LABEL HEX" (the bytes in hex, since cases hold line breaks).

    python3 tests/gen/gen_grammar_json_cases.py
"""
import json
import os
import random

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "grammar", "json_cases.txt")
rng = random.Random(16)

WS = [" ", "\t", "\n", "\r"]
CHARS = ["a", "Z", "0", " ", "é", "ß", "中", "😀", "\u2028", "\x7f", '"', "\\", "/", "\n",
         "\t", "\x01", "\ud7ff", "\ue000", "\uffff"]


def ws():
    return "".join(rng.choice(WS) for _ in range(rng.choice([0, 0, 0, 1, 2])))


def rand_string():
    s = "".join(rng.choice(CHARS) for _ in range(rng.randint(0, 6)))
    out = ['"']
    for ch in s:
        r = rng.random()
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif ord(ch) < 0x20:
            out.append(rng.choice(["\\u%04x" % ord(ch), "\\u%04X" % ord(ch)]) if ch not in
                       "\n\t" else rng.choice(["\\n" if ch == "\n" else "\\t",
                                               "\\u%04x" % ord(ch)]))
        elif r < 0.15 and ord(ch) < 0x10000:
            out.append("\\u%04x" % ord(ch))
        elif r < 0.2 and ch == "/":
            out.append("\\/")
        else:
            out.append(ch)
    if rng.random() < 0.1:
        out.append(rng.choice(["\\b", "\\f", "\\r", "\\ud83d\\ude00", "\\ud800"]))
    out.append('"')
    return "".join(out)


def rand_number():
    s = rng.choice(["", "-"]) + rng.choice(["0", str(rng.randint(1, 10 ** rng.randint(1, 12)))])
    if rng.random() < 0.4:
        s += "." + str(rng.randint(0, 10 ** rng.randint(1, 6)))
    if rng.random() < 0.3:
        s += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 400))
    return s


def rand_value(depth=0):
    r = rng.random()
    if depth < 4 and r < 0.25:
        items = [rand_value(depth + 1) for _ in range(rng.randint(0, 4))]
        if not items:
            return "[" + ws() + "]"
        return "[" + ws() + ("," + ws()).join(v + ws() for v in items) + "]"
    if depth < 4 and r < 0.5:
        mem = [rand_string() + ws() + ":" + ws() + rand_value(depth + 1) + ws()
               for _ in range(rng.randint(0, 4))]
        if not mem:
            return "{" + ws() + "}"
        return "{" + ws() + ("," + ws()).join(mem) + "}"
    if r < 0.7:
        return rand_string()
    if r < 0.9:
        return rand_number()
    return rng.choice(["true", "false", "null"])


def label(b):
    try:
        text = b.decode("utf-8")
    except UnicodeDecodeError:
        return 0

    def no_const(c):
        raise ValueError(c)
    try:
        json.loads(text, parse_constant=no_const)
        return 1
    except (ValueError, RecursionError):
        return 0


MUT_BYTES = b'{}[]",:\\ 0123456789.eE+-tfnulrsa\x00\x1f\x7f\xc3\xa9\xe4\xb8\xad\xff\xf0\xed\xa0\x80'


def mutate(b):
    if not b:
        return b"x"
    i = rng.randrange(len(b))
    k = rng.randrange(6)
    if k == 0:
        return b[:i] + b[i + 1:]
    if k == 1:
        return b[:i] + bytes([rng.choice(MUT_BYTES)]) + b[i:]
    if k == 2:
        return b[:i] + bytes([rng.choice(MUT_BYTES)]) + b[i + 1:]
    if k == 3:
        return b[:i] + b[i:i + 1] + b[i:]
    if k == 4:
        return b[:i]
    j = rng.randrange(len(b))
    lst = bytearray(b)
    lst[i], lst[j] = lst[j], lst[i]
    return bytes(lst)


HAND = ["", " ", "0", "-0", "01", "1.", ".5", "1e", "1e+", "-", "+1", "1.5e-3", "NaN",
        "Infinity", "-Infinity", "true", "tru", "nulll", "[]", "[,]", "[1,]", "{}",
        '{"a":}', '{"a" 1}', '{"a":1,}', '{,}', '"\\x41"', '"\\u12"', '"\\u12G4"',
        '"a\tb"', '"\\ud800"', '"\u2028"', "\ufeff{}", "[1 2]", '{"a":1 "b":2}',
        '" \\" "', '"\\\\"', "[[[[[[]]]]]]", "[[[[[[]]]]]", " \n\t\r[ ] \r\n", "\x0b[]"]


def main():
    cases = []
    for h in HAND:
        cases.append(h.encode("utf-8"))
    valid = [(ws() + rand_value() + ws()).encode("utf-8") for _ in range(700)]
    cases += valid
    for v in valid:
        m = v
        for _ in range(rng.randint(1, 3)):
            m = mutate(m)
        cases.append(m)
    cases.append(b'"\xc3"')       # a cut code point
    cases.append(b'"\xed\xa0\x80"')  # an encoded surrogate
    cases.append(b'"\xc0\xaf"')   # overlong
    cases.append(b'"\xf4\x90\x80\x80"')  # past U+10FFFF
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    n1 = 0
    with open(OUT, "w") as f:
        for c in cases:
            lab = label(c)
            n1 += lab
            f.write("%d %s\n" % (lab, c.hex()))
    print("wrote %s: %d cases, %d valid" % (OUT, len(cases), n1))


if __name__ == "__main__":
    main()
