#!/usr/bin/env python3
"""Greedy answers of SmolLM2-135M-Instruct under transformers, the reference
for tests/test_smollm2.sh (generate --chat and serve must give the same ids).

Needs the model's Hugging Face directory, made by
../shared/models/smollm2/get.sh DIR --hf (torch, transformers, gguf):
    python3 tests/gen/gen_smollm2_fixture.py ~/.cache/energon/smollm2/hf
Writes tests/fixtures/chat/smollm2_greedy.json: for each conversation the
prompt ids (apply_chat_template with the generation prompt) and the greedy
continuation up to and including the first id in generation_config's
eos_token_id, at most MAX_NEW tokens, float32 on the CPU.
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

MAX_NEW = 48
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Name three primary colors."}],
    [{"role": "user", "content": "Write the word hello in French."}],
]


def main():
    d = os.path.expanduser(sys.argv[1])
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
    model.eval()
    eos = model.generation_config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    cases = []
    for conv in CONVERSATIONS:
        ids = tok.apply_chat_template(conv, add_generation_prompt=True, return_dict=True,
                                      return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False,
                                 eos_token_id=eos, pad_token_id=eos[0])
        new = out[0, ids.shape[1]:].tolist()
        stopped = bool(new) and new[-1] in eos
        answer = tok.decode(new[:-1] if stopped else new, skip_special_tokens=True)
        cases.append({"messages": conv, "prompt_ids": ids[0].tolist(), "answer_ids": new,
                      "stopped": stopped, "answer": answer})
        print(repr(answer), "stopped" if stopped else "length")
    fx = {"generator": "tests/gen/gen_smollm2_fixture.py", "transformers": transformers.__version__,
          "torch": torch.__version__, "max_new_tokens": MAX_NEW, "eos_token_id": eos,
          "cases": cases}
    path = os.path.join(os.path.dirname(__file__), "..", "fixtures", "chat", "smollm2_greedy.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fx, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
