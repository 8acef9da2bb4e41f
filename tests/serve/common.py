"""common.py - helpers shared by the serving tests (tests/test_serve.sh).

Standard library only, except the `openai` client that the scripts using
it import themselves. Everything comes from the environment that
test_serve.sh sets:

  EN_URL          base URL of the main server (http://127.0.0.1:PORT)
  EN_SERVER_PID   its process id (for /proc/PID/status)
  EN_MODEL_DIR    the model directory it serves
  EN_MODEL_NAME   the --model-name it was given
  EN_CTX          its context size in tokens
  EN_ENERGON      the energon binary
  EN_FIXTURES     tests/fixtures
  EN_TMP          a scratch directory (removed by test_serve.sh)
  EN_ASAN         1 when the binary is an AddressSanitizer or ThreadSanitizer
                  build (slower; resident memory not comparable)
  EN_TSAN         1 when it is the second (load256.py says so)

Each script reports one line per check: "PASS name: figures" or
"FAIL name: what was expected and what came", then ends with
finish(), whose exit code is 0 only when nothing failed.
"""
import http.client as hc
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse

URL = os.environ.get("EN_URL", "")
PID = int(os.environ.get("EN_SERVER_PID", "0") or 0)
MODEL_DIR = os.environ.get("EN_MODEL_DIR", "")
MODEL = os.environ.get("EN_MODEL_NAME", "energon-test")
CTX = int(os.environ.get("EN_CTX", "512") or 512)
ENERGON = os.environ.get("EN_ENERGON", "energon")
FIXTURES = os.environ.get("EN_FIXTURES", "")
TMP = os.environ.get("EN_TMP", "/tmp")
ASAN = os.environ.get("EN_ASAN", "0") == "1"
# seconds: generous deadlines, scaled for the sanitizer build
SLOW = 6.0 if ASAN else 1.0

_counts = {"pass": 0, "fail": 0}


def _uncaught(etype, value, tb):
    """An exception that ends a script (e.g. the server went away) is a
    FAIL line too, after its traceback."""
    import traceback
    traceback.print_exception(etype, value, tb)
    name = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    print(f"FAIL {name}: stopped by {etype.__name__}: {short(str(value), 200)}", flush=True)


sys.excepthook = _uncaught


def check(cond, name, detail=""):
    """One PASS or FAIL line; returns cond so callers can chain."""
    tag = "PASS" if cond else "FAIL"
    _counts["pass" if cond else "fail"] += 1
    print(f"{tag} {name}" + (f": {detail}" if detail else ""), flush=True)
    return bool(cond)


def note(msg):
    print(f"  .. {msg}", flush=True)


def finish(script):
    print(f"{script}: {_counts['pass']} passed, {_counts['fail']} failed", flush=True)
    sys.exit(1 if _counts["fail"] else 0)


def short(x, n=160):
    s = x if isinstance(x, str) else repr(x)
    return s if len(s) <= n else s[:n] + "..."


# ---------------------------------------------------------------- raw HTTP

def split_url(url):
    u = urllib.parse.urlparse(url)
    return u.hostname, u.port


def http(method, path, body=None, headers=None, url=None, timeout=60.0):
    """One request on a new connection. body: dict/list (sent as JSON),
    str or bytes (sent as is). Returns (status, headers dict, body bytes)."""
    host, port = split_url(url or URL)
    conn = hc.HTTPConnection(host, port, timeout=timeout * SLOW)
    h = {"Connection": "close"}
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
        h["Content-Type"] = "application/json"
    elif body is not None:
        h["Content-Type"] = "application/json"
    if isinstance(body, str):
        body = body.encode()
    h.update(headers or {})
    try:
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        conn.close()


def http_json(method, path, body=None, headers=None, url=None, timeout=60.0):
    st, hd, data = http(method, path, body, headers, url, timeout)
    try:
        js = json.loads(data) if data else None
    except ValueError:
        js = None
    return st, js, data


def post(path, body, **kw):
    return http_json("POST", path, body, **kw)


def sse_events(resp):
    """Yield the data payloads of a Server-Sent Events response
    (http.client.HTTPResponse), as strings, until [DONE] or the end."""
    buf = b""
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.rstrip(b"\r\n")
        if line == b"":
            if buf:
                d = buf.decode()
                buf = b""
                if d == "[DONE]":
                    return
                yield d
            continue
        if line.startswith(b"data:"):
            chunk = line[5:]
            if chunk.startswith(b" "):
                chunk = chunk[1:]
            buf = buf + b"\n" + chunk if buf else chunk


def stream_post(path, body, url=None, timeout=60.0):
    """POST a streaming request; returns (conn, response) for the caller
    to read with sse_events and close."""
    host, port = split_url(url or URL)
    conn = hc.HTTPConnection(host, port, timeout=timeout * SLOW)
    conn.request("POST", path, body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()


def stream_collect(path, body, url=None):
    """Run a streaming request to the end: (status, list of parsed chunks)."""
    conn, r = stream_post(path, body, url)
    try:
        if r.status != 200:
            return r.status, [json.loads(r.read() or b"null")]
        return 200, [json.loads(d) for d in sse_events(r)]
    finally:
        conn.close()


# ------------------------------------------------------------ server bits

def health(url=None):
    try:
        st, _, _ = http("GET", "/health", url=url, timeout=5)
        return st
    except OSError:
        return None


_metric_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metrics(url=None):
    """Parse /metrics (Prometheus text format) into a list of
    (name, labels dict, value)."""
    st, _, data = http("GET", "/metrics", url=url, timeout=10)
    if st != 200:
        raise RuntimeError(f"/metrics answered {st}")
    out = []
    for line in data.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        m = _metric_re.match(line)
        if not m:
            continue
        labels = dict(_label_re.findall(m.group(3) or ""))
        out.append((m.group(1), labels, float(m.group(4))))
    return out


def metric(ms, name, **labels):
    """Sum of the samples called name whose labels include `labels`;
    None when there is no such sample at all."""
    vals = [v for n, l, v in ms if n == name and all(l.get(k) == str(x) for k, x in labels.items())]
    return sum(vals) if vals else None


def proc_status(pid=None):
    """VmRSS (kB) and thread count of a process, from /proc/PID/status."""
    out = {}
    with open(f"/proc/{pid or PID}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "Threads"):
                out[k] = int(v.split()[0])
    return out


def n_fds(pid=None):
    return len(os.listdir(f"/proc/{pid or PID}/fd"))


def alive(pid=None):
    try:
        os.kill(pid or PID, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by test_serve.sh) is not alive
    try:
        with open(f"/proc/{pid or PID}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    """A second `energon serve` (with other options than the main one) on
    an ephemeral port (--port 0, read back from its "listening on" line);
    stop() sends SIGTERM and returns the exit code."""

    def __init__(self, name, *args):
        self.log = os.path.join(TMP, f"server-{name}.log")
        cmd = [ENERGON, "serve", "--model", MODEL_DIR, "--port", "0", "--threads", "1", *args]
        self.logf = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT)
        self.url = None
        deadline = time.time() + 60 * SLOW
        while time.time() < deadline and self.proc.poll() is None:
            if self.url is None:
                m = re.search(r"listening on (http://\S+:\d+)", open(self.log).read())
                if m:
                    self.url = m.group(1)
            elif health(self.url) == 200:
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server {name} did not start ({' '.join(cmd)}):\n" + self.tail())

    @property
    def pid(self):
        return self.proc.pid

    def tail(self, n=20):
        try:
            return "".join(open(self.log).readlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout * SLOW)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()
        return self.proc.returncode


def openai_client(url=None, key="sk-no-key-needed", timeout=120.0):
    import openai
    return openai.OpenAI(base_url=(url or URL) + "/v1", api_key=key, max_retries=0,
                         timeout=timeout * SLOW)


def story_text():
    with open(os.path.join(FIXTURES, "text", "unseen_train.txt")) as f:
        return f.read()


def tokenize(text, url=None):
    """Number of tokens /tokenize counts for a completions prompt."""
    st, js, data = post("/tokenize", {"model": MODEL, "prompt": text}, url=url)
    if st != 200 or not isinstance(js, dict):
        raise RuntimeError(f"/tokenize answered {st}: {short(data)}")
    if "count" in js:
        return int(js["count"])
    return len(js["tokens"])


def error_shape(js):
    """None when js is an OpenAI error body, else what is wrong with it."""
    if not isinstance(js, dict) or not isinstance(js.get("error"), dict):
        return "no {'error': {...}} object"
    e = js["error"]
    missing = [k for k in ("message", "type", "param", "code") if k not in e]
    if missing:
        return f"error object lacks {missing}"
    if not isinstance(e["message"], str) or not e["message"]:
        return "error.message is not a non-empty string"
    if not isinstance(e["type"], str) or not e["type"]:
        return "error.type is not a non-empty string"
    return None
