#!/usr/bin/env python3
"""gen_gguf_tokenizer_fixtures.py - fixtures for tests/test_tokenizer_gguf.c:
small GGUF files that hold only tokenizer metadata, and what transformers
(the independent reference; tested with transformers 5.24.0, tokenizers
0.23.3, gguf 0.19.0) makes of them with AutoTokenizer.from_pretrained(dir,
gguf_file=...).

  python3 tests/gen/gen_gguf_tokenizer_fixtures.py [SHARED_DIR]

Writes (deterministic for a given tokenizers version):
  tests/fixtures/gguf/tok_gpt2.gguf   tokenizer.ggml.model "gpt2": a
      byte-level BPE of 400 tokens trained here on the first 200 kB of
      SHARED/models/text/sotu.txt, three control tokens (<|endoftext|>
      eos, <|im_start|> bos, <|im_end|> eot), a ChatML chat template.
  tests/fixtures/gguf/tok_llama.gguf  tokenizer.ggml.model "llama": the
      512-piece SentencePiece vocabulary (pieces, scores, token types, ids)
      of SHARED/models/stories260K/stories260K.gguf, plus eom = eos and a
      chat template that prints bos_token and eos_token.
  tests/fixtures/gguf/tok_bad_pre.gguf, tok_bad_model.gguf  tok_gpt2 with
      tokenizer.ggml.pre "llama-bpe" / tokenizer.ggml.model "bert" (the
      unsupported-kind errors).
  tests/fixtures/gguf/tok_expected.json  per file: bos/eos ids, texts
      (hex UTF-8) with transformers' ids for add_special_tokens False and
      True and decode(ids, skip_special_tokens=True), and a 2-message
      conversation's apply_chat_template text (with and without the
      generation prompt) and ids.
  tests/fuzz/corpus/gguf_tokenizer/   the two good files as fuzz seeds.
"""
import json
import os
import re
import shutil
import sys
import tempfile

import gguf
import tokenizers
import transformers
from gguf import GGUFReader, GGUFWriter
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import AutoTokenizer

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FIX = os.path.join(ROOT, "tests", "fixtures", "gguf")
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus", "gguf_tokenizer")
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared")

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
BOS_EOS = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}"
           "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
           "{% if add_generation_prompt %}[assistant] {% endif %}")
TEXTS = [
    "",
    "Hello world",
    "The nation's  economy grew 1234 percent.\n\nAnd then   some\ttabs",
    " leading space, trailing space ",
    "\u00fcn\u00ef c\u00f6d\u00e9 \u65e5\u672c\u8a9e \U0001F389",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<s>Once upon a time</s> there was",
]
CHAT = [{"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue, like the sky."}]


def write_gguf(path, kv):
    """kv: list of (method name, args) on GGUFWriter; no tensors."""
    w = GGUFWriter(path, "llama")
    for name, args in kv:
        getattr(w, name)(*args)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gpt2_kv():
    text = open(os.path.join(SHARED, "models", "text", "sotu.txt"), encoding="utf-8").read()[:200000]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tr = trainers.BpeTrainer(vocab_size=400,
                             special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    tok.train_from_iterator([text], tr)
    d = json.loads(tok.to_str())
    vocab, merges = d["model"]["vocab"], d["model"]["merges"]
    toks = [None] * len(vocab)
    for k, v in vocab.items():
        toks[v] = k
    return [("add_tokenizer_model", ("gpt2",)), ("add_tokenizer_pre", ("gpt2",)),
            ("add_token_list", (toks,)),
            ("add_token_types", ([3 if t.startswith("<|") else 1 for t in toks],)),
            ("add_token_merges", ([m if isinstance(m, str) else " ".join(m) for m in merges],)),
            ("add_bos_token_id", (1,)), ("add_eos_token_id", (0,)), ("add_eot_token_id", (2,)),
            ("add_chat_template", (CHATML,))]


def llama_kv():
    r = GGUFReader(os.path.join(SHARED, "models", "stories260K", "stories260K.gguf"))
    f = r.fields
    toks = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode() for i in f["tokenizer.ggml.tokens"].data]
    scores = [float(f["tokenizer.ggml.scores"].parts[i][0]) for i in f["tokenizer.ggml.scores"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    ids = {k: int(f["tokenizer.ggml." + k].parts[-1][0])
           for k in ("bos_token_id", "eos_token_id", "unknown_token_id")}
    return [("add_tokenizer_model", ("llama",)), ("add_token_list", (toks,)),
            ("add_token_scores", (scores,)), ("add_token_types", (types,)),
            ("add_bos_token_id", (ids["bos_token_id"],)), ("add_eos_token_id", (ids["eos_token_id"],)),
            ("add_eom_token_id", (ids["eos_token_id"],)),
            ("add_unk_token_id", (ids["unknown_token_id"],)),
            ("add_chat_template", (BOS_EOS,))]


def expected(path):
    d, f = os.path.dirname(path), os.path.basename(path)
    t = AutoTokenizer.from_pretrained(d, gguf_file=f)
    out = {"bos": t.bos_token_id, "eos": t.eos_token_id, "texts": []}
    for s in TEXTS:
        a = t(s, add_special_tokens=False).input_ids
        b = t(s, add_special_tokens=True).input_ids
        out["texts"].append({"hex": s.encode().hex(), "ids": a, "ids_special": b,
                             "dec_hex": t.decode(a, skip_special_tokens=True).encode().hex()})
    out["chat"] = {
        "gen_hex": t.apply_chat_template(CHAT[:1], tokenize=False, add_generation_prompt=True).encode().hex(),
        "full_hex": t.apply_chat_template(CHAT, tokenize=False).encode().hex(),
        "full_ids": list(t.apply_chat_template(CHAT, tokenize=True, return_dict=True)["input_ids"]),
    }
    return out


def main():
    os.makedirs(FIX, exist_ok=True)
    os.makedirs(CORPUS, exist_ok=True)
    gk, lk = gpt2_kv(), llama_kv()
    files = {"tok_gpt2.gguf": gk, "tok_llama.gguf": lk}
    for name, kv in files.items():
        write_gguf(os.path.join(FIX, name), kv)
        shutil.copy(os.path.join(FIX, name), os.path.join(CORPUS, name))
    bad_pre = [(n, ("llama-bpe",)) if n == "add_tokenizer_pre" else (n, a) for n, a in gk]
    bad_model = [(n, ("bert",)) if n == "add_tokenizer_model" else (n, a) for n, a in gk]
    write_gguf(os.path.join(FIX, "tok_bad_pre.gguf"), bad_pre)
    write_gguf(os.path.join(FIX, "tok_bad_model.gguf"), bad_model)
    out = {"generator": "tests/gen/gen_gguf_tokenizer_fixtures.py", "version": 1,
           "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
           "files": {}}
    with tempfile.TemporaryDirectory() as tmp:  # transformers may write beside the file
        for name in files:
            shutil.copy(os.path.join(FIX, name), os.path.join(tmp, name))
            out["files"][name] = expected(os.path.join(tmp, name))
    text = json.dumps(out, indent=1)  # each list of ids on one line
    text = re.sub(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)
    with open(os.path.join(FIX, "tok_expected.json"), "w") as fo:
        fo.write(text + "\n")
    print("wrote", FIX, "and", CORPUS)


if __name__ == "__main__":
    main()
