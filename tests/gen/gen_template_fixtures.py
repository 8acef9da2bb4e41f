#!/usr/bin/env python3
"""gen_template_fixtures.py - expected renders of chat templates for tests/test_jinja.c.

Renders every real chat template under ../shared/models (the Hugging Face
templates of Llama 3.1/3.2, Qwen2.5, Qwen3, Mistral, Gemma, Phi-3,
DeepSeek-R1-Distill, SmolLM2, TinyLlama) with transformers'
render_jinja_template on several conversations (system + user, several
turns, tools with tool calls and tool results, reasoning content,
enable_thinking, non-ASCII text), with and without add_generation_prompt,
and a table of small feature templates through the same jinja2
environment. strftime_now is pinned to NOW (UTC) so that the C renderer,
given config.now = NOW, must agree.

Each fixture records the variables the template saw (captured at
template.render, after transformers' own preprocessing) and the expected
text, or the error when the template raises. The templates themselves are
not copied: fixtures name them by path under the shared folder.

Pinned: transformers 5.24.0, jinja2 3.1.6.
Usage: python3 tests/gen/gen_template_fixtures.py [SHARED_DIR]
"""
import datetime as _dt
import json
import os
import sys

import jinja2
import transformers
import transformers.utils.chat_template_utils as ctu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared")
OUT = os.path.join(ROOT, "tests", "fixtures", "templates")
NOW = 1721995200  # 2024-07-26 12:00:00 UTC


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return _dt.datetime.fromtimestamp(NOW, _dt.timezone.utc).replace(tzinfo=None)


ctu.datetime = _FixedDatetime  # strftime_now reads the module's datetime

_captured = {}
_real_compile = ctu._compile_jinja_template


class _Recorder:
    def __init__(self, tmpl):
        self.tmpl = tmpl
        self.environment = tmpl.environment

    def render(self, **kw):
        _captured["vars"] = json.loads(json.dumps(kw, ensure_ascii=False))
        return self.tmpl.render(**kw)


ctu._compile_jinja_template = lambda src: _Recorder(_real_compile(src))

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city, in Celsius or Fahrenheit.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. \"Paris\" or \"São Paulo\""},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search",
        "description": "Search the web & return the top <n> results.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "n": {"type": "integer", "default": 3}},
            "required": ["query"]}}},
]
TOOL_ARGS = {"city": "Paris", "unit": "celsius"}

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello! What can you do?"}
A1 = {"role": "assistant", "content": "I can answer questions and help with writing."}
U2 = {"role": "user", "content": "Write a haiku about the sea."}
UNI = {"role": "user", "content": "Héllo 👋 世界 — \"quotes\" 'single' \\backslash\\ <tag> & amp\ttab\nnew line  "}
AUNI = {"role": "assistant", "content": "  Ответ: ✓ 中文 émoji 🎉 <b>&</b>  "}

CONVERSATIONS = {
    "system_user": [SYS, U1],
    "user_only": [U1],
    "multi_turn": [SYS, U1, A1, U2],
    "multi_turn_nosys": [U1, A1, U2],
    "unicode": [SYS, UNI, AUNI, UNI],
    "think_in_content": [U1, {"role": "assistant", "content": "<think>\nLet me think.\n</think>\n\nI can help."}, U2],
    "reasoning_content": [U1, {"role": "assistant", "content": "I can help.",
                                "reasoning_content": "The user greets me."}, U2],
    "tool_call": [SYS, {"role": "user", "content": "What's the weather in Paris?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [{"id": "call12345", "type": "function",
                                   "function": {"name": "get_weather", "arguments": TOOL_ARGS}}]},
                  {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
                   "content": "{\"temperature\": 22, \"sky\": \"clear\"}"},
                  {"role": "assistant", "content": "It is 22 °C and clear in Paris."}],
    "tool_call_pending": [{"role": "user", "content": "Weather in Paris?"},
                          {"role": "assistant", "content": "",
                           "tool_calls": [{"id": "call12345", "type": "function",
                                           "function": {"name": "get_weather",
                                                        "arguments": TOOL_ARGS}}]},
                          {"role": "tool", "tool_call_id": "call12345", "content": "22 degrees"}],
    "bad_roles": [U1, U2],
}

# template file stem -> (extra kwargs variants)
TEMPLATES = [
    "llama-3.1-instruct", "llama-3.2-instruct", "qwen2.5-instruct", "qwen3", "qwen3-initial-2504",
    "mistral-7b-instruct-v0.3", "mistral-nemo-instruct-2407", "gemma-2-it", "gemma-3-it",
    "phi-3-mini-4k-instruct", "phi-3.5-mini-instruct", "deepseek-r1-distill-qwen",
    "deepseek-r1-distill-qwen-2501", "smollm2-instruct", "tinyllama-1.1b-chat-v1.0",
]


def render(src, messages, tools=None, add_generation_prompt=False, **kwargs):
    _captured.clear()
    try:
        out, _ = ctu.render_jinja_template(conversations=[messages], tools=tools, chat_template=src,
                                           add_generation_prompt=add_generation_prompt, **kwargs)
        return {"vars": _captured.get("vars"), "expected": out[0]}
    except jinja2.exceptions.TemplateSyntaxError as e:
        return {"vars": _captured.get("vars", {}), "error": str(e), "error_type": "TemplateSyntaxError"}
    except Exception as e:  # the template raised (raise_exception, undefined, type errors)
        return {"vars": _captured.get("vars"), "error": str(e), "error_type": type(e).__name__}


def special_tokens(stem):
    toks = json.load(open(os.path.join(SHARED, "models/real-tokenizers/templates/special_tokens.json")))
    return {k: v for k, v in toks[stem].items() if k.endswith("_token") and v is not None}


def real_cases(rel, src, tokens, thinking):
    cases = []
    for conv_name, messages in CONVERSATIONS.items():
        with_tools = conv_name.startswith("tool")
        for agp in (False, True):
            variants = [{}] if not thinking else [{}, {"enable_thinking": False}, {"enable_thinking": True}]
            for extra in variants:
                r = render(src, json.loads(json.dumps(messages)), tools=TOOLS if with_tools else None,
                           add_generation_prompt=agp, **tokens, **extra)
                if r.get("vars") is None:
                    continue  # failed before the template ran
                name = f"{conv_name}{'_agp' if agp else ''}"
                if extra:
                    name += f"_thinking_{str(extra['enable_thinking']).lower()}"
                cases.append({"name": name, **r})
    # tools offered but not called yet
    r = render(src, [SYS, {"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
               add_generation_prompt=True, **tokens)
    if r.get("vars") is not None:
        cases.append({"name": "tools_offered_agp", **r})
    return cases


FEATURES = [
    # whitespace control and trim/lstrip
    ("ws_trim_lstrip", "a\n  {% if true %}\n  x\n  {% endif %}\nb\n", {}),
    ("ws_minus", "a  {%- if true -%}  x  {%- endif -%}  b", {}),
    ("ws_var_minus", "a \n {{- 'x' -}} \n b", {}),
    ("ws_plus", "a\n  {%+ if true %}x{% endif %}\n", {}),
    ("ws_comment", "a\n  {# note #}\nb {#- c -#} c", {}),
    ("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\r\n", {}),
    ("ws_trailing_newlines", "x\n\n", {}),
    ("raw_block", "{% raw %}{{ not parsed }}{% endraw %}!", {}),
    # loops
    ("for_loop_vars", "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.length }}/{{ loop.revindex }}/{{ loop.first }}/{{ loop.last }}/{{ loop.previtem }}/{{ loop.nextitem }};{% endfor %}", {"xs": ["a", "b", "c"]}),
    ("loop_cycle", "{% for x in 'abcde' %}{{ loop.cycle('odd', 'even') }}{{ x }} {% endfor %}", {}),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("for_filter", "{% for i in range(10) if i is odd %}{{ i }}{{ loop.length }},{% endfor %}", {}),
    ("for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d | dictsort %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": [1, 2]}}),
    ("for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"x": 1, "y": 2}}),
    ("for_string", "{% for ch in 'héllo' %}[{{ ch }}]{% endfor %}", {}),
    ("break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("loop_scope", "{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = 5 %}{{ x }},{% endfor %}{{ x }}", {}),
    ("loop_scope2", "{% for i in range(3) %}{% if i == 1 %}{% set y = 5 %}{% endif %}{{ y }},{% endfor %}{{ y }}", {}),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}", {}),
    # set, namespace, macros, blocks
    ("namespace", "{% set ns = namespace(a=1, b='x') %}{% set ns.a = ns.a + 1 %}{% set ns.c = [1] %}{{ ns.a }}{{ ns.b }}{{ ns.c }}{% for i in range(3) %}{% set ns.a = ns.a * 2 %}{% endfor %}{{ ns.a }}", {}),
    ("set_tuple", "{% set a, b = 1, 'two' %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}", {}),
    ("set_block", "{% set x %}in {{ 'block' }}{% endset %}[{{ x }}]{% set y | upper %}up{% endset %}{{ y }}", {}),
    ("macro", "{% macro f(a, b=2, c='z') %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ f(1) }}{{ f(1, 3) }}{{ f(1, c='w') }}{{ f }}", {}),
    ("macro_recursive", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(6) }}", {}),
    ("filter_block", "{% filter upper %}abc {{ 'd' }}{% endfilter %}|{% filter trim|title %}  hello world  {% endfilter %}", {}),
    ("generation_block", "{% generation %}gen {{ 1 + 1 }}{% endgeneration %}!", {}),
    # expressions
    ("literals", "{{ 'a\\tb\\n' }}{{ \"dq\" }}{{ 1 }}{{ -2 }}{{ 1.5 }}{{ true }}{{ False }}{{ none }}{{ None }}{{ [1, 'a', none, true] }}{{ {'k': 'v', 'n': 1} }}{{ (1,) }}{{ (1, 2) }}{{ () }}", {}),
    ("string_escapes", "{{ '\\u00e9\\x41\\101\\'\\\"\\\\' }}|{{ 'adj' 'acent' }}", {}),
    ("numbers", "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }} {{ true + 1 }} {{ 5.5 % 2 }} {{ -5.5 % 2 }} {{ 10.0 // 4 }}", {}),
    ("float_print", "{{ 1.0 }} {{ 1e20 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ -0.0 }} {{ 123456.789 }} {{ 2.5e-5 }} {{ 1.5e300 * 1e10 }} {{ x }} {{ y }}", {"x": 3.0, "y": 1e-7}),
    ("int_big", "{{ 10 ** 18 }} {{ 9007199254740993 }} {{ n }}", {"n": 123456789012345678}),
    ("compare", "{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] == [1, 2] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ [1, 2] < [1, 3] }} {{ 'a' != 'b' }} {{ none == none }}", {}),
    ("in_ops", "{{ 'ab' in 'cabd' }} {{ 1 in [1, 2] }} {{ 'a' in {'a': 1} }} {{ 3 not in [1, 2] }} {{ 'x' not in 'abc' }} {{ 'x' in missing }}", {}),
    ("logic", "{{ 1 and 'x' }}|{{ 0 and 'x' }}|{{ '' or 'd' }}|{{ 'a' or 'b' }}|{{ not none }}|{{ 'y' if 0 else 'n' }}|{{ 'y' if 1 }}|{{ 'y' if 0 }}|", {}),
    ("concat", "{{ 'a' ~ 1 ~ none ~ 1.5 ~ true ~ missing ~ [1] }}", {}),
    ("arith_concat", "{{ 'a' + 'b' }}{{ [1] + [2, 3] }}{{ (1, 2) + (3,) }}{{ 'ab' * 3 }}{{ [0] * 3 }}{{ 2 * 'x' }}", {}),
    ("percent_format", "{{ '%s and %d' % ('x', 3) }}|{{ '%s'|format('y') }}|{{ '%r' % 'q' }}", {}),
    ("slicing", "{{ xs[1:] }}{{ xs[:-1] }}{{ xs[::-1] }}{{ xs[-1] }}{{ xs[::2] }}{{ s[1:3] }}{{ s[::-1] }}{{ s[-2:] }}{{ xs[10:] }}{{ s[0] }}{{ xs[5] }}|", {"xs": [1, 2, 3, 4], "s": "héllo"}),
    ("attr_item", "{{ d.a }}{{ d['a'] }}{{ d.missing }}{{ d['missing'] }}{{ xs.0 }}{{ d['items'] }}{{ d.items()|list|length }}", {"d": {"a": 1, "items": "key"}, "xs": ["first"]}),
    ("undefined_print", "[{{ missing }}][{{ missing|string }}][{{ missing|trim }}][{{ missing|length }}][{{ missing|list }}][{{ missing|join(',') }}][{{ missing is defined }}][{{ missing is undefined }}][{{ not missing }}]{% for x in missing %}x{% endfor %}", {}),
    ("none_attr", "[{{ none.x }}][{{ 'abc'.nothing }}][{{ {}.x }}]", {}),
    ("default_filter", "{{ missing|default('d') }}{{ none|default('d') }}{{ none|default('d', true) }}{{ ''|d('e', true) }}{{ 'v'|default('d') }}{{ missing|default }}|", {}),
    # filters
    ("filters_string", "{{ '  x  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'Hello'|upper }}{{ 'Hello'|lower }}|{{ 'hello world'|capitalize }}|{{ 'hello wORLD-x(y'|title }}|{{ 'a-b-c'|replace('-', '+') }}|{{ 'a-b-c'|replace('-', '+', 1) }}|{{ 'a b  c'|wordcount }}|{{ '<a href=\"x\">&\\'</a>'|e }}|{{ 'x'|safe }}|{{ 42|string }}", {}),
    ("filters_length", "{{ 'héllo'|length }} {{ [1, 2]|count }} {{ {'a': 1}|length }} {{ range(5)|length }}", {}),
    ("filters_list", "{{ 'abc'|list }}{{ (1, 2)|list }}{{ range(3)|list }}{{ {'a': 1}|list }}{{ [3, 1, 2]|first }}{{ [3, 1, 2]|last }}{{ 'abc'|first }}{{ 'abc'|last }}", {}),
    ("filters_join", "{{ [1, 2, 3]|join(', ') }}|{{ ['a', 'b']|join }}|{{ users|join(', ', attribute='name') }}", {"users": [{"name": "x"}, {"name": "y"}]}),
    ("filters_select", "{{ msgs|selectattr('role', 'equalto', 'user')|list|length }}{{ msgs|rejectattr('role', 'equalto', 'user')|map(attribute='content')|list }}{{ [1, 2, 3, 4]|select('odd')|list }}{{ [1, 2, 3, 4]|reject('even')|list }}{{ msgs|selectattr('tool')|list }}{{ [0, 1, '', 'a']|select|list }}", {"msgs": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool": True}, {"role": "user", "content": "c"}]}),
    ("filters_map", "{{ ['a', 'b']|map('upper')|list }}{{ xs|map(attribute='n', default=0)|list }}{{ xs[:1]|map(attribute='n.m')|list }}", {"xs": [{"n": {"m": 1}}, {"k": 2}]}),
    ("filters_sort", "{{ [3, 1, 2]|sort }}{{ [3, 1, 2]|sort(reverse=true) }}{{ ['b', 'A', 'a', 'C']|sort }}{{ ['b', 'A', 'a']|sort(case_sensitive=true) }}{{ xs|sort(attribute='k')|map(attribute='v')|list }}", {"xs": [{"k": 2, "v": "two"}, {"k": 1, "v": "one"}, {"k": 2, "v": "two2"}]}),
    ("filters_misc", "{{ [1, 1, 2, 'A', 'a']|unique|list }}{{ [1, 2]|reverse|list }}{{ 'abc'|reverse }}{{ {'b': 1, 'a': 2}|dictsort }}{{ {'b': 1, 'a': 2}|dictsort(by='value') }}{{ {'b': 1, 'a': 2}|items|list }}{{ [1, 2, 3]|batch(2)|list }}{{ [1, 2, 3]|sum }}{{ [1, 5, 3]|max }}{{ [4, 2, 8]|min }}", {}),
    ("filters_numbers", "{{ 3.7|int }} {{ '42'|int }} {{ ' 7 '|int }} {{ '3.9'|int }} {{ 'x'|int }} {{ 'x'|int(5) }} {{ 3|float }} {{ '2.5'|float }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 3|round }} {{ 2.1|round(0, 'ceil') }} {{ -3|abs }} {{ -2.5|abs }} {{ true|int }}", {}),
    ("filters_indent", "[{{ 'a\\nb\\n\\nc'|indent }}][{{ 'a\\nb'|indent(2, true) }}][{{ 'a\\n\\nb'|indent(2, blank=true) }}][{{ 'x\\n'|indent(1) }}]", {}),
    ("tojson_basic", "{{ d|tojson }}", {"d": {"s": "é<&>'\"\\\n\t/", "i": 1, "f": 1.5, "f0": 2.0, "b": True, "n": None, "l": [1, [2, {}], []], "e": {}}}),
    ("tojson_indent", "{{ d|tojson(indent=2) }}|{{ [1, [2]]|tojson(indent=4) }}|{{ {}|tojson(indent=2) }}", {"d": {"a": 1, "b": {"c": [1, 2], "d": []}}}),
    ("tojson_options", "{{ d|tojson(sort_keys=true) }}|{{ d|tojson(separators=(',', ':')) }}|{{ 'é😀'|tojson(ensure_ascii=true) }}|{{ 'x'|tojson }}|{{ 3|tojson }}|{{ none|tojson }}|{{ (1, 2)|tojson }}", {"d": {"b": 1, "a": {"d": 1, "c": 2}}}),
    ("tojson_control_chars", "{{ s|tojson }}", {"s": "a\u0000b\u001fc\u007fd\u2028e"}),
    # tests
    ("tests_types", "{{ 'a' is string }}{{ 1 is number }}{{ true is number }}{{ 1 is integer }}{{ 1.0 is integer }}{{ true is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ none is none }}{{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}{{ 'x' is iterable }}{{ 1 is iterable }}{{ 'x' is sequence }}{{ true is true }}{{ 1 is true }}{{ false is false }}", {}),
    ("tests_values", "{{ 3 is odd }}{{ 3 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}{{ 1 is eq 1 }}{{ 1 is ne 1 }}{{ 'a' is in 'abc' }}{{ 2 is gt 1 }}{{ 2 is lt 1 }}{{ 1 is equalto 1 }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ x is not defined }}{{ x is not none }}", {}),
    # methods
    ("str_methods", "{{ 'Hello'.lower() }} {{ 'a-b'.replace('-', '+') }} {{ 'abc'.find('c') }} [{{ '  x '.rstrip() }}] [{{ '  x '.lstrip() }}] [{{ '\\n x \\n'.strip() }}] {{ 'xxaxx'.strip('x') }} {{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'ab'.upper() }} {{ 'aXbXc'.count('X') }} {{ '-'.join(['a', 'b']) }}", {}),
    ("str_split", "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a b c'.rsplit(' ', 1) }} {{ '</think>x'.split('</think>')[-1] }} {{ 'x'.split('y') }}", {}),
    ("str_format", "{{ '{}-{}'.format(1, 'b') }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='n') }} {{ '{{x}}'.format() }}", {}),
    ("dict_methods", "{{ d.get('a') }} {{ d.get('z', 'def') }} {{ d.get('z') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }}", {"d": {"a": 1, "b": "x"}}),
    ("globals", "{{ range(3)|list }}{{ range(1, 10, 3)|list }}{{ range(5, 0, -2)|list }}{{ dict(a=1, b='x') }}{{ namespace(a=1).a }}{{ strftime_now('%Y-%m-%d %H:%M %b %d %A') }}", {}),
    ("unicode_text", "{{ s }}|{{ s|length }}|{{ s|upper }}|{{ s[2:5] }}|{{ s|reverse }}", {"s": "Привет, 世界! 🎉 Ünïcödé"}),
    ("messages_loop", "{% for m in messages %}<{{ m.role }}>{{ m['content']|trim }}{% if not loop.last %}\n{% endif %}{% endfor %}", {"messages": [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}]}),
    ("repr_values", "{{ ['it\\'s', 'a\"b', 'both\\'\"', 'é\\n\\t\\\\', '\\x00\\x7f\\xa0\\u2028'] }}|{{ {'k': [1.5, none, true], 2: 'v'} }}|{{ namespace(a=1) }}|{{ range(2, 9, 3) }}|{{ messages }}", {"messages": [{"role": "user", "content": "hi ✓"}]}),
    ("loop_in_macro", "{% macro row(items) %}{% for x in items %}{{ loop.index }}:{{ x }}{{ ', ' if not loop.last }}{% endfor %}{% endmacro %}{% for r in rows %}[{{ row(r) }}]{% endfor %}", {"rows": [[1, 2], [], ["a"]]}),
    ("macro_sees_globals", "{% set g = 'top' %}{% macro f() %}{{ g }}{{ bos_token }}{% endmacro %}{{ f() }}", {"bos_token": "<s>"}),
    ("conditional_chain", "{% for m in ms %}{% if m.role == 'user' %}U{% elif m.role == 'assistant' and m.content %}A{% elif m.role == 'assistant' %}a{% else %}?{% endif %}{% endfor %}", {"ms": [{"role": "user"}, {"role": "assistant", "content": "x"}, {"role": "assistant", "content": ""}, {"role": "tool"}]}),
    ("whitespace_real_shape", "{%- for m in ms %}\n    {%- if m %}\n        {{- m }}\n    {%- endif %}\n{%- endfor %}\n{{ 'end' }}\n", {"ms": ["a", "", "b"]}),
    ("lstrip_var_not_stripped", "a\n    {{ 'x' }}\n    {% if true %}y{% endif %}\n", {}),
    # errors
    ("err_raise", "{{ raise_exception('Custom error: ' ~ 42) }}", {}),
    ("err_undefined_attr", "{{ missing.attr }}", {}),
    ("err_undefined_add", "{{ missing + 1 }}", {}),
    ("err_type_add", "{{ 'a' + 1 }}", {}),
    ("err_div_zero", "{{ 1 // 0 }}", {}),
    ("err_unknown_filter", "{{ 'a'|nofilter }}", {}),
    ("err_unknown_test", "{{ 1 is nosuchtest }}", {}),
    ("err_syntax_endfor", "{% if true %}x{% endfor %}", {}),
    ("err_syntax_unclosed", "{% for x in y %}", {}),
    ("err_syntax_expr", "{{ 1 + }}", {}),
    ("err_list_append", "{% set ns = namespace(a=[]) %}{% set _ = ns.a.append(1) %}{{ ns.a }}", {}),
    ("err_range_too_big", "{% for i in range(100000000) %}{% endfor %}", {}),
    ("err_tojson_undefined", "{{ missing|tojson }}", {}),
    ("err_namespace_underscore", "{% set ns = namespace() %}{% set ns._x = 1 %}", {}),
    ("err_not_iterable", "{% for x in 5 %}{% endfor %}", {}),
]


def feature_cases():
    cases = []
    for name, src, vars_ in FEATURES:
        try:
            tmpl = _real_compile(src)
        except jinja2.exceptions.TemplateError as e:
            cases.append({"name": name, "source": src, "vars": vars_, "error": str(e), "error_type": type(e).__name__})
            continue
        try:
            cases.append({"name": name, "source": src, "vars": vars_, "expected": tmpl.render(**vars_)})
        except Exception as e:
            cases.append({"name": name, "source": src, "vars": vars_, "error": str(e), "error_type": type(e).__name__})
    return cases


def write(name, obj):
    with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    meta = {"transformers": transformers.__version__, "jinja2": jinja2.__version__, "now": NOW}
    write("features.json", {**meta, "cases": feature_cases()})
    tdir = os.path.join(SHARED, "models/real-tokenizers/templates")
    for stem in TEMPLATES:
        rel = f"models/real-tokenizers/templates/{stem}.jinja"
        src = open(os.path.join(SHARED, rel), encoding="utf-8").read()
        thinking = stem.startswith("qwen3")
        cases = real_cases(rel, src, special_tokens(stem), thinking)
        write(f"{stem}.json", {**meta, "template": rel, "cases": cases})
    rel = "models/smollm2/tokenizer/chat_template.jinja"
    src = open(os.path.join(SHARED, rel), encoding="utf-8").read()
    write("smollm2-shared.json", {**meta, "template": rel,
                                  "cases": real_cases(rel, src, special_tokens("smollm2-instruct"), False)})
    print(f"wrote fixtures for {len(TEMPLATES) + 1} templates and {len(FEATURES)} features to {OUT}")


if __name__ == "__main__":
    main()
