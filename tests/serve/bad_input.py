"""bad_input.py - malformed and hostile requests over raw HTTP (issue 5,
"What it must show" 3): each gets the right status and an OpenAI-shaped
error body {"error": {"message", "type", "param", "code"}}; afterwards the
server still gives the same answer as before, /health is 200 and the
process never died. A second server with --api-key covers 401.
"""
import json
import select
import socket
import time

from common import (CTX, MODEL, PID, SLOW, URL, Server, alive, check, error_shape, finish, health, http,
                    http_json, post, short, split_url)

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
MSGS = [{"role": "user", "content": "Where does the otter live?"}]
REF_REQ = {"model": MODEL, "messages": MSGS, "temperature": 0, "max_tokens": 24}

st, ref, raw = post(CHAT, REF_REQ)
if not check(st == 200, "reference chat request before the suite", f"{st} {short(raw)}"):
    finish("bad_input")
ref_text = ref["choices"][0]["message"]["content"]


def chat_body(**kw):
    b = {"model": MODEL, "messages": MSGS, "max_tokens": 8}
    b.update(kw)
    return b


def expect(name, want, method, path, body=None, headers=None, code=None, url=None, param=None):
    try:
        st, js, raw = http_json(method, path, body, headers, url=url)
    except OSError as e:
        return check(False, name, f"want {want}, connection error {e}")
    shape = error_shape(js)
    ok = st == want and shape is None
    if code is not None and shape is None:
        ok = ok and js["error"].get("code") == code
    if param is not None and shape is None:
        ok = ok and js["error"].get("param") == param
    detail = f"{st}"
    if shape is None:
        e = js["error"]
        detail += f" type={e['type']} code={e['code']} param={e['param']}: {short(e['message'], 90)}"
    else:
        detail += f" ({shape}) body {short(raw, 120)}"
    if not ok:
        detail = (f"want {want}" + (f" code {code}" if code else "") +
                  (f" param {param}" if param else "") + f", got {detail}")
    return check(ok, name, detail)


# ---- malformed bodies and wrong types
expect("malformed JSON", 400, "POST", CHAT, '{"model": "%s", "messages": [' % MODEL)
expect("body is not an object", 400, "POST", CHAT, "[1, 2, 3]")
expect("empty body", 400, "POST", CHAT, "")
expect("messages is a string", 400, "POST", CHAT, chat_body(messages="hello"))
expect("message without content", 400, "POST", CHAT, chat_body(messages=[{"role": "user"}]))
expect("content is a number", 400, "POST", CHAT, chat_body(messages=[{"role": "user", "content": 5}]))
expect("temperature \"hot\"", 400, "POST", CHAT, chat_body(temperature="hot"))
expect("max_tokens 1.5", 400, "POST", CHAT, chat_body(max_tokens=1.5))
expect("max_tokens \"8\"", 400, "POST", CMPL, {"model": MODEL, "prompt": "Hi", "max_tokens": "8"})
expect("stream \"yes\"", 400, "POST", CHAT, chat_body(stream="yes"))
expect("seed \"abc\"", 400, "POST", CHAT, chat_body(seed="abc"))
expect("stop is a number", 400, "POST", CHAT, chat_body(stop=7))
# ---- numbers out of range
expect("max_tokens 1e30", 400, "POST", CHAT, '{"model": "%s", "messages": %s, "max_tokens": 1e30}'
       % (MODEL, json.dumps(MSGS)))
expect("max_tokens 1e30 (completions)", 400, "POST", CMPL,
       '{"model": "%s", "prompt": "Hi", "max_tokens": 1e30}' % MODEL)
expect("max_tokens 2^63", 400, "POST", CHAT, chat_body(max_tokens=2 ** 63))
expect("max_tokens -5", 400, "POST", CHAT, chat_body(max_tokens=-5))
expect("max_tokens 0", 400, "POST", CHAT, chat_body(max_tokens=0), param="max_tokens")
expect("temperature -1", 400, "POST", CHAT, chat_body(temperature=-1))
expect("top_p 2", 400, "POST", CHAT, chat_body(top_p=2))
expect("top_p 0", 400, "POST", CMPL, {"model": MODEL, "prompt": "Hi", "top_p": 0})
expect("n 0", 400, "POST", CHAT, chat_body(n=0))
expect("n -1", 400, "POST", CMPL, {"model": MODEL, "prompt": "Hi", "n": -1})
expect("n 100000", 400, "POST", CHAT, chat_body(n=100000), param="n")
expect("n 17 (completions)", 400, "POST", CMPL, {"model": MODEL, "prompt": "Hi", "n": 17},
       param="n")
expect("presence_penalty 5", 400, "POST", CHAT, chat_body(presence_penalty=5))
expect("top_logprobs 21", 400, "POST", CHAT, chat_body(logprobs=True, top_logprobs=21),
       param="top_logprobs")
expect("logprobs 6 (completions)", 400, "POST", CMPL,
       {"model": MODEL, "prompt": "Hi", "logprobs": 6}, param="logprobs")
expect("17 stop strings", 400, "POST", CHAT, chat_body(stop=[f"s{i}" for i in range(17)]),
       param="stop")
expect("a stop string of 257 bytes", 400, "POST", CMPL,
       {"model": MODEL, "prompt": "Hi", "stop": ["ok", "x" * 257]}, param="stop[1]")
expect("temperature NaN (bare token)", 400, "POST", CHAT,
       '{"model": "%s", "messages": %s, "temperature": NaN}' % (MODEL, json.dumps(MSGS)))
# ---- messages
expect("empty messages", 400, "POST", CHAT, chat_body(messages=[]))
expect("unknown role", 400, "POST", CHAT, chat_body(messages=[{"role": "wizard", "content": "hi"}]))
expect("missing messages", 400, "POST", CHAT, {"model": MODEL, "max_tokens": 8})
expect("missing prompt (completions)", 400, "POST", CMPL, {"model": MODEL, "max_tokens": 8})
expect("prompt is an object (completions)", 400, "POST", CMPL, {"model": MODEL, "prompt": {"a": 1}})
expect("bad request with stream true is an error, not a stream", 400, "POST", CHAT,
       chat_body(stream=True, temperature=-1))
# ---- bytes
expect("invalid UTF-8 in content", 400, "POST", CHAT,
       b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "caf\xe9 \xff\xfe"}]}')
expect("lone surrogate escape in content", 400, "POST", CHAT,
       '{"model": "%s", "messages": [{"role": "user", "content": "a\\ud800b"}]}' % MODEL)
# ---- context
long_prompt = "the otter rang the brass bell " * CTX
expect("prompt over the context (chat)", 400, "POST", CHAT,
       chat_body(messages=[{"role": "user", "content": long_prompt}]),
       code="context_length_exceeded", param="messages")
expect("prompt over the context (completions)", 400, "POST", CMPL,
       {"model": MODEL, "prompt": long_prompt, "max_tokens": 4}, code="context_length_exceeded",
       param="prompt")
expect("prompt + max_tokens over the context", 400, "POST", CMPL,
       {"model": MODEL, "prompt": "the otter", "max_tokens": CTX}, code="context_length_exceeded",
       param="prompt")
# ---- model, paths, methods
expect("unknown model", 404, "POST", CHAT, chat_body(model="gpt-17"))
expect("unknown model (completions)", 404, "POST", CMPL, {"model": "gpt-17", "prompt": "Hi"})
expect("unknown path", 404, "GET", "/v1/nothing-here")
expect("unknown POST path", 404, "POST", "/v2/chat/completions", chat_body())
expect("GET on a POST endpoint", 405, "GET", CHAT)
expect("GET on /v1/completions", 405, "GET", CMPL)
expect("POST on /v1/models", 405, "POST", "/v1/models", {})
expect("DELETE on /health", 405, "DELETE", "/health")


def read_until_closed(s, timeout):
    """Everything the server sends until it closes (or timeout s of silence); closes s."""
    resp = b""
    s.settimeout(timeout)
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            resp += d
    except OSError:
        pass
    s.close()
    return resp


# ---- a 10 MB body: 413. The server may answer before reading it all and
# close; read whatever status line comes back while sending.
def huge_body(n_bytes):
    host, port = split_url(URL)
    s = socket.create_connection((host, port), timeout=30)
    filler = "x" * 1024
    head = ('{"model": "%s", "messages": [{"role": "user", "content": "' % MODEL).encode()
    tail = b'"}]}'
    n_fill = (n_bytes - len(head) - len(tail)) // len(filler)
    total = len(head) + n_fill * len(filler) + len(tail)
    s.sendall((f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {total}\r\nConnection: close\r\n\r\n").encode() + head)
    chunk = (filler * 64).encode()
    sent = 0
    try:
        while sent < n_fill:
            r, _, _ = select.select([s], [], [], 0)
            if r:
                break
            k = min(64, n_fill - sent)
            s.sendall(chunk[:k * len(filler)])
            sent += k
        else:
            s.sendall(tail)
    except OSError:
        pass
    resp = read_until_closed(s, 10)
    return resp, sent * len(filler)


resp, sent = huge_body(10 * 1024 * 1024)
head, _, body = resp.partition(b"\r\n\r\n")
status = head.split(b" ")[1].decode() if head.startswith(b"HTTP/") else "none"
try:
    js = json.loads(body) if body else None
except ValueError:
    js = None
shape = error_shape(js)
check(status == "413" and shape is None, "10 MB body: 413 with an error body",
      f"{status} after {sent / 1e6:.1f} MB sent, {'OpenAI error body' if shape is None else shape}: "
      f"{short(body, 100)}")

# ---- request smuggling (issue 31, finding 6): framing that two parsers could
# read two ways gets 400 invalid_framing and the connection is closed, so the
# bytes after it (here a pipelined GET /health) are never read as a request.
def framing_case(headers):
    host, port = split_url(URL)
    body = json.dumps(chat_body()).encode()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    payload = (f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n" +
               "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode()
    payload += chunked if any(k == "Transfer-Encoding" for k, _ in headers) else body
    payload += f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    s = socket.create_connection((host, port), timeout=30)
    s.sendall(payload)
    return read_until_closed(s, 10 * SLOW)


body_len = len(json.dumps(chat_body()).encode())
# (the last: libmicrohttpd refuses a Content-Length that is not a number
# itself, with a 400 page of its own, and closes too)
for what, headers, ours in [
        ("Content-Length and Transfer-Encoding", [("Content-Length", body_len),
                                                   ("Transfer-Encoding", "chunked")], True),
        ("two equal Content-Lengths", [("Content-Length", body_len), ("Content-Length", body_len)], True),
        ("two different Content-Lengths", [("Content-Length", body_len), ("Content-Length", 3)], True),
        ("Transfer-Encoding gzip, chunked", [("Transfer-Encoding", "gzip, chunked")], True),
        ("Content-Length +N", [("Content-Length", f"+{body_len}")], False)]:
    t0 = time.time()
    resp = framing_case(headers)
    dt = time.time() - t0
    status = resp.split(b" ")[1].decode() if resp.startswith(b"HTTP/") else "none"
    head, _, rest = resp.partition(b"\r\n\r\n")
    js = None
    if ours:
        try:
            js = json.loads(rest)
        except ValueError:
            js = None
    shape = error_shape(js) if ours else None
    ok = (status == "400" and b" 200 " not in resp and b"connection: close" in head.lower()
          and dt < 5 * SLOW)
    if ours:
        ok = ok and shape is None and js["error"]["code"] == "invalid_framing"
    check(ok, f"{what}: 400{' invalid_framing' if ours else ''}, connection closed at once, "
          "the pipelined request unread", f"{status} in {dt:.2f} s, {short(rest, 120)}")

# ---- authentication (a second server with a key)
KEY = "sk-energon-badinput"
srv = Server("keyed-raw", "--api-key", KEY, "--model-name", MODEL)
try:
    expect("missing key", 401, "POST", CHAT, chat_body(), url=srv.url)
    expect("wrong key", 401, "POST", CHAT, chat_body(), headers={"Authorization": "Bearer nope"}, url=srv.url)
    expect("key without Bearer", 401, "POST", CHAT, chat_body(), headers={"Authorization": KEY}, url=srv.url)
    expect("missing key on /v1/models", 401, "GET", "/v1/models", url=srv.url)
    # authenticate first (finding 9): an over-limit Content-Length without the
    # key gets 401, so the limits are not told to strangers
    host, port = split_url(srv.url)
    s = socket.create_connection((host, port), timeout=30)
    s.sendall((f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {10 * 1024 * 1024}\r\n\r\n").encode())
    resp = read_until_closed(s, 10 * SLOW)
    status = resp.split(b" ")[1].decode() if resp.startswith(b"HTTP/") else "none"
    check(status == "401", "10 MB Content-Length without the key: 401 before 413", f"{status}")
    st, js, _ = http_json("POST", CHAT, REF_REQ, headers={"Authorization": f"Bearer {KEY}"}, url=srv.url)
    check(st == 200 and js["choices"][0]["message"]["content"] == ref_text, "right key: 200, same answer",
          f"{st}")
finally:
    srv.stop()

# ---- slow or half-sent requests time out (a second server with --timeout 2):
# headers cut short, and a body that stops halfway; each connection must be
# closed by the server (with or without a 408) within a few seconds, and the
# server must go on answering.
def half_sent(url, payload):
    host, port = split_url(url)
    s = socket.create_connection((host, port), timeout=30)
    t0 = time.time()
    s.sendall(payload)
    resp = read_until_closed(s, 20 * SLOW)
    return time.time() - t0, resp


srv = Server("timeout", "--timeout", "2", "--model-name", MODEL)
try:
    host, _ = split_url(srv.url)
    body = json.dumps(chat_body()).encode()
    cases = [("headers cut short", f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Ty".encode()),
             ("body stops halfway", (f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\n"
                                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
              .encode() + body[:len(body) // 2])]
    for what, payload in cases:
        dt, resp = half_sent(srv.url, payload)
        status = resp.split(b" ")[1].decode() if resp.startswith(b"HTTP/") else "closed"
        check(1.5 <= dt <= 2 + 8 * SLOW and status in ("closed", "408"),
              f"half-sent request ({what}) is dropped after --timeout 2", f"{status} after {dt:.2f} s")
    st, js, _ = http_json("POST", CHAT, REF_REQ, url=srv.url)
    check(st == 200 and js["choices"][0]["message"]["content"] == ref_text,
          "the --timeout server answers normally afterwards", f"{st}")
finally:
    srv.stop()

# ---- a client that drips its head one byte at a time is cut at the total
# deadline (--request-timeout 2), though it is never idle for --timeout 30
srv = Server("request-timeout", "--request-timeout", "2", "--timeout", "30", "--model-name", MODEL,
             "--max-client-connections", "4")
try:
    host, port = split_url(srv.url)
    s = socket.create_connection((host, port), timeout=30)
    head = f"GET /health HTTP/1.1\r\nHost: {host}\r\nX-Drip: {'a' * 200}\r\n\r\n".encode()
    t0 = time.time()
    closed_at = None
    for i in range(len(head)):
        try:
            s.sendall(head[i:i + 1])
            r, _, _ = select.select([s], [], [], 0.25)
            if r and not s.recv(4096):
                closed_at = time.time() - t0
                break
        except OSError:
            closed_at = time.time() - t0
            break
    s.close()
    check(closed_at is not None and 1.8 <= closed_at <= 2 + 2 * SLOW,
          "a client dripping its head a byte every 0.25 s is cut at --request-timeout 2",
          f"closed after {closed_at if closed_at is None else round(closed_at, 2)} s")
    st, _, data = http("GET", "/metrics", url=srv.url)
    cut = [l for l in data.decode().splitlines() if l.startswith("energon_http_request_timeouts_total")]
    check(cut and float(cut[0].split()[-1]) >= 1, "/metrics counts the cut connection", f"{cut}")
    # --max-client-connections 4: a fifth connection from this address is
    # closed at once; once the four go, new ones are served
    held = [socket.create_connection((host, port), timeout=10) for _ in range(4)]
    time.sleep(0.2)
    fifth = socket.create_connection((host, port), timeout=10)
    fifth.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    t0 = time.time()
    resp = read_until_closed(fifth, 5)
    check(not resp.startswith(b"HTTP/1.1 200") and time.time() - t0 < 2,
          "--max-client-connections 4: a fifth connection is refused at once",
          f"{short(resp, 60)} after {time.time() - t0:.2f} s")
    for h in held:
        h.close()
    time.sleep(0.3)
    st, js, _ = http_json("POST", CHAT, REF_REQ, url=srv.url)
    check(st == 200 and js["choices"][0]["message"]["content"] == ref_text,
          "the --request-timeout server answers normally afterwards", f"{st}")
finally:
    srv.stop()

# ---- the server is intact
check(alive(PID), "server process still alive after the bad-input suite", f"pid {PID}")
check(health() == 200, "/health 200 after the suite")
st, js, raw = post(CHAT, REF_REQ)
check(st == 200 and js["choices"][0]["message"]["content"] == ref_text,
      "normal request after the suite: same answer as before", f"{st} {short(raw, 100) if st != 200 else ''}")
# nothing the bad requests touched is left in the KV cache
time.sleep(0.2)
st, _, data = http("GET", "/metrics")
used = [l for l in data.decode().splitlines() if l.startswith("energon_kv_cache_blocks_used")]
check(used and float(used[0].split()[-1]) == 0, "no KV blocks held after the suite", f"{used}")

finish("bad_input")
