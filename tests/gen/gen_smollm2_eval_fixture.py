#!/usr/bin/env python3
"""Negative log-likelihood of a text under SmolLM2-135M-Instruct in
transformers, the reference for `energon eval` in tests/test_smollm2_gguf.sh
(the model read from its GGUF file and from the Hugging Face directory).

Needs the Hugging Face directory made by ../shared/models/smollm2/get.sh DIR --hf:
    python3 tests/gen/gen_smollm2_eval_fixture.py ~/.cache/energon/smollm2/hf
Reads tests/fixtures/text/smollm2_eval.txt (the whole file, as energon eval
reads it), tokenizes it without special tokens (SmolLM2 adds none), runs one
float32 forward on the CPU and writes tests/fixtures/chat/smollm2_eval.json:
the ids, the number of scored tokens (n - 1) and the mean NLL in float64 of
-log softmax(logits[t])[ids[t + 1]].
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")


def main():
    d = os.path.expanduser(sys.argv[1])
    text = open(os.path.join(FIX, "text", "smollm2_eval.txt"), encoding="utf-8").read()
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    model.eval()
    ids = tok(text, add_special_tokens=True)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    nll = -lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    out = {
        "generator": "tests/gen/gen_smollm2_eval_fixture.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "ids": ids,
        "scored": len(ids) - 1,
        "nll": float(nll.mean()),
    }
    with open(os.path.join(FIX, "chat", "smollm2_eval.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(out["scored"], out["nll"])


if __name__ == "__main__":
    main()
