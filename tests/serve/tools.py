"""tools.py - OpenAI function tools through the official openai client
(issue 16, docs/tools.md), checked by Python alone:

  - tools with two functions and tool_choice="required": the answer is
    finish_reason "tool_calls" with calls whose arguments validate against
    their function's parameters (the jsonschema package); a second request
    carrying the call and a tool result gets a final answer; the same request
    streamed reassembles (delta.tool_calls by index) to the same calls;
  - a named function is the one called; parallel_tool_calls lets several
    calls come, each valid; tool_choice "none" gets text;
  - unconstrained temperature-0 answers sent beside tool requests equal
    their answers alone;
  - with the real templates of Qwen2.5 (hermes), Llama 3.1 (llama3) and
    Mistral v0.3 (mistral) given to a second server with --chat-template,
    the same holds in each format (mistral's ids are 9 characters, as its
    template demands);
  - a required call that repeats an earlier one of the answer ends it
    there (one call, finish "tool_calls", the repeat never streamed), and
    an answer cut by max_tokens anywhere in its third call returns its two
    whole calls (issue 31);
  - bad input is a 400 naming the field, and the server keeps answering.
The model is the suite's, served by a server of this script's own whose
copy of the model's config allows 2048 positions (the tools' descriptions
alone are ~700 of the 512-token tokenizer's tokens; rotary positions carry
no learned limit). Its template is a built-in one, so it runs the default
format (tools in the system message, <tool_call> blocks).
"""
import json
import os
import threading

import jsonschema

import common
from common import (MODEL, MODEL_DIR, SLOW, TMP, Server, check, finish, health, note,
                    openai_client, post, short)

SHARED = os.environ.get("EN_SHARED", "")
TEMPLATES = os.path.join(SHARED, "models", "real-tokenizers", "templates")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMA = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


def valid_calls(calls, names=None):
    """None when every call names a tool (of names) and its arguments
    validate, else what is wrong."""
    if not calls:
        return "no tool_calls"
    for c in calls:
        if c.type != "function" or not c.id:
            return f"call {c} lacks type/id"
        if c.function.name not in (names or SCHEMA):
            return f"called {c.function.name}"
        try:
            jsonschema.validate(json.loads(c.function.arguments), SCHEMA[c.function.name])
        except (ValueError, jsonschema.ValidationError) as e:
            return f"{c.function.name}({c.function.arguments}): {short(str(e), 120)}"
    return None


def reassemble(stream):
    """delta.tool_calls chunks joined by index: [(id, name, arguments)],
    the finish reason and the streamed content."""
    calls, finish_reason, content = {}, None, ""
    for ch in stream:
        if not ch.choices:
            continue
        c = ch.choices[0]
        content += c.delta.content or ""
        for d in c.delta.tool_calls or []:
            e = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            if d.id:
                e["id"] = d.id
            if d.function and d.function.name:
                e["name"] += d.function.name
            if d.function and d.function.arguments:
                e["arguments"] += d.function.arguments
        finish_reason = c.finish_reason or finish_reason
    return [calls[k] for k in sorted(calls)], finish_reason, content


def round_trip(client, model, tag, id_len=None):
    """required -> a call; the call and its result -> a final answer;
    streamed -> the same call."""
    kw = dict(model=model, tools=TOOLS, temperature=0, max_tokens=120, seed=3)
    r = client.chat.completions.create(messages=ASK, tool_choice="required",
                                       parallel_tool_calls=False, **kw)
    ch = r.choices[0]
    calls = ch.message.tool_calls
    bad = valid_calls(calls)
    check(ch.finish_reason == "tool_calls" and bad is None and len(calls) == 1,
          f"{tag}: required -> one valid call",
          f"{ch.finish_reason}, {bad or calls[0].function}")
    if bad:
        return
    if id_len:
        check(len(calls[0].id) == id_len and calls[0].id.isalnum(),
              f"{tag}: call ids of {id_len} letters and digits", calls[0].id)
    else:
        check(calls[0].id.startswith("call_"), f"{tag}: call id", calls[0].id)
    follow = ASK + [{"role": "assistant", "content": None,
                     "tool_calls": [c.model_dump() for c in calls]},
                    {"role": "tool", "tool_call_id": calls[0].id,
                     "content": json.dumps({"temperature": 21, "sky": "clear"})}]
    r2 = client.chat.completions.create(messages=follow, **kw)
    c2 = r2.choices[0]
    check(isinstance(c2.message.content, str) and c2.finish_reason in ("stop", "length"),
          f"{tag}: the tool's result -> a final answer",
          f"{c2.finish_reason}: {short(c2.message.content or c2.message.tool_calls, 80)}")
    s = client.chat.completions.create(messages=ASK, tool_choice="required",
                                       parallel_tool_calls=False, stream=True, **kw)
    got, fr, content = reassemble(s)
    want = [(calls[0].function.name, json.loads(calls[0].function.arguments))]
    have = [(g["name"], json.loads(g["arguments"])) for g in got]
    check(have == want and fr == "tool_calls" and got[0]["id"] and not content.strip(),
          f"{tag}: streamed delta.tool_calls reassemble to the same call",
          f"{fr}, {short(got, 120)}")


def named_parallel_none(client):
    kw = dict(model=MODEL, messages=ASK, tools=TOOLS, temperature=0, max_tokens=160)
    r = client.chat.completions.create(
        tool_choice={"type": "function", "function": {"name": "add"}}, **kw)
    calls = r.choices[0].message.tool_calls
    check(valid_calls(calls, ["add"]) is None, "named function: add is called",
          valid_calls(calls, ["add"]) or calls[0].function.arguments)
    r = client.chat.completions.create(tool_choice="required", parallel_tool_calls=True,
                                       temperature=1.0, seed=11, **{
                                           k: v for k, v in kw.items() if k != "temperature"})
    ch = r.choices[0]
    calls = ch.message.tool_calls
    check(valid_calls(calls) is None and ch.finish_reason in ("tool_calls", "length"),
          "parallel_tool_calls: every call valid",
          f"{len(calls or [])} calls, {ch.finish_reason}, {valid_calls(calls)}")
    r = client.chat.completions.create(tool_choice="none", **kw)
    m = r.choices[0].message
    check(not m.tool_calls and isinstance(m.content, str), "tool_choice none: text",
          short(m.content, 60))


def mixed_batch(client):
    """Unconstrained temperature-0 answers beside tool requests equal the
    same answers alone."""
    plain = [[{"role": "user", "content": q}] for q in
             ("Tell me a story about a cat.", "Once upon a time", "Lily and Tom went out.")]
    alone = [client.chat.completions.create(model=MODEL, messages=m, temperature=0,
                                            max_tokens=40).choices[0].message.content
             for m in plain]
    out, errs = {}, []

    def run(key, **kw):
        try:
            out[key] = client.chat.completions.create(model=MODEL, **kw)
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append(f"{key}: {e}")
    ts = [threading.Thread(target=run, args=(("plain", i),),
                           kwargs=dict(messages=m, temperature=0, max_tokens=40))
          for i, m in enumerate(plain)]
    ts += [threading.Thread(target=run, args=(("tool", i),),
                            kwargs=dict(messages=ASK, tools=TOOLS, tool_choice="required",
                                        temperature=1.0, seed=i, max_tokens=120))
           for i in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    same = [out[("plain", i)].choices[0].message.content == alone[i] for i in range(3)
            if ("plain", i) in out]
    check(not errs and len(same) == 3 and all(same),
          "temperature-0 answers beside 6 tool requests = alone", f"{same} {errs[:2]}")
    bad = [valid_calls(out[("tool", i)].choices[0].message.tool_calls) for i in range(6)
           if ("tool", i) in out]
    check(len(bad) == 6 and not any(bad), "the 6 batched tool requests: valid calls",
          short(bad, 160))


# issue 31: a function whose only call the grammar fixes (so every second
# call is a repeat of the first), and one whose argument varies.
PING = {"type": "function", "function": {
    "name": "ping", "description": "Ping.",
    "parameters": {"type": "object", "properties": {"x": {"type": "string", "enum": ["a"]}},
                   "required": ["x"], "additionalProperties": False}}}
PICK = {"type": "function", "function": {
    "name": "pick", "description": "Pick a number.",
    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}},
                   "required": ["n"], "additionalProperties": False}}}


def raw_text(choice):
    """The answer's text as generated, from its log-probabilities' tokens."""
    return "".join(e.token for e in choice.logprobs.content)


def repeated_calls(client):
    """tool_choice required with parallel calls allowed: after a call the
    grammar lets the model call again or stop, and a call that repeats an
    earlier one exactly ends the answer (finish "tool_calls", one call),
    streamed or not, instead of repeating until max_tokens."""
    kw = dict(model=MODEL, messages=ASK, tools=[PING], tool_choice="required",
              temperature=1.0, max_tokens=400, logprobs=True)
    repeats = 0
    for seed in range(8):
        r = client.chat.completions.create(seed=seed, **kw)
        ch = r.choices[0]
        calls = ch.message.tool_calls or []
        # the raw text shows whether the model started a second call
        repeats += raw_text(ch).count("<tool_call>") > 1
        check(len(calls) == 1 and ch.finish_reason == "tool_calls" and
              calls[0].function.name == "ping" and
              json.loads(calls[0].function.arguments) == {"x": "a"},
              f"seed {seed}: a repeated call ends the answer after one call",
              f"{len(calls)} calls, {ch.finish_reason}, "
              f"{r.usage.completion_tokens} tokens")
        got, fr, content = reassemble(client.chat.completions.create(
            seed=seed, stream=True, **{k: v for k, v in kw.items() if k != "logprobs"}))
        check(len(got) == 1 and fr == "tool_calls" and not content.strip() and
              json.loads(got[0]["arguments"]) == {"x": "a"},
              f"seed {seed} streamed: one call, the repeat never sent", f"{fr}, {short(got)}")
    check(repeats > 0, "the model did repeat its call (else the checks above prove nothing)",
          f"{repeats} of 8")


def no_repeat_loop(client, model, tag):
    """The case of issue 31 on SmolLM2: tool_choice required with parallel
    calls allowed (the default) made it repeat its call until max_tokens (6
    identical calls, finish "length"); the repeat now ends the answer: one
    call, finish "tool_calls", streamed or not."""
    kw = dict(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
              temperature=0, max_tokens=256, seed=3)
    r = client.chat.completions.create(**kw)
    ch = r.choices[0]
    calls = ch.message.tool_calls or []
    check(len(calls) == 1 and ch.finish_reason == "tool_calls" and valid_calls(calls) is None
          and r.usage.completion_tokens < 256,
          f"{tag}: parallel calls allowed, a repeated call ends the answer: one call",
          f"{len(calls)} calls, {ch.finish_reason}, {r.usage.completion_tokens} tokens")
    got, fr, content = reassemble(client.chat.completions.create(stream=True, **kw))
    check(len(got) == 1 and fr == "tool_calls" and not content.strip() and calls and
          json.loads(got[0]["arguments"]) == json.loads(calls[0].function.arguments),
          f"{tag}: streamed, the same one call", f"{fr}, {short(got)}")


def cut_third_call(client):
    """An answer of three or more different calls, cut by max_tokens anywhere
    in its third <tool_call> block (inside the marker too): the two whole
    calls, finish "length", streamed or not."""
    kw = dict(model=MODEL, messages=ASK, tools=[PICK], tool_choice="required",
              temperature=1.0)
    for seed in range(40):
        r = client.chat.completions.create(seed=seed, max_tokens=400, logprobs=True, **kw)
        ch = r.choices[0]
        if len(ch.message.tool_calls or []) >= 3:
            break
    else:
        check(False, "an answer of three different calls among 40 seeds")
        return
    want = [(c.function.name, json.loads(c.function.arguments))
            for c in ch.message.tool_calls[:2]]
    toks = [e.token for e in ch.logprobs.content]
    text, ends = "", []
    for k, t in enumerate(toks):
        text += t
        if text.count("</tool_call>") > len(ends):
            ends.append(k + 1)  # tokens up to and with the close
    bad = []
    for m in range(ends[1] + 1, ends[2]):
        r = client.chat.completions.create(seed=seed, max_tokens=m, **kw)
        c = r.choices[0]
        got = [(x.function.name, json.loads(x.function.arguments))
               for x in c.message.tool_calls or []]
        if got != want or c.finish_reason != "length":
            bad.append((m, len(got), c.finish_reason, short(c.message.content, 40)))
    check(not bad, f"seed {seed}: cut at each of the {ends[2] - ends[1] - 1} tokens of the "
          "third call: its two whole calls, finish length", short(bad, 200))
    m = (ends[1] + ends[2]) // 2
    got, fr, content = reassemble(client.chat.completions.create(
        seed=seed, max_tokens=m, stream=True, **kw))
    check([(g["name"], json.loads(g["arguments"])) for g in got] == want and fr == "length"
          and not content.strip(), "streamed, cut in the third call: the two whole calls",
          f"{fr}, {short(got)}")


def bad_input():
    base = {"model": MODEL, "messages": ASK, "max_tokens": 8}
    call = {"id": "call_1", "type": "function",
            "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}
    cases = [
        ("tools not a list", {"tools": {"type": "function"}}, "tools"),
        ("a tool that is not a function", {"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ("a function without a name", {"tools": [{"type": "function", "function": {}}]},
         "tools[0].function.name"),
        ("parameters not an object",
         {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
         "tools[0].function.parameters"),
        ("an invalid parameters schema", {"tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {
                "a": {"type": "strin"}}}}}], "tool_choice": "required"},
         "tools[0].function.parameters"),
        ("an unsupported keyword", {"tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {
                "a": {"type": "integer", "multipleOf": 3}}}}}], "tool_choice": "required"},
         "tools[0].function.parameters"),
        ("tool_choice naming no tool", {"tools": TOOLS, "tool_choice": {
            "type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
        ("tool_choice required without tools", {"tool_choice": "required"}, "tool_choice"),
        ("tool_choice nonsense", {"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
        ("a tool message with an unknown tool_call_id", {"tools": TOOLS, "messages": ASK + [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_2", "content": "3"}]},
         "messages[2].tool_call_id"),
        ("a tool message without tool_call_id", {"messages": ASK + [
            {"role": "tool", "content": "3"}]}, "messages[1].tool_call_id"),
        ("arguments that are not JSON", {"messages": ASK + [
            {"role": "assistant", "content": None, "tool_calls": [
                dict(call, function={"name": "add", "arguments": "{a:"})]}]},
         "messages[1].tool_calls[0].function.arguments"),
        ("response_format beside a required call", {
            "tools": TOOLS, "tool_choice": "required",
            "response_format": {"type": "json_object"}}, "tool_choice"),
    ]
    for name, extra, param in cases:
        st, js, data = post("/v1/chat/completions", dict(base, **extra))
        got = (js or {}).get("error", {}).get("param") if isinstance(js, dict) else None
        check(st == 400 and got == param, f"bad input: {name} -> 400 on {param}",
              f"{st} {got}: {short(data, 140)}")
    check(health() == 200, "the server keeps serving after the bad requests")


def formats():
    if not os.path.isdir(TEMPLATES):
        note(f"the real templates are not under {TEMPLATES}: the format servers are skipped")
        return
    for tag, file, id_len in (("hermes (Qwen2.5)", "qwen2.5-instruct.jinja", None),
                              ("llama3 (Llama 3.1)", "llama-3.1-instruct.jinja", None),
                              ("mistral (v0.3)", "mistral-7b-instruct-v0.3.jinja", 9)):
        srv = Server("tools-" + file.split(".jinja")[0], "--model-name", MODEL,
                     "--chat-template", os.path.join(TEMPLATES, file))
        try:
            log = open(srv.log).read()
            check(file in log, f"{tag}: the server renders with {file}", short(log[-200:]))
            round_trip(openai_client(srv.url), MODEL, tag, id_len)
        finally:
            srv.stop()


def long_context_model():
    """MODEL_DIR's files, its config allowing 2048 positions."""
    d = os.path.join(TMP, "tools-model")
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(MODEL_DIR):
        if f != "config.json" and not os.path.exists(os.path.join(d, f)):
            os.symlink(os.path.join(MODEL_DIR, f), os.path.join(d, f))
    cfg = json.load(open(os.path.join(MODEL_DIR, "config.json")))
    cfg["max_position_embeddings"] = 2048
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    return d


def main():
    common.MODEL_DIR = long_context_model()  # Server() serves it
    main_srv = Server("tools", "--model-name", MODEL)
    common.URL = main_srv.url  # post() and health() ask it
    try:
        run(openai_client(main_srv.url))
    finally:
        main_srv.stop()
    return finish("tools")


def run(client):
    round_trip(client, MODEL, "default format")
    named_parallel_none(client)
    mixed_batch(client)
    repeated_calls(client)
    cut_third_call(client)
    bad_input()
    formats()
    note(f"SLOW={SLOW}")


if __name__ == "__main__":
    raise SystemExit(main())
