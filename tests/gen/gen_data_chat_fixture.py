#!/usr/bin/env python3
"""gen_data_chat_fixture.py - expected ids and loss masks of chat training
records rendered through Jinja templates, for tests/test_data.c.

Two templates (their text is repeated literally in test_data.c, which checks
that the two copies agree):
  smollm2            SmolLM2-Instruct's own template (no generation tags).
                     The expected mask follows the prefix-render rule, computed
                     here with transformers: for assistant message i,
                     P = apply_chat_template(messages[:i], add_generation_prompt=True)
                     Q = apply_chat_template(messages[:i+1]), both prefixes of
                     the whole render, and an id is trained when the text it
                     comes from starts in [len(P), len(Q)).
  chatml_generation  a ChatML template whose assistant turns sit in
                     {% generation %} blocks, so that transformers' own
                     return_assistant_tokens_mask (which does not use the
                     prefix rule at all) is recorded too, as "hf_mask".
"mask" is the rule chat.h states (an id is trained when the text it comes
from STARTS inside an assistant span). transformers' mask also trains a
token that starts before the span and ends inside it (SmolLM2 encodes
"assistant\n  Mir" with one "\n " token across the edge); "hf_mask"
records that, and the generator checks that the two differ only there.
Ids are the whole render encoded without added special tokens, as
apply_chat_template(tokenize=True) does, with the SmolLM2 tokenizer at
SHARED/models/smollm2/tokenizer.

Each case also carries the .jsonl line the test feeds energon's data
pipeline: a {"messages": ...} record (some with content given as a list of
text parts, which transformers' template would not accept; the expected
values come from the same messages with the parts joined) or a
{"prompt", "completion"} record (rendered as [user, assistant]).

Pinned: transformers 5.24.0, tokenizers 0.23.3.
Usage: python3 tests/gen/gen_data_chat_fixture.py [SHARED_DIR]
"""
import json
import os
import sys

import transformers
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared")
OUT = os.path.join(ROOT, "tests", "fixtures", "data", "chat_masks.json")

TEMPLATES = {
    "smollm2": (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
        "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    "chatml_generation": (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
        "{% if message['role'] == 'assistant' %}{% generation %}"
        "{{ message['content'] + '<|im_end|>\n' }}{% endgeneration %}"
        "{% else %}{{ message['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
}


def parts(m):
    """The message with its content split into two text parts."""
    c = m["content"]
    k = len(c) // 2
    return {"role": m["role"], "content": [{"type": "text", "text": c[:k]},
                                           {"type": "text", "text": c[k:]}]}


CONVERSATIONS = [
    ("one_turn", [{"role": "user", "content": "What is the capital of France?"},
                  {"role": "assistant", "content": "Paris is the capital of France."}], "messages"),
    ("system_two_turns", [
        {"role": "system", "content": "Answer in one short sentence."},
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "7 is a prime number."},
        {"role": "user", "content": "And an even one?"},
        {"role": "assistant", "content": "2 is the only even prime."}], "messages"),
    ("text_parts_unicode", [
        {"role": "user", "content": "Grüße! Wie geht's? 🙂"},
        {"role": "assistant", "content": "  Mir geht's gut.\n\nDanke — und dir?"}], "parts"),
    ("prompt_completion", [{"role": "user", "content": "2 + 2 ="},
                           {"role": "assistant", "content": " 4"}], "pc"),
]


def record(msgs, kind):
    if kind == "pc":
        return json.dumps({"prompt": msgs[0]["content"], "completion": msgs[1]["content"]},
                          ensure_ascii=False)
    if kind == "parts":
        return json.dumps({"messages": [parts(m) for m in msgs]}, ensure_ascii=False)
    return json.dumps({"messages": msgs}, ensure_ascii=False)


def prefix_mask(tok, tmpl, msgs, text, offsets):
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        p = tok.apply_chat_template(msgs[:i], chat_template=tmpl, tokenize=False,
                                    add_generation_prompt=True)
        q = tok.apply_chat_template(msgs[:i + 1], chat_template=tmpl, tokenize=False)
        assert text.startswith(p) and text.startswith(q) and len(q) > len(p), (i, p, q)
        spans.append((len(p), len(q)))
    return [int(any(a <= o[0] < b for a, b in spans)) for o in offsets]


def main():
    tok = AutoTokenizer.from_pretrained(os.path.join(SHARED, "models", "smollm2", "tokenizer"))
    cases = []
    for tname, tmpl in TEMPLATES.items():
        for name, msgs, kind in CONVERSATIONS:
            text = tok.apply_chat_template(msgs, chat_template=tmpl, tokenize=False)
            enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
            ids = enc["input_ids"]
            out = tok.apply_chat_template(msgs, chat_template=tmpl, tokenize=True,
                                          return_dict=True,
                                          return_assistant_tokens_mask=(tname != "smollm2"))
            assert list(out["input_ids"]) == ids, name
            pm = prefix_mask(tok, tmpl, msgs, text, enc["offset_mapping"])
            case = {"name": f"{tname}/{name}", "template": tname,
                    "record": record(msgs, kind), "text": text, "ids": ids, "mask": pm}
            if tname != "smollm2":
                hf = [int(x) for x in out["assistant_masks"]]
                for k, (a, b) in enumerate(zip(pm, hf)):
                    # they may differ only on the token just before a span
                    assert a == b or (a == 0 and b == 1 and pm[k + 1] == 1), (name, k)
                case["hf_mask"] = hf
            cases.append(case)
    doc = {"generator": "tests/gen/gen_data_chat_fixture.py",
           "transformers": transformers.__version__,
           "tokenizer": "models/smollm2/tokenizer", "templates": TEMPLATES, "cases": cases}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
