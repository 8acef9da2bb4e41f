#!/usr/bin/env bash
# test_structured_smollm2.sh ENERGON FIXTURES SHARED
# Structured output and tools on a real instruct model (issue 16):
# SmolLM2-135M-Instruct served from its GGUF file (quantised tensors kept,
# its own chat template, which knows no tools: the default tool format),
# driven by the official openai client:
#   - tests/serve/schema_load.py: 200 json_schema requests over 10 schemas,
#     half streamed, 48 at a time with 8 unconstrained temperature-0 ones:
#     every answer ends by itself and validates (jsonschema), the plain ones
#     equal their answers alone;
#   - tests/serve/tools.py's round trip: two functions, tool_choice required
#     -> a call whose arguments validate; the call and its result -> a final
#     answer; streamed -> the same call; named, parallel and none; with
#     parallel calls allowed, a repeated call ends the answer after one call
#     instead of six identical ones cut by max_tokens (issue 31).
# Needs ~/.cache/energon/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (made by
# ../shared/models/smollm2/get.sh); skipped (exit 77) with a message without
# it, without the test venv, or in a sanitizer build.
set -u
abspath() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
ENERGON=$(abspath "$1")
FIX=$(abspath "${2:-tests/fixtures}")
ROOT=$(dirname "$(cd "$(dirname "$0")" && pwd)")
PY=${EN_TEST_PYTHON:-$ROOT/.venv-test/bin/python}
D=${ENERGON_SMOLLM2_CACHE:-$HOME/.cache/energon/smollm2}
G=$D/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$G" ]; then
    echo "SKIP test_structured_smollm2: $G is missing (../shared/models/smollm2/get.sh $D)"
    exit 77
fi
if ! "$PY" -c 'import openai, jsonschema' 2>/dev/null; then
    echo "SKIP test_structured_smollm2: $PY lacks openai/jsonschema (scripts/install-deps)"
    exit 77
fi
# A Debug + AddressSanitizer build would take many minutes over 200 answers
# of a 135M model; test_serve runs the same scripts under it on a tiny model.
if ldd "$ENERGON" 2>/dev/null | grep -q libasan || nm -D "$ENERGON" 2>/dev/null | grep -q __asan_init; then
    echo "SKIP test_structured_smollm2: a sanitizer build (the release build runs it; test_serve runs its scripts under ASan)"
    exit 77
fi
T=$(mktemp -d /tmp/en_structured_XXXXXX)
SPID=
cleanup() {
    [ -n "$SPID" ] && kill -KILL "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost

"$ENERGON" serve --model "$G" --port 0 --threads 2 --model-name smollm2 >"$T/serve.log" 2>&1 &
SPID=$!
URL=
for _ in $(seq 1 1200); do
    URL=$(grep -o 'listening on http://[^ ]*' "$T/serve.log" | head -1 | sed 's/listening on //')
    [ -n "$URL" ] && break
    kill -0 "$SPID" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$URL" ]; then
    echo "FAIL: serve --model $G did not start"; tail -5 "$T/serve.log"
    exit 1
fi
export EN_URL=$URL EN_MODEL_NAME=smollm2 EN_SERVER_PID=$SPID EN_FIXTURES=$FIX EN_TMP=$T
rc=0
(cd "$ROOT/tests/serve" && "$PY" schema_load.py) || rc=1
(cd "$ROOT/tests/serve" && "$PY" -c '
import common, tools
c = common.openai_client()
tools.round_trip(c, "smollm2", "SmolLM2 (default format)")
tools.named_parallel_none(c)
tools.no_repeat_loop(c, "smollm2", "SmolLM2")
raise SystemExit(common.finish("tools on SmolLM2"))') || rc=1
kill -TERM "$SPID"; wait "$SPID"; SPID=
[ $rc = 0 ] && echo "test_structured_smollm2: passed" || { echo "test_structured_smollm2: FAILED"; tail -5 "$T/serve.log"; }
exit $rc
