#!/usr/bin/env python3
"""Write the tokenizer fixtures read by tests/test_tokenizer.c.

For each SentencePiece model below (files in ../shared/models), this encodes a
set of test strings with the Python `sentencepiece` package and records the
ids and the decoded text, plus decode-only cases (hand-picked id sequences
that exercise the dummy-prefix space, control ids and byte pieces that do or
do not form whole UTF-8 characters, and seeded random id sequences), the
special ids and a few id -> piece lookups.

Output: tests/fixtures/tokenizer_<name>.json, one JSON object:
    format "energon-tokenizer-fixture", version 1, sentencepiece (version
    used), model (path under shared/), model_sha256, n_vocab, bos, eos, unk,
    pad, pieces [[id, piece]...], encode [{name, text, ids, decoded}...],
    decode [{name, ids, decoded}...].
Encode ids are without bos (add_bos = 0).

Usage: python3 tests/gen/gen_tokenizer_fixture.py [--shared ../shared]
Pinned to sentencepiece 0.2.3 (pip); pass --any-version to override.
"""
import argparse
import hashlib
import json
import os
import random
import sys

import sentencepiece as spm

PINNED = "0.2.3"
FORMAT = "energon-tokenizer-fixture"
VERSION = 1

MODELS = [
    ("llama2", "models/llama2-tokenizer/tokenizer.model"),
    ("tok512", "models/stories260K/tok512.model"),
]

# Test strings, written for energon. Each covers one area; together they hit
# every branch of the encoder we care about (byte fallback, whitespace
# handling, scripts with and without vocabulary coverage).
TEXTS = [
    ("english", "Energon streams tokens one at a time, and the decoder must never "
                "split a character in half. Isn't that neat?"),
    ("whitespace", "  two leading spaces,\ttab\t\tand tabs,\nnew line,\n\n\nthree of them,"
                   "   runs   of    spaces, and trailing spaces   "),
    ("leading_newline", "\n\tindented after a newline"),
    ("single_leading_space", " x"),
    ("only_whitespace", " \t\n \r\n"),
    ("empty", ""),
    ("digits", "Pi is 3.14159, the year 2024, call +1 (555) 010-9999, eps 1e-5, mask 0x1F, "
               "1,000,000.50 and 007"),
    ("emoji", "Emoji: \U0001F600 \U0001F44D\U0001F3FD "
              "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 "
              "\U0001F3F3\uFE0F\u200D\U0001F308 \u2764\uFE0F "
              "\U0001F9D1\U0001F3FF\u200D\U0001F680 flags \U0001F1EF\U0001F1F5\U0001F1EB\U0001F1F7!"),
    ("cjk", "中文分词测试：今天天气很好。日本語のテキストもあります。"
            "한국어 문장도 있습니다. 漢字かなカナ混じり"),
    ("rtl", "العربية: مرحبا بالعالم. עברית: שלום עולם. "
            "mixed \u200Fright-to-left\u200E marks and ٣٤٥ digits"),
    ("accents_composed", "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m "
                         "se\u00f1or \u0141\u00f3d\u017a gar\u00e7on"),
    ("accents_decomposed", "cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030Angstro\u0308m "
                           "sen\u0303or a\u0323\u0302 stacked"),
    ("scripts", "Привет, мир! Γειά σου Κόσμε! नमस्ते दुनिया สวัสดีชาวโลก "
                "Բարեւ აბგ ሰላም"),
    ("byte_fallback", "rare: \U00013000 \U00012000 \uA66E \U0001D518\U0001D52B "
                      "\U0002000B bell\u0007 bom\uFEFF zwsp\u200B nbsp\u00A0 "
                      "private\uE000 \U0010FFFD end"),
    ("literal_specials", "<s> </s> <unk> <pad> <0x41> \u2581 \u2047 not control ids"),
    ("replacement_char", "a literal \uFFFD replacement char"),
    ("code", "int main(void) {\n\tfor (int i = 0; i < 10; i++) x[i] *= 2; // done\n"
             "\treturn 0;\n}\n"),
    ("punctuation", "\u201cQuotes\u201d, \u2018single\u2019, em\u2014dash, "
                    "ellipsis\u2026 \u00bfQu\u00e9? \u00a1S\u00ed! (a) [b] {c} <d> ~@#$%^&*_+=|\\/"),
]


def piece_id(sp, piece):
    """Id of a piece string, or None when the model does not have it."""
    i = sp.piece_to_id(piece)
    return i if sp.id_to_piece(i) == piece else None


def byte_id(sp, b):
    return piece_id(sp, "<0x%02X>" % b)


def decode_cases(sp):
    """Hand-picked and seeded random id sequences for the decode checks."""
    bos, eos, unk = sp.bos_id(), sp.eos_id(), sp.unk_id()
    sp_ws = piece_id(sp, "\u2581")
    words = [i for i in (piece_id(sp, w) for w in
             ["\u2581Hello", "\u2581the", "\u2581a", "a", "\u2581world", "\u2581x", "."])
             if i is not None]
    hello = words[0]
    cases = []

    def add(name, ids):
        if all(i is not None for i in ids):
            cases.append((name, ids))

    B = lambda *bs: [byte_id(sp, b) for b in bs]  # noqa: E731
    add("bos_word_eos", [bos, hello, eos])
    add("space_piece_first", [sp_ws, hello])
    add("space_pieces", [sp_ws, sp_ws, hello, sp_ws])
    add("controls_around_space", [bos, bos, sp_ws, bos, hello, eos, hello])
    add("unk_first", [unk, hello, unk])
    add("byte_first_then_word", B(0x41) + [hello])
    add("newline_byte_then_word", B(0x0A) + [hello])
    add("euro_complete", B(0xE2, 0x82, 0xAC) + [hello])
    add("euro_truncated", B(0xE2, 0x82))
    add("emoji_split_by_word", B(0xF0, 0x9F) + [hello] + B(0x98, 0x80))
    add("emoji_complete", B(0xF0, 0x9F, 0x98, 0x80))
    add("stray_continuations", B(0x80, 0xBF) + [hello])
    add("lead_then_ascii_byte", B(0xE2, 0x41, 0x82, 0xAC))
    add("surrogate_bytes", B(0xED, 0xA0, 0x80) + [hello])
    add("above_max_bytes", B(0xF4, 0x90, 0x80, 0x80))
    add("overlong_bytes", B(0xC0, 0xAF, 0xE0, 0x80, 0xAF))
    add("invalid_ff", B(0xFF, 0xFE) + [hello])
    add("trailing_lead_byte", [hello] + B(0xC3))
    add("bytes_after_eos", [hello, eos] + B(0xC3, 0xA9))
    add("ws_then_bytes", [sp_ws] + B(0xE4, 0xB8, 0xAD) + [hello])

    # Seeded random sequences: a mix of byte pieces (biased to UTF-8 lead and
    # continuation bytes), control ids, the space piece and ordinary pieces.
    rng = random.Random(20240601)
    n = sp.vocab_size()
    ctrl = [i for i in (bos, eos) if i >= 0]
    for k in range(12):
        ids = []
        for _ in range(rng.randint(8, 60)):
            r = rng.random()
            if r < 0.35:
                b = rng.choice([rng.randint(0x80, 0xBF), rng.randint(0xC2, 0xF4),
                                rng.randint(0x00, 0x7F), rng.randint(0xC0, 0xFF)])
                ids.append(byte_id(sp, b))
            elif r < 0.42 and ctrl:
                ids.append(rng.choice(ctrl))
            elif r < 0.50 and sp_ws is not None:
                ids.append(sp_ws)
            else:
                ids.append(rng.randrange(n))
        add("random_%02d" % k, [i for i in ids if i is not None])
    return cases


def build(shared, name, rel):
    path = os.path.join(shared, rel)
    sp = spm.SentencePieceProcessor(model_file=path)
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    n = sp.vocab_size()
    probe_ids = sorted({0, 1, 2, 3, 13, 16, 258, 259, 260, n // 2, n - 2, n - 1}
                       | {i for i in (piece_id(sp, "\u2581"), piece_id(sp, "\u2581the"),
                                      piece_id(sp, "\u2581Hello")) if i is not None})
    enc = []
    for tname, text in TEXTS:
        ids = sp.encode(text)
        enc.append({"name": tname, "text": text, "ids": ids, "decoded": sp.decode(ids)})
    dec = [{"name": dname, "ids": ids, "decoded": sp.decode(ids)}
           for dname, ids in decode_cases(sp)]
    return {
        "format": FORMAT,
        "version": VERSION,
        "generator": "tests/gen/gen_tokenizer_fixture.py",
        "sentencepiece": spm.__version__,
        "model": rel,
        "model_sha256": sha,
        "n_vocab": n,
        "bos": sp.bos_id(),
        "eos": sp.eos_id(),
        "unk": sp.unk_id(),
        "pad": sp.pad_id(),
        "pieces": [[i, sp.id_to_piece(i)] for i in probe_ids],
        "encode": enc,
        "decode": dec,
    }


def dump(obj):
    """JSON with one case per line block: readable diffs, compact id lists."""
    d = lambda x: json.dumps(x, ensure_ascii=False)  # noqa: E731
    out = ["{"]
    keys = [k for k in obj if k not in ("pieces", "encode", "decode")]
    for k in keys:
        out.append(" %s: %s," % (d(k), d(obj[k])))
    out.append(' "pieces": [%s],' % ", ".join(d(p) for p in obj["pieces"]))
    for sect in ("encode", "decode"):
        out.append(" %s: [" % d(sect))
        rows = []
        for case in obj[sect]:
            fields = ",\n   ".join("%s: %s" % (d(k), d(v)) for k, v in case.items())
            rows.append("  {%s}" % fields)
        out.append(",\n".join(rows))
        out.append(" ]" + ("," if sect == "encode" else ""))
    out.append("}")
    return "\n".join(out) + "\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=os.path.join(root, "..", "shared"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures"))
    ap.add_argument("--any-version", action="store_true")
    args = ap.parse_args()
    if spm.__version__ != PINNED and not args.any_version:
        sys.exit("sentencepiece %s found, fixtures are pinned to %s (--any-version overrides)"
                 % (spm.__version__, PINNED))
    os.makedirs(args.out, exist_ok=True)
    for name, rel in MODELS:
        obj = build(args.shared, name, rel)
        json.loads(dump(obj))  # the writer must round-trip
        assert json.loads(dump(obj)) == json.loads(json.dumps(obj))
        out = os.path.join(args.out, "tokenizer_%s.json" % name)
        with open(out, "w", encoding="utf-8") as f:
            f.write(dump(obj))
        print("wrote %s (%d encode, %d decode cases)" % (out, len(obj["encode"]),
                                                         len(obj["decode"])))


if __name__ == "__main__":
    main()
