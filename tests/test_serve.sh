#!/usr/bin/env bash
# test_serve.sh ENERGON FIXTURES SHARED
# `energon serve` end to end, from the outside: a model is set up, the server
# started on an ephemeral port, and the Python scripts in tests/serve/ drive
# it (issue 5, "What it must show"):
#   api_openai   the official openai client: chat and completions, streamed
#                and not, usage, stop strings, seed, max_tokens, n, logprobs,
#                /v1/models, BadRequest/NotFound/Authentication/RateLimit errors
#   bad_input    malformed and hostile requests over raw HTTP: right status,
#                OpenAI-shaped error, the server unharmed
#   adapters     LoRA adapters by name on their own server: PEFT's logits,
#                load/unload while serving, mixed batches equal alone
#   finetuned_adapters  3 adapters trained here by energon finetune and the
#                base, 32 requests at once: each equals energon generate;
#                refusals; resident memory over load/unload cycles
#   retrieve     POST /v1/retrieve of a --index server against a float64 BM25
#                over the index's rows; bad bodies; no --index: 404
#                (then retrieval_chat, and chat_cli_sources / chat_page_sources:
#                the sources of grounded answers in energon chat and the page)
#   concurrency  32 concurrent clients, each answer equal to the same request
#                sent alone; /metrics shows they ran together
#   prefix_cache 16 prompts sharing ~300 tokens: cached_tokens are their shared
#                full blocks, answers equal a --no-prefix-cache server's
#   disconnect   a client that goes away frees its KV blocks at once
#   load256      256 connections at once on a server of its own with a small
#                queue: slow readers, clients gone mid-head / mid-body /
#                after a chunk, a burst over the queue (429s): every request
#                answered or abandoned, none lost, fds and memory flat (issue 17)
#   slowclients  2000 connections dripping a head byte every 2 s on a server
#                of its own: /health and a completion within 1 s throughout,
#                each dripper cut at --request-timeout (issue 31)
#   response_format  json_object answers are JSON objects (or prefixes when cut),
#                a grammar through extra_body matches its pattern (issue 16)
#   schema_load  200 json_schema requests (10 schemas) with 8 plain ones in one
#                batch: all validate, the plain ones equal alone (issue 16)
#   tools        tools / tool_choice with the openai client: required calls
#                validate against their parameters, streamed calls reassemble,
#                hermes / llama3 / mistral templates (issue 16)
#   chat_page    the chat page in headless Chromium streams the API's answer
#   chat_cli     `energon chat` piped, against the server and in-process
#   soak         thousands of mixed requests leave memory, threads, fds flat
#   sigterm      SIGTERM with requests running: they complete, exit 0
# and concurrency once more against a server with --weights q8 (the int8
# kernels are batch-invariant too).
# The model: stories260K from SHARED (converted here) when it is there, else
# a random one made here (tokenizer trained on examples/company, `energon
# init`), so the suite never needs ../shared. EN_SERVE_TEST_MODEL=random
# forces the second; EN_SERVE_TESTS picks scripts, EN_SERVE_KEEP=1 keeps the
# scratch directory (server logs). Python: the venv scripts/install-deps makes
# (.venv-test, with the openai client); exit 77 when it is missing.
set -u
abspath() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
ENERGON=$(abspath "$1")
FIX=$(abspath "$2")
SHARED=${3:-}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PY=${EN_TEST_PYTHON:-$ROOT/.venv-test/bin/python}

if ! [ -x "$PY" ] || ! "$PY" -c 'import openai' 2>/dev/null; then
    echo "SKIP test_serve: the openai Python client is missing ($PY cannot import openai); run scripts/install-deps"
    exit 77
fi
if "$ENERGON" serve --help 2>&1 | grep -q "not built yet"; then
    echo "SKIP test_serve: this energon has no serve command yet"
    exit 77
fi

# running and not a zombie (kill -0 succeeds on an unreaped child)
alive() { [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ]; }

T=$(mktemp -d /tmp/en_serve_XXXXXX)
SPID=
cleanup() {
    if [ -n "$SPID" ] && kill -0 "$SPID" 2>/dev/null; then
        kill -KILL "$SPID" 2>/dev/null
        wait "$SPID" 2>/dev/null
    fi
    if [ -n "${EN_SERVE_KEEP:-}" ]; then echo "test_serve: kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT

# An AddressSanitizer or ThreadSanitizer build is several times slower:
# deadlines stretch, the soak sends fewer requests (soak.py) and resident
# memory is not judged (EN_ASAN=1 for both; EN_TSAN=1 for the second). Every
# server here runs with --threads 1, which keeps OpenMP from starting a team:
# its runtime is not instrumented, and TSan would report the work it hands
# between threads as races (tests/tsan.supp).
ASAN=0
TSAN=0
SAN_NAME=
if ldd "$ENERGON" 2>/dev/null | grep -q libasan || nm -D "$ENERGON" 2>/dev/null | grep -q __asan_init; then
    ASAN=1
    SAN_NAME=', AddressSanitizer build'
elif ldd "$ENERGON" 2>/dev/null | grep -q libtsan ||
    nm -D "$ENERGON" 2>/dev/null | grep -q __tsan_init; then
    ASAN=1
    TSAN=1
    SAN_NAME=', ThreadSanitizer build'
fi

# Every request of the suite goes to this machine's loopback, never through a
# proxy the environment may name (httpx, urllib and Chromium all read these).
export NO_PROXY=127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY} no_proxy=127.0.0.1,localhost${no_proxy:+,$no_proxy}

# ---- the model
S=$SHARED/models/stories260K
if [ "${EN_SERVE_TEST_MODEL:-auto}" != random ] && [ -f "$S/stories260K.bin" ] && [ -f "$S/tok512.model" ]; then
    NAME=stories260K
    "$ENERGON" convert llama2c --checkpoint "$S/stories260K.bin" --tokenizer "$S/tok512.model" \
        --out "$T/model" >"$T/setup.log" 2>&1 || { echo "FAIL: converting stories260K"; cat "$T/setup.log"; exit 1; }
else
    # examples/company/base_model.json, but with untied embeddings and 512
    # positions: with random tied weights the greedy answer just repeats the
    # last prompt token, which would make the text comparisons vacuous.
    NAME=company-random
    sed -e 's/"tie_word_embeddings": true/"tie_word_embeddings": false/' \
        -e 's/"max_position_embeddings": [0-9]*/"max_position_embeddings": 512/' \
        "$ROOT/examples/company/base_model.json" >"$T/config.json"
    { "$ENERGON" tokenizer train --data "$ROOT/examples/company/handbook.txt" --vocab-size 512 --out "$T/tok.model" &&
      "$ENERGON" init --config "$T/config.json" --tokenizer "$T/tok.model" --out "$T/model" --seed 1; } \
        >"$T/setup.log" 2>&1 || { echo "FAIL: making a random model"; cat "$T/setup.log"; exit 1; }
fi
CTX=$("$PY" -c 'import json, sys; print(min(4096, json.load(open(sys.argv[1]))["max_position_embeddings"]))' \
      "$T/model/config.json")
echo "test_serve: model $NAME (context $CTX)$SAN_NAME"

# ---- the main server. One thread: the model is tiny, and on two cores shared
# with other tests OpenMP's waiting threads make every step many times slower.
# --grace: sigterm.py checks that every running request completes, which
# under ASan with the random model takes longer than the default 30 s
"$ENERGON" serve --model "$T/model" --port 0 --model-name "$NAME" --threads 1 --grace 600 \
    >"$T/server-main.log" 2>&1 &
SPID=$!
URL=
deadline=$((SECONDS + (ASAN ? 300 : 60)))
while [ $SECONDS -lt $deadline ] && alive "$SPID"; do
    if [ -z "$URL" ]; then
        URL=$(grep -o 'listening on http://[^ ]*' "$T/server-main.log" | head -1 | sed 's/listening on //')
    elif "$PY" -c 'import sys, urllib.request; sys.exit(urllib.request.urlopen(sys.argv[1] + "/health", timeout=5).status != 200)' \
            "$URL" 2>/dev/null; then
        break
    fi
    sleep 0.1
done
if [ -z "$URL" ] || ! alive "$SPID" || [ $SECONDS -ge $deadline ]; then
    echo "FAIL: the server did not become healthy (url '$URL')"
    sed 's/^/  | /' "$T/server-main.log" | tail -30
    echo "test_serve: 0 passed, 1 failed"
    exit 1
fi
echo "test_serve: serving at $URL ($(grep -o 'ready:.*' "$T/server-main.log" | head -1))"

export EN_URL=$URL EN_SERVER_PID=$SPID EN_MODEL_DIR=$T/model EN_MODEL_NAME=$NAME EN_CTX=$CTX \
       EN_ENERGON=$ENERGON EN_FIXTURES=$FIX EN_TMP=$T EN_ASAN=$ASAN EN_SHARED=${SHARED:+$(abspath "$SHARED")}
export EN_TSAN=$TSAN
pass=0
fail=0
skipped=()
# a FAIL line of this script itself (counted, and kept for the recap at the end)
hfail() {
    echo "FAIL $*" | tee -a "$T/harness.out"
    fail=$((fail + 1))
}
# EN_SERVE_TESTS="soak sigterm" runs a subset (sigterm last: it stops the server)
DEFAULT_SCRIPTS="api_openai bad_input concurrency prefix_cache embeddings adapters"
DEFAULT_SCRIPTS+=" finetuned_adapters retrieve disconnect load256 slowclients"
DEFAULT_SCRIPTS+=" chat_page response_format schema_load tools"
DEFAULT_SCRIPTS+=" chat_cli soak sigterm"
SCRIPTS=${EN_SERVE_TESTS:-$DEFAULT_SCRIPTS}

# A second server: side_server LOG ARGS... starts `energon serve ARGS` on
# an ephemeral port, logging to $T/LOG, and sets QPID and QURL (empty when
# it did not start listening).
side_server() {
    local log=$1
    shift
    "$ENERGON" serve --port 0 --threads 1 "$@" >"$T/$log" 2>&1 &
    QPID=$!
    QURL=
    for _ in $(seq 1 $((ASAN ? 3000 : 600))); do
        QURL=$(grep -o 'listening on http://[^ ]*' "$T/$log" | head -1 | sed 's/listening on //')
        [ -n "$QURL" ] || ! alive "$QPID" && break
        sleep 0.1
    done
}

# side_script NAME TAG SCRIPT [VAR=VALUE...]: tests/serve/SCRIPT.py against
# the second server (EN_URL=QURL) with those variables, its lines shown
# (each with "TAG: " when TAG is not empty) and counted from $T/NAME.out;
# then the second server is stopped.
side_script() {
    local name=$1 tag=$2 script=$3
    shift 3
    (cd "$HERE/serve" && env EN_URL="$QURL" EN_SERVER_PID="$QPID" "$@" "$PY" -u "$script.py") \
        >"$T/$name.out" 2>&1
    if [ -n "$tag" ]; then
        sed "s/^\(PASS\|FAIL\) /\1 $tag: /" "$T/$name.out"
    else
        cat "$T/$name.out"
    fi
    pass=$((pass + $(grep -c '^PASS ' "$T/$name.out")))
    fail=$((fail + $(grep -c '^FAIL ' "$T/$name.out")))
    [ -n "$QURL" ] || hfail "the server for $name did not start"
    kill -TERM "$QPID" 2>/dev/null
    wait "$QPID" 2>/dev/null
}

for script in $SCRIPTS; do
    case $script in embeddings | adapters | finetuned_adapters | retrieve) continue ;; esac # own servers
    # prefix_cache compares the main server (EN_URL) with a second one without
    # the cache (EN_URL_NOCACHE), started here and stopped after it
    nocache=
    if [ "$script" = prefix_cache ]; then
        side_server server-nocache.log --model "$T/model" --model-name "$NAME" --ctx "$CTX" \
            --no-prefix-cache
        nocache=$QURL
        [ -n "$QURL" ] || hfail "the --no-prefix-cache server did not start"
    fi
    echo "---- $script"
    t0=$SECONDS
    (cd "$HERE/serve" && EN_URL_NOCACHE=$nocache "$PY" -u "$script.py") >"$T/$script.out" 2>&1
    rc=$?
    cat "$T/$script.out"
    p=$(grep -c '^PASS ' "$T/$script.out")
    f=$(grep -c '^FAIL ' "$T/$script.out")
    pass=$((pass + p))
    fail=$((fail + f))
    if [ "$rc" -eq 77 ]; then
        skipped+=("$script")
    elif [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        hfail "$script: exited $rc without a FAIL line"
    fi
    if [ "$script" = prefix_cache ]; then
        kill -TERM "$QPID" 2>/dev/null
        wait "$QPID" 2>/dev/null
    fi
    echo "     ($script: $((SECONDS - t0)) s)"
    if [ "$script" != sigterm ] && ! alive "$SPID"; then
        hfail "the server died during $script"
        break
    fi
done

# ---- the same batch-invariance check on block-quantised weights: a second
# server with --weights q8 (int8 kernels) runs concurrency.py, whose answers
# must equal the same requests sent alone
case " $SCRIPTS " in *" concurrency "*)
    side_server server-q8.log --model "$T/model" --weights q8 --model-name "$NAME"
    echo "---- concurrency against a second server with --weights q8"
    side_script concurrency-q8 q8 concurrency
    ;;
esac

# ---- /v1/embeddings: servers of tests/fixtures/hf/embed_llama (its own
# tokenizer and a float64 reference), pooling mean and then last
case " $SCRIPTS " in *" embeddings "*)
    for pool in mean last; do
        echo "---- embeddings (--embedding-pooling $pool)"
        side_server server-emb-$pool.log --model "$FIX/hf/embed_llama" --model-name embed-test \
            --embedding-pooling "$pool"
        side_script "embeddings-$pool" "" embeddings EN_MODEL_NAME=embed-test EN_POOLING="$pool"
    done
    ;;
esac

# ---- LoRA adapters by name: a server of tests/fixtures/hf/llama_gqa_tied
# (with a tokenizer trained here: the fixture has none) serving its
# PEFT-written adapter as a1 and loading more from an --adapter-dir
case " $SCRIPTS " in *" adapters "*)
    echo "---- adapters"
    AM=$T/gqa_model
    mkdir -p "$AM" "$T/adapter_dir"
    cp "$FIX/hf/llama_gqa_tied/config.json" "$FIX/hf/llama_gqa_tied/model.safetensors" "$AM/"
    if "$ENERGON" tokenizer train --data "$ROOT/examples/company/handbook.txt" --vocab-size 333 \
        --out "$AM/tokenizer.model" >"$T/adapters-setup.log" 2>&1; then
        side_server server-adapters.log --model "$AM" --model-name base-gqa --ctx 128 \
            --adapter "a1=$FIX/grad/llama_gqa_tied_lora_adapter" --adapter-dir "$T/adapter_dir"
        side_script adapters "" adapters EN_MODEL_NAME=base-gqa EN_ADAPTER_DIR="$T/adapter_dir"
    else
        hfail "training the adapters test's tokenizer: $(tail -1 "$T/adapters-setup.log")"
    fi
    ;;
esac

# ---- adapters trained here by `energon finetune` on the main model, each on
# another text of examples/company, served by name beside the base; "big"
# (rank 64, all targets) for the memory check, "over" (rank 96) for the
# --max-lora-rank refusal
case " $SCRIPTS " in *" finetuned_adapters "*)
    echo "---- finetuned_adapters"
    FT=$T/ft
    mkdir -p "$FT"
    ft() { # NAME DATA ARGS...
        local name=$1 data=$2
        shift 2
        "$ENERGON" finetune --model "$T/model" --data "$ROOT/examples/company/$data" \
            --out "$FT/$name" --threads 1 --seq-len 64 --batch 2 --save-every 1000 "$@" \
            >>"$T/ft-setup.log" 2>&1
    }
    if ft dept-handbook handbook.txt --lora-rank 8 --steps 40 --lr 3e-3 &&
       ft dept-policies policies.txt --lora-rank 8 --steps 40 --lr 3e-3 --seed 2 &&
       ft big handbook.txt --lora-rank 64 --lora-targets q,k,v,o,gate,up,down --steps 2 &&
       ft over handbook.txt --lora-rank 96 --steps 2; then
        side_server server-ft.log --model "$T/model" --model-name "$NAME" \
            --adapter "dept-handbook=$FT/dept-handbook" --adapter "dept-policies=$FT/dept-policies" \
            --adapter-dir "$FT" --max-lora-rank 64
        # the third is trained while the server runs and handed to it at the end
        handed=
        if [ -n "$QURL" ] && ft dept-products products.txt --lora-rank 8 --steps 40 --lr 3e-3 \
            --seed 3 --serve-url "$QURL"; then
            handed=1
        else
            hfail "energon finetune --serve-url $QURL: $(tail -2 "$T/ft-setup.log")"
        fi
        side_script finetuned_adapters "" finetuned_adapters EN_FT_DIR="$FT" EN_FT_HANDED=$handed \
            EN_FOREIGN_ADAPTER="$FIX/grad/llama_gqa_tied_lora_adapter"
    else
        hfail "training the finetuned_adapters test's adapters: $(tail -3 "$T/ft-setup.log")"
    fi
    ;;
esac

# ---- retrieval: POST /v1/retrieve on a server with --index of examples/company
case " $SCRIPTS " in *" retrieve "*)
    echo "---- retrieve"
    if "$ENERGON" index --docs "$ROOT/examples/company" --out "$T/company.db" \
        >"$T/retrieve-setup.log" 2>&1; then
        # a server without --index (the main one may have had its SIGTERM by now)
        side_server server-noindex.log --model "$T/model" --model-name "$NAME"
        NPID=$QPID NURL=$QURL
        # --max-body 2 MiB: a query of 1 MiB reaches the parser (400 on query;
        # at the default 1 MiB its body is a 413, bad_input.py's case)
        side_server server-retrieve.log --model "$T/model" --model-name "$NAME" \
            --index "$T/company.db" --max-body 2097152
        side_script retrieve "" retrieve EN_INDEX="$T/company.db" EN_URL_MAIN="$NURL"
        [ -n "$NURL" ] || hfail "the server without --index did not start"
        # chat "retrieval": passages small enough that two (K = 2) and 24 tokens
        # of answer fit the 512-token context with room (largest prompt ~380);
        # the script starts its own --index server, EN_URL is the one without
        if "$ENERGON" index --docs "$ROOT/examples/company" --out "$T/company-small.db" \
            --chunk-tokens 24 --overlap 4 >>"$T/retrieve-setup.log" 2>&1; then
            # the sources in `energon chat` and on the chat page (issue 15), each
            # against its own server with that index (side_script stops it);
            # EN_URL_NOINDEX: the server without --index, stopped by retrieval_chat
            for src in chat_cli_sources chat_page_sources; do
                echo "---- $src"
                side_server "server-$src.log" --model "$T/model" --model-name "$NAME" \
                    --index "$T/company-small.db"
                side_script "$src" "" "$src" EN_INDEX="$T/company-small.db" EN_URL_NOINDEX="$NURL"
            done
            QPID=$NPID QURL=$NURL
            side_script retrieval_chat "" retrieval_chat EN_INDEX="$T/company-small.db" \
                EN_DOCS="$ROOT/examples/company"
        else
            hfail "energon index for retrieval_chat: $(tail -1 "$T/retrieve-setup.log")"
        fi
        kill -TERM "$NPID" 2>/dev/null
        wait "$NPID" 2>/dev/null
    else
        hfail "energon index for the retrieve test: $(tail -1 "$T/retrieve-setup.log")"
    fi
    ;;
esac

# The main server got SIGTERM from sigterm.py: it must have exited 0 (under
# ASan, LeakSanitizer makes a leak a non-zero exit). Killed if it hangs.
case " $SCRIPTS " in *" sigterm "*) ;; *) alive "$SPID" && kill -TERM "$SPID" ;; esac
for _ in $(seq 1 $((ASAN ? 1200 : 300))); do alive "$SPID" || break; sleep 0.1; done
if alive "$SPID"; then
    echo "  .. the main server is still running: killing it"
    kill -KILL "$SPID"
fi
wait "$SPID"
rc=$?
SPID=
if [ "$rc" -eq 0 ]; then
    echo "PASS main server exit status after SIGTERM: 0"
    pass=$((pass + 1))
else
    hfail "main server exit status after SIGTERM: $rc"
fi

# Sanitizer reports from any server of the session
SAN_RE='ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:\|WARNING: ThreadSanitizer'
if grep -l "$SAN_RE" "$T"/server-*.log >/dev/null 2>&1; then
    logs=$(grep -l "$SAN_RE" "$T"/server-*.log | xargs -n1 basename | tr '\n' ' ')
    hfail "sanitizer reports in: $logs"
    grep -h -A24 "$SAN_RE" "$T"/server-*.log | head -80
fi

if [ "$fail" -gt 0 ]; then
    echo "---- server-main.log (last 40 lines)"
    tail -40 "$T/server-main.log" | sed 's/^/  | /'
    for log in "$T"/server-*.log; do
        [ "$log" = "$T/server-main.log" ] && continue
        echo "---- $(basename "$log") (last 8 lines)"
        tail -8 "$log" | sed 's/^/  | /'
    done
fi
[ ${#skipped[@]} -gt 0 ] && echo "skipped: ${skipped[*]}"
# The failed checks once more, last: a CI log cut in the middle keeps its tail.
if [ "$fail" -gt 0 ]; then
    echo "---- failed checks"
    grep '^FAIL ' "$T"/*.out 2>/dev/null | sed "s|^$T/||" | cut -c1-300
fi
echo "test_serve: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
