#!/usr/bin/env python3
"""gen_embed_fixture.py - a tiny random Llama with its own tokenizer, and the
float64 reference of its embeddings, for tests/serve/embeddings.py
(`POST /v1/embeddings`, issue 14).

Writes tests/fixtures/hf/embed_llama/:
    tokenizer.json     a byte-level BPE (vocab 400) trained with the
                       `tokenizers` package on examples/company/*.txt
    config.json, model.safetensors
                       LlamaForCausalLM (2 layers, hidden 64, 4 heads / 2 kv
                       heads, untied), weights N(0, 0.1^2), norm weights
                       1 + N(0, 0.1^2), stored float32
    embeddings.json    {"texts": [...], "ids": [[...]] (tokenizers' ids of
                       each text), "mean": [[...]], "last": [[...]]}: the
                       model's last_hidden_state (after the final norm)
                       computed in float64 from the stored float32 weights,
                       mean-pooled over the text's tokens or taken at its
                       last token, then L2-normalised (float64 throughout)

Usage (from the repository root; Python is needed only to regenerate):
    python3 tests/gen/gen_embed_fixture.py [out_dir]
"""
import glob
import json
import os
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM

SEED = 4242
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
DEFAULT_OUT = os.path.join(HERE, "..", "fixtures", "hf", "embed_llama")

TEXTS = [
    "What is the refund policy?",
    "Employees may work from home two days a week.",
    "a",
    "The quarterly report is due on the first Monday of the month; send it to finance.",
    "Our products ship worldwide within five business days of the order.",
    "Security badges must be worn at all times inside the building.",
    "How many vacation days do new employees get in their first year?",
    "Ångström, naïve café: 3.14159 and 12345!",
]


def train_tokenizer():
    files = sorted(glob.glob(os.path.join(ROOT, "examples", "company", "*.txt")))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(files, trainer)
    return tok


def reinit(model, gen):
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.1
            if name.endswith("norm.weight"):
                r += 1.0
            p.copy_(r)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT
    os.makedirs(out, exist_ok=True)
    tok = train_tokenizer()
    tok.save(os.path.join(out, "tokenizer.json"))
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=120,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, tie_word_embeddings=False,
                      rope_theta=10000.0, rms_norm_eps=1e-5, hidden_act="silu",
                      attn_implementation="eager")
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(cfg)
    reinit(model, torch.Generator().manual_seed(SEED))
    model.save_pretrained(out, safe_serialization=True)
    for extra in ("generation_config.json",):
        p = os.path.join(out, extra)
        if os.path.exists(p):
            os.remove(p)
    model = model.double().eval()
    ids_all, mean_all, last_all = [], [], []
    for text in TEXTS:
        ids = tok.encode(text).ids
        with torch.no_grad():
            h = model.model(input_ids=torch.tensor([ids], dtype=torch.long)).last_hidden_state[0]
        mean = h.mean(dim=0)
        last = h[-1]
        ids_all.append(ids)
        mean_all.append((mean / mean.norm()).tolist())
        last_all.append((last / last.norm()).tolist())
    with open(os.path.join(out, "embeddings.json"), "w") as f:
        json.dump({"texts": TEXTS, "ids": ids_all, "mean": mean_all, "last": last_all,
                   "torch": torch.__version__}, f)
        f.write("\n")
    print(f"wrote {out}: vocab {tok.get_vocab_size()}, {len(TEXTS)} texts")


if __name__ == "__main__":
    main()
