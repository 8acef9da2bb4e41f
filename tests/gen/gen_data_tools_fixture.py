#!/usr/bin/env python3
"""gen_data_tools_fixture.py - expected ids and loss masks of chat training
records with tools (OpenAI "tools", assistant "tool_calls", "tool" results)
rendered through real chat templates that know tools, for
tests/test_data_tools.c.

Templates (SHARED/models/real-tokenizers/templates/), each with the
tokenizer its ids are computed with:
  qwen2.5-instruct.jinja         hermes <tool_call> blocks; Qwen's own
                                 vocabulary (SHARED/models/real-tokenizers/qwen3,
                                 the same ids, <tool_call> an added token)
  llama-3.1-instruct.jinja       {"name", "parameters"} JSON; one call a turn
  mistral-7b-instruct-v0.3.jinja [TOOL_CALLS] [...], 9-character ids
The last two with the SmolLM2 tokenizer (SHARED/models/smollm2/tokenizer):
its bos/eos text stands in for the model's, the template's tool text is
what is checked.

For each case the expected text is transformers' apply_chat_template(
messages, tools=TOOLS, tokenize=False) of the messages as a template reads
them (arguments as objects, a call turn's missing content as None), while
the record that energon reads gives some arguments as JSON text, leaves
content out or null, as the OpenAI API does. ids are that text encoded
without added special tokens; an id is trained ("mask") when the text it
comes from starts inside an assistant span, a span being, per chat.h's
prefix rule, [len(P), len(Q)) with P = render(messages[:i],
add_generation_prompt=True) and Q = render(messages[:i+1]). The generator
checks independently of that rule that every call's text in the template's
own format lies inside a span, and that no tool result does; "spans" keeps
the span texts.

A case with "error" instead of ids is one the template cannot train on;
the test expects energon's load to fail with that text.

Pinned: transformers 5.24.0, tokenizers 0.23.3, jinja2 3.1.6.
Usage: python3 tests/gen/gen_data_tools_fixture.py [SHARED_DIR]
"""
import copy
import json
import os
import sys

import jinja2
import transformers
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared")
OUT = os.path.join(ROOT, "tests", "fixtures", "data", "chat_tools.json")
TDIR = "models/real-tokenizers/templates"
SMOL = "models/smollm2/tokenizer"

TEMPLATES = {  # name: (template file, tokenizer dir, call format)
    "qwen2.5": (f"{TDIR}/qwen2.5-instruct.jinja", "models/real-tokenizers/qwen3", "hermes"),
    "llama3.1": (f"{TDIR}/llama-3.1-instruct.jinja", SMOL, "llama3"),
    "mistral": (f"{TDIR}/mistral-7b-instruct-v0.3.jinja", SMOL, "mistral"),
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
]


def call(cid, name, args, as_text):
    """An OpenAI tool call; arguments as JSON text (as the API sends them)
    or as an object."""
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args) if as_text else args}}


def tool(cid, content):
    return {"role": "tool", "tool_call_id": cid, "content": content}


def u(text):
    return {"role": "user", "content": text}


def a(text):
    return {"role": "assistant", "content": text}


W_PARIS = call("call0001a", "get_weather", {"city": "Paris", "unit": "c"}, True)
W_OSLO = call("call0002b", "get_weather", {"city": "Oslo"}, False)
ADD = call("call0003c", "add", {"a": 2, "b": 3}, True)
W_ROME = call("call0004d", "get_weather", {"city": "Rome", "unit": "f"}, False)

CONVERSATIONS = [
    # content left out of the calling turn
    ("one_call", [
        u("What is the weather in Paris?"),
        {"role": "assistant", "tool_calls": [W_PARIS]},
        tool("call0001a", "{\"temp\": 18, \"sky\": \"clear\"}"),
        a("It is 18 degrees and clear in Paris.")], True),
    # content null, two calls in one turn, a system message
    ("parallel_calls", [
        {"role": "system", "content": "You are a careful assistant."},
        u("Weather in Oslo, and what is 2 + 3?"),
        {"role": "assistant", "content": None, "tool_calls": [W_OSLO, ADD]},
        tool("call0002b", "{\"temp\": 4, \"sky\": \"rain\"}"),
        tool("call0003c", "5"),
        a("Oslo has 4 degrees and rain; 2 + 3 = 5.")], True),
    # text before the call (templates that drop it do so on both sides)
    ("content_and_call", [
        u("Is it warm in Rome?"),
        {"role": "assistant", "content": "Let me look that up.", "tool_calls": [W_ROME]},
        tool("call0004d", "{\"temp\": 77, \"sky\": \"sun\"}"),
        a("Yes: 77 F and sunny.")], True),
    # two rounds of question, call, result, answer
    ("two_rounds", [
        u("What is the weather in Paris?"),
        {"role": "assistant", "content": "", "tool_calls": [W_PARIS]},
        tool("call0001a", "{\"temp\": 18, \"sky\": \"clear\"}"),
        a("18 degrees, clear."),
        u("And in Rome?"),
        {"role": "assistant", "tool_calls": [W_ROME]},
        tool("call0004d", "{\"temp\": 77, \"sky\": \"sun\"}"),
        a("77 F and sunny in Rome.")], True),
    # calls in a record without "tools"; "tool_calls": null on the answer,
    # as API logs have it, is no calls (Llama 3.1's template would fail on it)
    ("calls_without_tools", [
        u("Add 2 and 3."),
        {"role": "assistant", "tool_calls": [ADD]},
        tool("call0003c", "5"),
        {"role": "assistant", "content": "2 + 3 = 5.", "tool_calls": None}], False),
]

# (template, case): what energon says instead of training, and why
ERRORS = {
    # Llama 3.1 takes one call a turn: its template raises
    ("llama3.1", "parallel_calls"): "This model only supports single tool-calls at once!",
    # Mistral puts the tools before the LAST user message, so the first
    # round renders differently once a second question follows: the prefix
    # rule fails there, and a call turn has no content to look up
    ("mistral", "two_rounds"): "cannot find this assistant message",
    # and it writes the system message into the last user turn only when
    # that turn is the last message: the prefix render has it, the whole
    # conversation does not
    ("mistral", "parallel_calls"): "cannot find this assistant message",
}


def template_messages(msgs):
    """The messages as en_chat_tools_prepare hands them to a template that
    knows tools: arguments as objects, a missing content None, a null
    tool_calls left out."""
    out = copy.deepcopy(msgs)
    for m in out:
        if "tool_calls" in m and m["tool_calls"] is None:
            del m["tool_calls"]
        if m["role"] == "assistant" and "content" not in m:
            m["content"] = None
        for c in m.get("tool_calls") or []:
            f = c["function"]
            if isinstance(f["arguments"], str):
                f["arguments"] = json.loads(f["arguments"])
    return out


def call_texts(fmt, m):
    """Each call of assistant message m as the template writes it."""
    out = []
    for c in m.get("tool_calls") or []:
        f = c["function"]
        args = f["arguments"] if isinstance(f["arguments"], dict) else json.loads(f["arguments"])
        if fmt == "hermes":
            out.append('<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>'
                       % (f["name"], json.dumps(args)))
        elif fmt == "llama3":
            out.append('{"name": "%s", "parameters": %s}' % (f["name"], json.dumps(args)))
        else:
            out.append('{"name": "%s", "arguments": %s, "id": "%s"}'
                       % (f["name"], json.dumps(args), c["id"]))
    return out


def render(tok, src, msgs, tools, gen):
    return tok.apply_chat_template(msgs, tools=tools, chat_template=src, tokenize=False,
                                   add_generation_prompt=gen)


def spans_of(tok, src, msgs, tools, text):
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        p = render(tok, src, msgs[:i], tools, True)
        q = render(tok, src, msgs[:i + 1], tools, False)
        if not (text.startswith(p) and text.startswith(q) and len(q) > len(p)):
            return None
        spans.append((len(p), len(q)))
    return spans


def check_spans(fmt, msgs, text, spans):
    """The independent check: calls inside spans, tool results outside."""
    inside = lambda k, n: any(a <= k and k + n <= b for a, b in spans)  # noqa: E731
    for m in msgs:
        for t in call_texts(fmt, m):
            k = text.find(t)
            assert k >= 0 and inside(k, len(t)), (fmt, t)
        if m["role"] == "tool":
            body = m["content"]
            k = text.find(body if fmt != "llama3" else json.dumps(body))
            assert k >= 0 and not any(a < k + len(body) and k < b for a, b in spans), body


def one_case(tname, tok, src, fmt, name, msgs, with_tools):
    tools = TOOLS if with_tools else None
    rec = {"messages": msgs}
    if with_tools:
        rec["tools"] = TOOLS
    case = {"name": f"{tname}/{name}", "template": tname,
            "record": json.dumps(rec, ensure_ascii=False)}
    tm = template_messages(msgs)
    if (tname, name) in ERRORS:
        case["error"] = ERRORS[(tname, name)]
        try:  # the reason holds: the template raises, or the prefix rule fails
            text = render(tok, src, tm, tools, False)
            assert spans_of(tok, src, tm, tools, text) is None, case["name"]
        except jinja2.exceptions.TemplateError as e:
            assert case["error"] in str(e), (case["name"], e)
        return case
    text = render(tok, src, tm, tools, False)
    spans = spans_of(tok, src, tm, tools, text)
    assert spans is not None, case["name"]
    check_spans(fmt, msgs, text, spans)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= o[0] < b for a, b in spans)) for o in enc["offset_mapping"]]
    case.update({"text": text, "spans": [text[a:b] for a, b in spans],
                 "ids": enc["input_ids"], "mask": mask})
    return case


def main():
    cases, toks = [], {}
    for tname, (tfile, tokdir, fmt) in TEMPLATES.items():
        with open(os.path.join(SHARED, tfile), encoding="utf-8") as f:
            src = f.read()
        if tokdir not in toks:
            toks[tokdir] = AutoTokenizer.from_pretrained(os.path.join(SHARED, tokdir))
        for name, msgs, with_tools in CONVERSATIONS:
            cases.append(one_case(tname, toks[tokdir], src, fmt, name, msgs, with_tools))
    head = {"generator": "tests/gen/gen_data_tools_fixture.py",
            "transformers": transformers.__version__, "jinja2": jinja2.__version__,
            "templates": {k: {"file": v[0], "tokenizer": v[1], "format": v[2]}
                          for k, v in TEMPLATES.items()}}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:  # one case a line
        f.write(json.dumps(head, ensure_ascii=False, indent=1)[:-2] + ',\n "cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n ]\n}\n")
    n_err = sum("error" in c for c in cases)
    print(f"wrote {OUT}: {len(cases)} cases ({n_err} expected errors)")


if __name__ == "__main__":
    main()
