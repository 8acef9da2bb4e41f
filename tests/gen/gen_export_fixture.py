#!/usr/bin/env python3
"""Reference for test_export: the logits of a base model with a LoRA adapter
merged by PEFT (merge_and_unload), in float32.

Base: tests/fixtures/hf/llama_gqa_tied; adapter: the PEFT-written
tests/fixtures/grad/llama_gqa_tied_lora_adapter (from gen_grad_fixtures.py);
token ids: those of tests/fixtures/hf/llama_gqa_tied/logits.bin. Output:
tests/fixtures/grad/llama_gqa_tied_lora_merged.bin in the ENFX logits format
(magic "ENFX", uint32 version 1, n_tokens, n_vocab, int32 ids, float32 logits).

With ENERGON=path/to/energon in the environment it also runs
`energon export` and loads the result with transformers, checking that
transformers sees the same logits (the claim the fixture test relies on).
Needs torch, transformers, peft (PyPI) only to regenerate.
"""
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")


def read_ids(path):
    with open(path, "rb") as f:
        magic = f.read(4)
        assert magic == b"ENFX"
        ver, t, v = struct.unpack("<III", f.read(12))
        return list(struct.unpack(f"<{t}i", f.read(4 * t)))


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float().numpy()


def main():
    base_dir = os.path.join(FIX, "hf", "llama_gqa_tied")
    ad_dir = os.path.join(FIX, "grad", "llama_gqa_tied_lora_adapter")
    ids = read_ids(os.path.join(base_dir, "logits.bin"))
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32,
                                                attn_implementation="eager")
    merged = PeftModel.from_pretrained(base, ad_dir).merge_and_unload().eval()
    lg = logits_of(merged, ids)
    out = os.path.join(FIX, "grad", "llama_gqa_tied_lora_merged.bin")
    with open(out, "wb") as f:
        f.write(b"ENFX")
        f.write(struct.pack("<III", 1, lg.shape[0], lg.shape[1]))
        f.write(np.asarray(ids, dtype="<i4").tobytes())
        f.write(np.ascontiguousarray(lg, dtype="<f4").tobytes())
    print(f"wrote {out}: {lg.shape}")
    energon = os.environ.get("ENERGON")
    if energon:
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([energon, "export", "--model", base_dir, "--adapter", ad_dir,
                            "--out", d], check=True)
            ours = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                        attn_implementation="eager")
            lo = logits_of(ours.eval(), ids)
            err = float(np.max(np.abs(lo - lg)) / np.max(np.abs(lg)))
            print(f"transformers on `energon export` output vs PEFT merge: max rel err {err:.2e}")
            assert err < 1e-5, err


if __name__ == "__main__":
    sys.exit(main())
