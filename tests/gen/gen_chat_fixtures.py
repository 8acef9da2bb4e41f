#!/usr/bin/env python3
"""Fixtures for tests/test_chat_template.c: what transformers does with a
model directory's tokenizer and chat template, end to end.

For each model directory (SmolLM2-135M-Instruct's tokenizer files, Qwen3's
tokenizer with its template in tokenizer_config.json), and each conversation:
  - text: apply_chat_template(messages, tokenize=False, add_generation_prompt=g)
  - ids:  apply_chat_template(..., tokenize=True) (the prompt ids a server feeds)
and for a few plain texts: tokenizer(text).input_ids (add_special_tokens=True,
the model's own rule for BOS) and the ids without special tokens.

Run from the repository root with transformers 5.24 installed:
    python3 tests/gen/gen_chat_fixtures.py ../shared
Writes tests/fixtures/chat/<name>.json.
"""
import json
import os
import sys

import transformers
from transformers import AutoTokenizer

SHARED = sys.argv[1] if len(sys.argv) > 1 else "../shared"
OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "chat")

MODELS = {
    "smollm2": "models/smollm2/tokenizer",
    "qwen3": "models/real-tokenizers/qwen3",
}

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "Capital of Italy?"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "Hi! 👋 Ça va?"},
     {"role": "assistant", "content": "Bien, merci. 日本語も話せます。"},
     {"role": "user", "content": "  spaces  and\ttabs\nand lines  "}],
    [{"role": "user", "content": "Say <|im_end|> literally"},
     {"role": "assistant", "content": "I can't write \"<|im_end|>\" as text"},
     {"role": "user", "content": "x = {'a': [1, 2]}; print(x)"},
     {"role": "assistant", "content": "{'a': [1, 2]}"}],
]

TEXTS = ["Hello world", " leading space", "<|im_start|>user\nhi<|im_end|>", "a  b\n\nc"]


def chatml_spans(text, conv):
    """What fine-tuning trains on in a ChatML render, by the format itself:
    for each assistant message, from the end of the "<|im_start|>assistant\n"
    header before its content to the end of the "<|im_end|>\n" after it
    (byte offsets in the UTF-8 text)."""
    b = text.encode("utf-8")
    spans, at = [], 0
    for m in conv:
        if m["role"] != "assistant":
            continue
        c = m["content"].encode("utf-8")
        head = b.index(b"<|im_start|>assistant\n", at) + len(b"<|im_start|>assistant\n")
        pos = b.index(c, head)
        end = b.index(b"<|im_end|>\n", pos + len(c)) + len(b"<|im_end|>\n")
        spans.append([head, end])
        at = end
    return spans


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, rel in MODELS.items():
        d = os.path.join(SHARED, rel)
        tok = AutoTokenizer.from_pretrained(d)
        cases = []
        for conv in CONVERSATIONS:
            for gen in (False, True):
                if gen and conv[-1]["role"] == "assistant":
                    continue
                text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
                ids = tok.apply_chat_template(conv, tokenize=True, add_generation_prompt=gen,
                                              return_dict=True)["input_ids"]
                case = {"messages": conv, "add_generation_prompt": gen, "text": text,
                        "ids": list(ids)}
                if not gen:
                    case["assistant_spans"] = chatml_spans(text, conv)
                cases.append(case)
        texts = [{"text": t, "ids_special": tok(t).input_ids,
                  "ids_plain": tok(t, add_special_tokens=False).input_ids} for t in TEXTS]
        fx = {"generator": "tests/gen/gen_chat_fixtures.py",
              "transformers": transformers.__version__,
              "model_dir": rel, "bos_token": tok.bos_token, "eos_token": tok.eos_token,
              "chat": cases, "texts": texts}
        path = os.path.join(OUT, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(fx, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"wrote {path}: {len(cases)} conversations, {len(texts)} texts")


if __name__ == "__main__":
    main()
