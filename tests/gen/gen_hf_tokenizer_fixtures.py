#!/usr/bin/env python3
"""Write the fixtures read by tests/test_tokenizer_hf.c.

Expected ids, offsets and decoded text all come from the Python `tokenizers`
package (pinned to 0.23.3). Three groups of tokenizer.json files:
  * the real ones in ../shared/models (SmolLM2, Qwen3, tiny-random-gpt2),
    referenced by path, never copied;
  * small BPE models trained here on a slice of sotu.txt (vocab ~300), then
    given each normalizer / pre-tokenizer / decoder / option under test by
    editing their JSON (stored inline, gzip'd);
  * broken files for the error paths, with the status and message text the C
    code must produce.

Output: tests/fixtures/hf_tokenizer/cases.json.gz, one JSON object:
    format "energon-hf-tokenizer-fixture", version 1, tokenizers_version,
    tokenizers {name: {"shared": path-under-shared} or {"json": text}},
    cases [{tok, text_hex, add, ids, offsets (bytes; post-processor tokens:
           0 before the text, len after), check_offsets, dec_hex,
           dec_skip_hex, lossless}],
    hashed [{tok, file, bytes, add, count, fnv64 (hex, ids as uint32 LE),
            head (first 64 ids)}],
    llamacpp [{tok, inp, out}]  (.out files that equal tokenizers' ids),
    errors [{name, json_hex, status, msg}].
Texts are stored as hex UTF-8 (they hold U+0000). Also writes a seed corpus
for tests/fuzz/fuzz_tokenizer_json.c into tests/fuzz/corpus/tokenizer_json/.

Usage: python3 tests/gen/gen_hf_tokenizer_fixtures.py [--shared ../shared]
"""
import argparse
import gzip
import json
import os
import struct
import sys

import tokenizers
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

PINNED = "0.23.3"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TEXTS = [
    "Hello world! I'm here,  DON'T   stop 12345 6789012 3.14159 ñandú",
    "café cafe\u0301 Ångström A\u030angstro\u0308m naïve",
    "🎉👨‍👩‍👧 🇺🇸🇯🇵 👍🏽 ❤️",
    "日本語のテキスト 中文字符 한국어 مرحبا بالعالم Привет",
    "a  b   c\t\td\n\n\ne\r\nf \u00a0g\u3000h   ",
    "def f(x):\n    return x**2  # comment\n\tif (a && b) { return 0; }\n",
    "<|endoftext|> <|im_start|>user <s></s> [MASK] <unk> <|begin_of_text|>",
    "\ufffd\u0000\u0001 x\u0000y \u200b\u200d",
    "supercalifragilisticexpialidocious" * 12,
    "I'm you're he's we've they'll I'd DON'T WE'LL She'S",
    "",
    " ",
    "   leading and trailing   ",
    "ＡＢＣ ｶﾀｶﾅ ﬁ ½ ² ℌ",
    "İstanbul ΣΑΣ Straße",
    "The year 1776 and 2024, then 1000000 people.",
    "x<0x41>y <0xFF> ▁▁word ▁",
]


def hexs(s):
    return s.encode("utf-8").hex()


def byte_offsets(text, enc, n_text_bytes, n_prefix):
    """tokenizers' char offsets -> byte offsets; post-processor tokens
    (sequence id None) get 0 before the text and len after it."""
    pos = [0]
    for ch in text:
        pos.append(pos[-1] + len(ch.encode("utf-8")))
    out = []
    for i, (o, sid) in enumerate(zip(enc.offsets, enc.sequence_ids)):
        if sid is None:
            out.append(0 if i < n_prefix else n_text_bytes)
        else:
            out.append(pos[o[0]])
    return out


def case(tok, name, text, add):
    e = tok.encode(text, add_special_tokens=add)
    dec = tok.decode(e.ids, skip_special_tokens=False)
    probe = tok.encode("a", add_special_tokens=True).sequence_ids
    n_prefix = next((i for i, s in enumerate(probe) if s is not None), 0) if add else 0
    return {
        "tok": name, "text_hex": hexs(text), "add": int(add), "ids": e.ids,
        "offsets": byte_offsets(text, e, len(text.encode("utf-8")), n_prefix),
        "dec_hex": hexs(dec),
        "dec_skip_hex": hexs(tok.decode(e.ids, skip_special_tokens=True)),
        "lossless": dec == text,
    }


def fnv64(ids):
    h = 0xcbf29ce484222325
    for b in b"".join(struct.pack("<I", i) for i in ids):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def train(corpus, pre, vocab=300, special=(), **kw):
    tok = Tokenizer(models.BPE(**{k: v for k, v in kw.items()
                                  if k in ("unk_token", "fuse_unk", "byte_fallback",
                                           "continuing_subword_prefix", "end_of_word_suffix",
                                           "ignore_merges")}))
    tok.pre_tokenizer = pre
    tkw = {k: v for k, v in kw.items()
           if k in ("initial_alphabet", "limit_alphabet", "continuing_subword_prefix",
                    "end_of_word_suffix")}
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(special),
                             show_progress=False, **tkw)
    tok.train_from_iterator(corpus, tr)
    return json.loads(tok.to_str())


def variant(base, **parts):
    """Copy of a tokenizer.json dict with some top-level parts replaced."""
    j = json.loads(json.dumps(base))
    for k, v in parts.items():
        if k.startswith("model_"):
            j["model"][k[6:]] = v
        else:
            j[k] = v
    return j


def comp(obj):
    """The JSON of a tokenizers component (normalizer, pre-tokenizer...)."""
    t = Tokenizer(models.BPE())
    slot = {normalizers.Normalizer: "normalizer", pre_tokenizers.PreTokenizer: "pre_tokenizer",
            decoders.Decoder: "decoder", processors.PostProcessor: "post_processor"}
    for cls, name in slot.items():
        if isinstance(obj, cls):
            setattr(t, name, obj)
            return json.loads(t.to_str())[name]
    raise TypeError(obj)


def bytelevel_family(corpus):
    bl = comp(pre_tokenizers.ByteLevel(add_prefix_space=False))
    base = train(corpus, pre_tokenizers.ByteLevel(add_prefix_space=False),
                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    base["decoder"] = comp(decoders.ByteLevel())
    out = {"bl_regex": variant(base, pre_tokenizer=bl,
                               post_processor=comp(processors.ByteLevel(trim_offsets=True)))}
    out["bl_prefix"] = variant(base, pre_tokenizer=comp(pre_tokenizers.ByteLevel(add_prefix_space=True)),
                               post_processor=comp(processors.ByteLevel(trim_offsets=True,
                                                                        add_prefix_space=True)))
    nore = comp(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    out["bl_noregex"] = variant(base, pre_tokenizer=nore)
    for beh in ["removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"]:
        for inv in (False, True):
            for pat in (" ", tokenizers.Regex(r"\s+|\d")):
                sp = comp(pre_tokenizers.Split(pat, beh, invert=inv))
                kind = "str" if isinstance(pat, str) else "re"
                out[f"split_{beh}_{'inv' if inv else 'n'}_{kind}"] = variant(
                    base, pre_tokenizer={"type": "Sequence", "pretokenizers": [sp, nore]})
    for ind in (False, True):
        dg = comp(pre_tokenizers.Digits(individual_digits=ind))
        out[f"digits_{int(ind)}"] = variant(base, pre_tokenizer={"type": "Sequence",
                                                                  "pretokenizers": [dg, bl]})
    for nname, n in [("nfc", normalizers.NFC()), ("nfd", normalizers.NFD()),
                     ("nfkc", normalizers.NFKC()), ("nfkd", normalizers.NFKD()),
                     ("lower", normalizers.Lowercase()),
                     ("seq", normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(),
                                                   normalizers.Strip()])),
                     ("replace_re", normalizers.Replace(tokenizers.Regex(r"\d+"), "#")),
                     ("replace_str", normalizers.Replace("  ", " ")),
                     ("prepend", normalizers.Prepend("_"))]:
        out["norm_" + nname] = variant(base, normalizer=comp(n), pre_tokenizer=bl)
    # Llama-3 style: Split + ByteLevel(use_regex false), ignore_merges, BOS template
    l3 = variant(base, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        comp(pre_tokenizers.Split(tokenizers.Regex(LLAMA3_RE), "isolated")), nore]},
        model_ignore_merges=True)
    out["llama3"] = l3
    out["whitespace"] = variant(base, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        comp(pre_tokenizers.Whitespace()), nore]})
    out["wsplit_punct"] = variant(base, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        comp(pre_tokenizers.WhitespaceSplit()), comp(pre_tokenizers.Punctuation()), nore]})
    return out


def with_added(j, specs, post=None):
    """Load j into tokenizers, add tokens, set the post-processor, dump."""
    t = Tokenizer.from_str(json.dumps(j))
    for content, special, kw in specs:
        at = AddedToken(content, special=special, **kw)
        (t.add_special_tokens if special else t.add_tokens)([at])
    if post is not None:
        t.post_processor = post(t)
    return json.loads(t.to_str())


def metaspace_family(corpus):
    out = {}
    base = train(corpus, pre_tokenizers.Metaspace(), unk_token="<unk>", special=["<unk>"],
                 limit_alphabet=60)
    for scheme in ("always", "first", "never"):
        for split in (True, False):
            out[f"meta_{scheme}_{int(split)}"] = variant(
                base, pre_tokenizer=comp(pre_tokenizers.Metaspace(prepend_scheme=scheme, split=split)),
                decoder=comp(decoders.Metaspace(prepend_scheme=scheme, split=split)),
                model_fuse_unk=split)
    # SentencePiece-style byte fallback (Llama 2 / Mistral tokenizer.json)
    bytes_ = ["<0x%02X>" % b for b in range(256)]
    sp = train(corpus, pre_tokenizers.Metaspace(), vocab=600, special=["<unk>", "<s>", "</s>"] + bytes_,
               unk_token="<unk>", limit_alphabet=60)
    sp["added_tokens"] = [a for a in sp["added_tokens"] if a["content"] in ("<unk>", "<s>", "</s>")]
    sp["model"]["byte_fallback"] = True
    sp["model"]["fuse_unk"] = True
    l2 = variant(sp, pre_tokenizer=None, normalizer=comp(normalizers.Sequence([
        normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])),
        decoder=comp(decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                        decoders.Fuse(), decoders.Strip(" ", 1, 0)])))
    out["llama2"] = with_added(l2, [], post=lambda t: processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", t.token_to_id("<s>"))]))
    m3 = variant(sp, pre_tokenizer=comp(pre_tokenizers.Metaspace(prepend_scheme="first", split=False)),
                 decoder=comp(decoders.Sequence([decoders.Metaspace(prepend_scheme="first", split=False),
                                                 decoders.ByteFallback(), decoders.Fuse()])))
    out["mistral"] = with_added(m3, [], post=lambda t: processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)]))
    return out


def wordpiece_like_family(corpus):
    out = {}
    for fuse in (False, True):
        j = train(corpus, pre_tokenizers.Whitespace(), unk_token="[UNK]", special=["[UNK]"],
                  limit_alphabet=40, fuse_unk=fuse)
        j["model"]["fuse_unk"] = fuse
        out[f"unk_fuse{int(fuse)}"] = j
    out["subword"] = train(corpus, pre_tokenizers.WhitespaceSplit(), unk_token="[UNK]",
                           special=["[UNK]"], continuing_subword_prefix="##",
                           end_of_word_suffix="</w>", limit_alphabet=80)
    return out


def added_family(bl):
    out = {}
    lower = variant(bl["bl_regex"], normalizer=comp(normalizers.Lowercase()))
    specs = [("<special>", True, {}), ("[MASK]", True, {"lstrip": True}),
             ("<R>", False, {"rstrip": True}), ("word", False, {"single_word": True}),
             ("ÉCOLE", False, {"normalized": True}), ("<|im_end|>", True, {"normalized": True}),
             ("raw", False, {"normalized": False, "lstrip": True, "rstrip": True}),
             ("<spec", True, {})]
    out["added"] = with_added(lower, specs, post=lambda t: processors.TemplateProcessing(
        single="<special> $A <special> <R>",
        special_tokens=[("<special>", t.token_to_id("<special>")), ("<R>", t.token_to_id("<R>"))]))
    out["roberta"] = with_added(bl["bl_prefix"], [("<s>", True, {}), ("</s>", True, {})],
                                post=lambda t: processors.RobertaProcessing(
                                    ("</s>", t.token_to_id("</s>")), ("<s>", t.token_to_id("<s>"))))
    out["bert"] = with_added(bl["whitespace"], [("[CLS]", True, {}), ("[SEP]", True, {})],
                             post=lambda t: processors.BertProcessing(
                                 ("[SEP]", t.token_to_id("[SEP]")), ("[CLS]", t.token_to_id("[CLS]"))))
    l3 = with_added(bl["llama3"], [("<|begin_of_text|>", True, {}), ("<|eot_id|>", True, {})],
                    post=lambda t: processors.Sequence([processors.ByteLevel(trim_offsets=False),
                                                        processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        special_tokens=[("<|begin_of_text|>", t.token_to_id("<|begin_of_text|>"))])]))
    out["llama3"] = l3
    return out


def error_cases(good):
    g = json.dumps(good)
    E = []

    def add(name, j, status, msg):
        E.append({"name": name, "json_hex": (j if isinstance(j, str) else json.dumps(j)).encode().hex(),
                  "status": status, "msg": msg})

    add("truncated", g[: len(g) // 2], "FORMAT", "tokenizer.json:1:")
    add("invalid", '{"model": {,}}', "FORMAT", "tokenizer.json:1:")
    add("not_object", "[1, 2]", "FORMAT", "tokenizer.json: (top level): expected an object")
    add("model_type", variant(good, model_type="Unigram"), "FORMAT",
        'tokenizer.json: model.type: unsupported model "Unigram"')
    add("no_model", {k: v for k, v in good.items() if k != "model"}, "FORMAT", "tokenizer.json: model:")
    add("pretok_type", variant(good, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        good["pre_tokenizer"], {"type": "Foo"}]}), "FORMAT",
        'tokenizer.json: pre_tokenizer.pretokenizers[1].type: unknown pre-tokenizer "Foo"')
    add("norm_type", variant(good, normalizer={"type": "Bar"}), "FORMAT",
        'tokenizer.json: normalizer.type: unknown normalizer "Bar"')
    add("dec_type", variant(good, decoder={"type": "Sequence", "decoders": [{"type": "CTC"}]}),
        "FORMAT", 'tokenizer.json: decoder.decoders[0].type: unknown decoder "CTC"')
    add("post_type", variant(good, post_processor={"type": "Baz"}), "FORMAT",
        'tokenizer.json: post_processor.type: unknown post-processor "Baz"')
    bad_merge = variant(good)
    bad_merge["model"]["merges"] = list(bad_merge["model"]["merges"]) + [["Ġzzzq", "Ġ"]]
    add("merge_oov", bad_merge, "FORMAT", 'is not in the vocabulary')
    add("bad_regex", variant(good, pre_tokenizer={"type": "Split", "pattern": {"Regex": "(a"},
                                                  "behavior": "Isolated", "invert": False}),
        "FORMAT", "tokenizer.json: pre_tokenizer.pattern.Regex: bad regex")
    add("vocab_type", variant(good, model_vocab=[1, 2]), "FORMAT",
        "tokenizer.json: model.vocab: expected an object")
    add("bool_type", variant(good, pre_tokenizer={"type": "ByteLevel", "add_prefix_space": "yes"}),
        "FORMAT", "tokenizer.json: pre_tokenizer.add_prefix_space: expected true or false")
    add("dropout", variant(good, model_dropout=0.1), "FORMAT",
        "tokenizer.json: model.dropout: only null is supported")
    add("behavior", variant(good, pre_tokenizer={"type": "Split", "pattern": {"String": " "},
                                                 "behavior": "Sideways", "invert": False}),
        "FORMAT", 'tokenizer.json: pre_tokenizer.behavior: unknown split behavior "Sideways"')
    add("scheme", variant(good, pre_tokenizer={"type": "Metaspace", "replacement": "▁",
                                               "prepend_scheme": "sometimes"}),
        "FORMAT", 'tokenizer.json: pre_tokenizer.prepend_scheme: unknown value "sometimes"')
    add("merge_form", variant(good, model_merges=["a b c"]), "FORMAT",
        "tokenizer.json: model.merges[0]: expected")
    add("added_type", variant(good, added_tokens=[{"id": "x", "content": "a"}]), "FORMAT",
        "tokenizer.json: added_tokens[0].id:")
    return E


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--shared", default=os.path.join(root, "..", "shared"))
    ap.add_argument("--any-version", action="store_true")
    a = ap.parse_args()
    if tokenizers.__version__ != PINNED and not a.any_version:
        sys.exit(f"tokenizers {tokenizers.__version__} != pinned {PINNED} (--any-version)")
    models_dir = os.path.join(a.shared, "models")
    sotu = open(os.path.join(models_dir, "text", "sotu.txt"), encoding="utf-8").read()
    corpus = sotu[:60000].split("\n") + TEXTS

    toks, jsons = {}, {}
    real = {"smollm2": "models/smollm2/tokenizer/tokenizer.json",
            "qwen3": "models/real-tokenizers/qwen3/tokenizer.json",
            "gpt2": "models/tiny-random-gpt2/tokenizer.json"}
    for name, rel in real.items():
        toks[name] = Tokenizer.from_file(os.path.join(a.shared, rel))
    bl = bytelevel_family(corpus)
    built = dict(bl)
    built.update(metaspace_family(corpus))
    built.update(wordpiece_like_family(corpus))
    built.update(added_family(bl))
    for name, j in built.items():
        s = json.dumps(j, ensure_ascii=False)
        toks[name] = Tokenizer.from_str(s)
        jsons[name] = s

    cases = []
    for name, tok in toks.items():
        specials = " ".join(t.content for t in tok.get_added_tokens_decoder().values())
        extra = ["x" + specials.replace(" ", "y ") + " z", " " + specials + "  end",
                 "a word words sword word. ÉCOLE école raw  raw <R>  x [MASK]"]
        for text in TEXTS + extra:
            for add in (False, True):
                c = case(tok, name, text, add)
                c["check_offsets"] = name in real or text.isascii()
                cases.append(c)
    inp_dir = os.path.join(models_dir, "real-tokenizers", "testvectors", "llama.cpp-vocab")
    llamacpp = []
    for f in sorted(os.listdir(inp_dir)):
        if not f.endswith(".inp"):
            continue
        inputs = open(os.path.join(inp_dir, f), encoding="utf-8", newline="").read()
        inputs = inputs.split("\n__ggml_vocab_test__\n")[:-1]
        for name in real:
            for text in inputs:
                c = case(toks[name], name, text, False)
                c["check_offsets"] = True
                cases.append(c)
        outp = os.path.join(inp_dir, f[:-4] + ".out")
        outs = open(outp).read().split("\n")
        for name in real:
            ok = all(toks[name].encode(t, add_special_tokens=False).ids ==
                     [int(x) for x in o.split()] for t, o in zip(inputs, outs))
            if ok:
                llamacpp.append({"tok": name, "inp": "models/real-tokenizers/testvectors/"
                                 "llama.cpp-vocab/" + f, "out": outp.split("shared/")[-1]
                                 if "shared/" in outp else "models/real-tokenizers/testvectors/"
                                 "llama.cpp-vocab/" + f[:-4] + ".out"})
    hashed = []
    for name in list(real) + ["llama3", "llama2", "norm_nfkc"]:
        for add in (False, True):
            ids = toks[name].encode(sotu[:200000], add_special_tokens=add).ids
            hashed.append({"tok": name, "file": "models/text/sotu.txt", "chars": 200000,
                           "bytes": len(sotu[:200000].encode()), "add": int(add),
                           "count": len(ids), "fnv64": fnv64(ids), "head": ids[:64]})
    out = {"format": "energon-hf-tokenizer-fixture", "version": 1,
           "tokenizers_version": tokenizers.__version__,
           "tokenizers": {**{n: {"shared": p} for n, p in real.items()},
                          **{n: {"json": s} for n, s in jsons.items()}},
           "cases": cases, "hashed": hashed, "llamacpp": llamacpp,
           "errors": error_cases(bl["bl_regex"])}
    fx = os.path.join(root, "tests", "fixtures", "hf_tokenizer")
    os.makedirs(fx, exist_ok=True)
    with open(os.path.join(fx, "cases.json.gz"), "wb") as fh:
        fh.write(gzip.compress(json.dumps(out, ensure_ascii=False).encode(), mtime=0))
    corpus_dir = os.path.join(root, "tests", "fuzz", "corpus", "tokenizer_json")
    os.makedirs(corpus_dir, exist_ok=True)
    tiny = train(corpus[:200], pre_tokenizers.ByteLevel(), vocab=40, special=["<s>"])
    seeds = {"bytelevel.json": variant(tiny, decoder=comp(decoders.ByteLevel())),
             "metaspace.json": variant(tiny, pre_tokenizer=comp(pre_tokenizers.Metaspace()),
                                       normalizer=comp(normalizers.Sequence([normalizers.NFKC(),
                                                                             normalizers.Lowercase()])),
                                       decoder=comp(decoders.Sequence([decoders.ByteFallback(),
                                                                       decoders.Fuse(),
                                                                       decoders.Strip(" ", 1, 0)]))),
             "split.json": variant(tiny, pre_tokenizer={"type": "Sequence", "pretokenizers": [
                 comp(pre_tokenizers.Split(tokenizers.Regex(LLAMA3_RE), "isolated")),
                 comp(pre_tokenizers.Digits(True)), comp(pre_tokenizers.ByteLevel(use_regex=False))]})}
    for fname, j in seeds.items():
        with open(os.path.join(corpus_dir, fname), "w", encoding="utf-8") as fh:
            json.dump(j, fh, ensure_ascii=False)
    print(f"{len(cases)} cases, {len(hashed)} hashed, {len(llamacpp)} llama.cpp files, "
          f"{len(out['errors'])} error cases")


if __name__ == "__main__":
    main()
