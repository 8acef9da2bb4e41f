#!/usr/bin/env python3
"""Reference for test_stories: Hugging Face transformers' greedy generation
on the stories260K checkpoint after `energon convert llama2c`.

usage: gen_stories_fixture.py ENERGON_BINARY SHARED_DIR OUT.json

The converted directory is loaded with transformers' LlamaForCausalLM and
LlamaTokenizer (sentencepiece), so the fixture checks both our converter
(q/k permutation, config) and our forward pass + greedy decoding against an
independent implementation. Written for energon; needs torch, transformers,
sentencepiece (PyPI) only when regenerating.
"""
import json
import subprocess
import sys
import tempfile

import torch
import transformers
from transformers import AutoTokenizer, LlamaForCausalLM

N_NEW = 200
PROMPT = "Once upon a time"


def main():
    energon, shared, out = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([energon, "convert", "llama2c",
                        "--checkpoint", f"{shared}/models/stories260K/stories260K.bin",
                        "--tokenizer", f"{shared}/models/stories260K/tok512.model",
                        "--out", d], check=True)
        tok = AutoTokenizer.from_pretrained(d, use_fast=False)
        model = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float32,
                                                 attn_implementation="eager")
        model.eval()
        prompt_ids = tok(PROMPT)["input_ids"]
        assert prompt_ids[0] == 1, prompt_ids
        with torch.no_grad():
            ids = torch.tensor([prompt_ids])
            gen = model.generate(ids, max_new_tokens=N_NEW, do_sample=False,
                                 eos_token_id=None, pad_token_id=0,
                                 min_new_tokens=N_NEW)
            new = gen[0, len(prompt_ids):].tolist()
            logits = model(gen).logits[0]  # (T, V) for the whole sequence
        text = tok.decode(new, skip_special_tokens=True)
        # last-position logits of the prompt, for a direct numeric check
        fixture = {
            "prompt": PROMPT,
            "prompt_ids": prompt_ids,
            "greedy_ids": new,
            "greedy_text": text,
            "prompt_last_logits": [float(x) for x in logits[len(prompt_ids) - 1]],
            "versions": {"torch": torch.__version__,
                         "transformers": transformers.__version__},
        }
    with open(out, "w") as f:
        json.dump(fixture, f, indent=1)
    print(text)


if __name__ == "__main__":
    main()
