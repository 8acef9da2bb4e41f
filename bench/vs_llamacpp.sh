#!/usr/bin/env bash
# bench/vs_llamacpp.sh [--model s110m|s15m|DIR] [--threads 2] [--repeats 5]
#                      [--serve-repeats N (0: no served rows)] [--widths "f32 bf16 q8 q4"] [--energon PATH]
#                      [--peer-only]
# CPU inference speed of energon beside llama.cpp, the same model at the same
# weight widths, in one run, printed as one markdown table.
#
# llama.cpp is a measurement peer only. It is never vendored and never
# fetched at energon run time: this script downloads the llama-cpp-python
# source package with pip (`pip download --no-binary :all:`; it carries
# llama.cpp as vendor/llama.cpp), builds llama-bench, llama-batched-bench,
# llama-server, llama-quantize and llama-perplexity into a cache folder
# outside the source tree, and reuses that build on later runs.
#   LLAMACPP_DIR          cache folder (default ~/.cache/energon/peers)
#   LLAMACPP_PY_VERSION   llama-cpp-python version (default 0.3.36; if pip
#                         cannot get it, the newest 0.3.x it offers)
#   LLAMACPP_JOBS         build jobs (default 2; the build runs under nice)
# --peer-only builds (or finds) llama.cpp and prints shell assignments
# LLAMACPP_SRC, LLAMACPP_BIN, LLAMACPP_PYTHON, LLAMACPP_VERSION (used by
# bench/perplexity.sh).
#
# Model: s110m (hidden 768, FFN 2048, 12 layers, 12 heads) or s15m (288, 768,
# 6, 6), random weights from `energon init` with the Llama 2 tokenizer
# (32000), untied lm_head; or DIR, any Hugging Face Llama directory. llama.cpp
# gets it through its own convert_hf_to_gguf.py (f32 GGUF), then
# llama-quantize --pure (every matrix at the one width) to BF16, Q8_0, Q4_0;
# for Q8_0 and Q4_0 the token embedding stays F32 and the output projection
# is Q8_0, as energon's q8 and q4 keep them (docs/quantization.md).
# energon reads the Hugging Face directory with --weights f32|bf16|q8|q4 and
# must report that width back (bench prefill's "weights"); an energon that
# silently loads another width gets n/a.
#
# Rows (tokens per second, higher is better; ratio = energon / llama.cpp):
#   decode, 1 sequence   energon bench decode (64 timed steps after a
#                        16-token prompt) | llama-bench -p 0 -n 64 -d 16
#   decode, 32 seqs      energon bench decode --seqs 32 (each sequence: a
#                        16-token prompt, then 64 timed steps of one token
#                        for all 32) | llama-batched-bench -npp 16 -ntg 64
#                        -npl 32: its S_TG, generated tokens of all 32
#                        sequences per second of generation
#   prefill 128          energon bench prefill --tokens 128 | llama-bench
#                        -p 128 -n 0
#   served, conc C       output tokens/s of `energon bench serve` (streaming
#                        /v1/completions, prompts ~64 tokens, max_tokens 64,
#                        3C requests, C in flight) against `energon serve`
#                        and against `llama-server -np 32`, both with 32
#                        sequences decoded together and 256 tokens of
#                        context per sequence
# Every figure is the median of --repeats runs (--serve-repeats for the
# served rows). A measurement that fails prints n/a, and the error is listed
# under the table; the run goes on.
# llama.cpp's CPU "repack" of quantized weights (a run-time re-layout into
# interleaved blocks) crashes on some machines; every llama.cpp tool here
# runs with it off (llama-bench --repack 0, the others --no-repack), so its
# kernels read the GGUF blocks as they are stored, as energon does.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
SHARED=${EN_SHARED:-$(cd "$ROOT/.." && pwd)/shared}
PEERS=${LLAMACPP_DIR:-$HOME/.cache/energon/peers}
JOBS=${LLAMACPP_JOBS:-2}
PY=${PYTHON:-python3}

MODEL=s110m
THREADS=2
REPEATS=5
SERVE_REPEATS=
WIDTHS="f32 bf16 q8 q4"
ENERGON=
PEER_ONLY=0

log() { echo "vs_llamacpp: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}
usage() { sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case $1 in
    --model) MODEL=${2:?--model needs a value}; shift 2 ;;
    --threads) THREADS=${2:?--threads needs a value}; shift 2 ;;
    --repeats) REPEATS=${2:?--repeats needs a value}; shift 2 ;;
    --serve-repeats) SERVE_REPEATS=${2:?--serve-repeats needs a value}; shift 2 ;;
    --widths) WIDTHS=${2:?--widths needs a value}; shift 2 ;;
    --energon) ENERGON=${2:?--energon needs a value}; shift 2 ;;
    --peer-only) PEER_ONLY=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
    esac
done
SERVE_REPEATS=${SERVE_REPEATS:-$REPEATS}
for n in "$THREADS" "$REPEATS"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "--threads and --repeats take positive integers"
done
[[ $SERVE_REPEATS =~ ^[0-9]+$ ]] || die "--serve-repeats takes a number (0: no served rows)"

for w in $WIDTHS; do
    case $w in f32 | bf16 | q8 | q4) ;; *) die "--widths: '$w' is not one of f32 bf16 q8 q4" ;; esac
done

# ---------------------------------------------------------------------------
# llama.cpp, built once into $PEERS
# ---------------------------------------------------------------------------
LLAMACPP_TOOLS="llama-bench llama-batched-bench llama-server llama-quantize llama-perplexity"

peer_have_build() { # SRC_ROOT
    local t
    for t in $LLAMACPP_TOOLS; do [ -x "$1/build/bin/$t" ] || return 1; done
}

peer_get() {
    mkdir -p "$PEERS"
    local want=${LLAMACPP_PY_VERSION:-0.3.36} root
    root=$PEERS/llama_cpp_python-$want
    if ! peer_have_build "$root" && [ ! -f "$root/vendor/llama.cpp/CMakeLists.txt" ]; then
        local dl=$PEERS/download
        mkdir -p "$dl"
        if ! ls "$dl"/llama_cpp_python-"$want".tar.gz >/dev/null 2>&1; then
            log "pip download --no-binary :all: --no-deps llama-cpp-python==$want (source package, ~75 MB)"
            if ! "$PY" -m pip download --quiet --no-binary :all: --no-deps -d "$dl" \
                "llama-cpp-python==$want" >&2; then
                [ -z "${LLAMACPP_PY_VERSION:-}" ] || die "pip could not download llama-cpp-python==$want"
                log "llama-cpp-python==$want not available; taking the newest 0.3.x pip offers"
                "$PY" -m pip download --quiet --no-binary :all: --no-deps -d "$dl" \
                    "llama-cpp-python>=0.3,<0.4" >&2 || die "pip could not download llama-cpp-python 0.3.x"
                want=$(ls "$dl"/llama_cpp_python-0.3.*.tar.gz | sed -E 's/.*llama_cpp_python-(.*)\.tar\.gz/\1/' |
                    sort -V | tail -1)
                root=$PEERS/llama_cpp_python-$want
            fi
        fi
        if [ ! -f "$root/vendor/llama.cpp/CMakeLists.txt" ]; then
            log "extracting llama_cpp_python-$want.tar.gz into $PEERS"
            tar -xzf "$dl/llama_cpp_python-$want.tar.gz" -C "$PEERS"
        fi
    fi
    LLAMACPP_SRC=$root/vendor/llama.cpp
    LLAMACPP_BIN=$root/build/bin
    if ! peer_have_build "$root"; then
        [ -f "$LLAMACPP_SRC/CMakeLists.txt" ] || die "$LLAMACPP_SRC has no CMakeLists.txt"
        log "building llama.cpp (llama-cpp-python $want's vendor/llama.cpp) in $root/build, $JOBS jobs, niced"
        local t0=$SECONDS
        # Release, CPU only, tuned for this machine; no libcurl or OpenSSL, no
        # web UI download (LLAMA_USE_PREBUILT_UI fetches it at build time), no AMX
        nice -n 10 cmake -S "$LLAMACPP_SRC" -B "$root/build" -DCMAKE_BUILD_TYPE=Release \
            -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
            -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
            -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
            -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF \
            >"$root/build-configure.log" 2>&1 ||
            die "llama.cpp configure failed, see $root/build-configure.log"
        # shellcheck disable=SC2086
        nice -n 10 cmake --build "$root/build" -j"$JOBS" --target $LLAMACPP_TOOLS \
            >"$root/build.log" 2>&1 || die "llama.cpp build failed, see $root/build.log"
        echo $((SECONDS - t0)) >"$root/build/energon-build-seconds"
        log "llama.cpp built in $((SECONDS - t0)) s"
    fi
    local v
    v=$("$LLAMACPP_BIN/llama-bench" --version 2>&1 || true)
    LLAMACPP_VERSION="llama-cpp-python $want, llama.cpp $(sed -n 's/^version: //p' <<<"$v" | head -1)"
}

# A python that can run convert_hf_to_gguf.py: this one if it has the
# packages, else a venv in $PEERS (system packages visible, the rest from PyPI)
peer_python() {
    local need="import numpy, torch, sentencepiece, safetensors, transformers, google.protobuf"
    if "$PY" -c "$need" 2>/dev/null; then
        LLAMACPP_PYTHON=$(command -v "$PY")
        return
    fi
    local venv=$PEERS/venv
    if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "$need" 2>/dev/null; then
        log "making a python venv for convert_hf_to_gguf.py in $venv"
        [ -x "$venv/bin/python" ] || "$PY" -m venv --system-site-packages "$venv" ||
            die "python3 -m venv failed"
        local pkgs="" p
        for p in numpy:numpy sentencepiece:sentencepiece safetensors:safetensors \
            transformers:transformers google.protobuf:protobuf; do
            "$venv/bin/python" -c "import ${p%%:*}" 2>/dev/null || pkgs="$pkgs ${p##*:}"
        done
        # shellcheck disable=SC2086
        [ -z "$pkgs" ] || "$venv/bin/python" -m pip install --quiet $pkgs >&2 ||
            die "pip install$pkgs failed"
        # torch: the CPU-only wheel where PyTorch's index is reachable, else
        # PyPI's (larger: it brings the CUDA libraries along)
        "$venv/bin/python" -c "import torch" 2>/dev/null ||
            "$venv/bin/python" -m pip install --quiet torch \
                --index-url https://download.pytorch.org/whl/cpu >&2 ||
            "$venv/bin/python" -m pip install --quiet torch >&2 ||
            die "pip install torch failed (neither PyTorch's CPU index nor PyPI)"
    fi
    LLAMACPP_PYTHON=$venv/bin/python
}

peer_get
peer_python
if [ "$PEER_ONLY" = 1 ]; then
    printf 'LLAMACPP_SRC=%q\nLLAMACPP_BIN=%q\nLLAMACPP_PYTHON=%q\nLLAMACPP_VERSION=%q\n' \
        "$LLAMACPP_SRC" "$LLAMACPP_BIN" "$LLAMACPP_PYTHON" "$LLAMACPP_VERSION"
    exit 0
fi

# ---------------------------------------------------------------------------
# energon, the model, the GGUF files
# ---------------------------------------------------------------------------
if [ -z "$ENERGON" ]; then
    for c in "$ROOT/build/energon" "$ROOT/build-release/energon"; do
        [ -x "$c" ] && ENERGON=$c && break
    done
fi
[ -n "$ENERGON" ] && [ -x "$ENERGON" ] || die "no energon binary (build it, or pass --energon PATH)"
command -v curl >/dev/null || die "curl is needed to wait for the servers"

W=$(mktemp -d "${TMPDIR:-/tmp}/en_vs_llamacpp_XXXXXX")
SERVER_PIDS=()
cleanup() {
    local p
    for p in "${SERVER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${SERVER_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

case $MODEL in
s110m | s15m)
    case $MODEL in
    s110m) shape="768 2048 12 12" ;;
    s15m) shape="288 768 6 6" ;;
    esac
    read -r C F L H <<<"$shape"
    cat >"$W/$MODEL.json" <<JSON
{"model_type": "llama", "hidden_size": $C, "intermediate_size": $F, "num_hidden_layers": $L,
 "num_attention_heads": $H, "num_key_value_heads": $H, "max_position_embeddings": 1024,
 "rms_norm_eps": 1e-5, "tie_word_embeddings": false}
JSON
    TOK=${EN_LLAMA2_TOKENIZER:-$SHARED/models/llama2-tokenizer/tokenizer.model}
    [ -f "$TOK" ] || die "no Llama 2 tokenizer at $TOK (set EN_LLAMA2_TOKENIZER)"
    log "energon init $MODEL (random weights) in $W"
    "$ENERGON" init --config "$W/$MODEL.json" --tokenizer "$TOK" --out "$W/$MODEL" --seed 1 >&2 ||
        die "energon init failed"
    MDIR=$W/$MODEL
    ;;
*)
    [ -f "$MODEL/config.json" ] || die "--model: $MODEL is not s110m, s15m or a model directory"
    MDIR=$(cd "$MODEL" && pwd)
    ;;
esac

log "convert_hf_to_gguf.py -> f32 GGUF"
PYTHONPATH="$LLAMACPP_SRC/gguf-py${PYTHONPATH:+:$PYTHONPATH}" "$LLAMACPP_PYTHON" \
    "$LLAMACPP_SRC/convert_hf_to_gguf.py" "$MDIR" --outtype f32 --outfile "$W/model-f32.gguf" \
    >"$W/convert.log" 2>&1 || {
    tail -20 "$W/convert.log" >&2
    die "convert_hf_to_gguf.py failed"
}
gguf_of() { # width -> file
    case $1 in f32) echo "$W/model-f32.gguf" ;; bf16) echo "$W/model-bf16.gguf" ;;
    q8) echo "$W/model-q8_0.gguf" ;; q4) echo "$W/model-q4_0.gguf" ;; esac
}
qtype_of() { case $1 in f32) echo F32 ;; bf16) echo BF16 ;; q8) echo Q8_0 ;; q4) echo Q4_0 ;; esac; }
# energon's q8/q4 keep the token embedding float32 and the output projection
# at q8 (its --output-weights default); the GGUF files are made the same way
quant_args() { case $1 in q8 | q4) echo "--token-embedding-type f32 --output-tensor-type q8_0" ;; esac; }
for w in $WIDTHS; do
    [ "$w" = f32 ] && continue
    log "llama-quantize --pure $(quant_args "$w") -> $(qtype_of "$w")"
    # shellcheck disable=SC2046
    "$LLAMACPP_BIN/llama-quantize" --pure $(quant_args "$w") "$W/model-f32.gguf" "$(gguf_of "$w")" "$(qtype_of "$w")" \
        "$THREADS" >"$W/quantize-$w.log" 2>&1 || {
        tail -5 "$W/quantize-$w.log" >&2
        log "llama-quantize to $(qtype_of "$w") failed; its llama.cpp column will be n/a"
        rm -f "$(gguf_of "$w")"
    }
done

# energon's width flag: --weights (f32|bf16|q8|q4) where this build has it,
# else --dtype (f32|bf16 only)
# (every loading command parses it the same way; eval takes --help after it)
if "$ENERGON" eval --weights f32 --help >/dev/null 2>&1; then
    EN_WFLAG=--weights
else
    EN_WFLAG=--dtype
    log "this energon has no --weights yet: --dtype for f32/bf16, q8/q4 will fail (n/a)"
fi

# energon must really hold the width asked for (an energon that does not
# know a width may fall back to another): bench prefill reports "weights"
en_probe() { # width -> 0 when energon loads the model at that width
    local out got
    if ! out=$("$ENERGON" bench prefill --model "$MDIR" --tokens 4 --repeats 1 --threads "$THREADS" \
        $EN_WFLAG "$1" --json 2>"$W/probe.log"); then
        note "energon $1: $(grep -v '^\s*$' "$W/probe.log" | tail -1 | cut -c1-160)"
        return 1
    fi
    got=$(jfield weights <<<"$out")
    case $got in
    "$1"*) return 0 ;;
    *) note "energon $EN_WFLAG $1 loaded ${got:-unknown} weights: its column is n/a"; return 1 ;;
    esac
}

# llama.cpp's switch for weight repacking, per tool (from its --help)
repack_off() { # tool -> its flags, or nothing (noted) when it has none
    local h
    h=$("$LLAMACPP_BIN/$1" --help 2>&1 || true)
    if [ "$1" = llama-bench ] && grep -q -- '--repack' <<<"$h"; then
        echo "--repack 0"
    elif grep -q -- '--no-repack' <<<"$h"; then
        echo "--no-repack"
    else
        note "$1 has no switch to turn weight repacking off; it ran with llama.cpp's default"
    fi
}

# ---------------------------------------------------------------------------
# measurement helpers: each prints one number, or n/a (and records why)
# ---------------------------------------------------------------------------
# notes go to a file: the helpers run in command substitutions (subshells)
note() { grep -qxF -- "$*" "$W/notes" 2>/dev/null || echo "$*" >>"$W/notes"; }
median() { tr ' ' '\n' | grep -E '^[0-9.eE+-]+$' | sort -g | awk '{a[NR]=$1} END {
    if (NR == 0) exit 1; if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2] + a[NR/2+1]) / 2 }'; }
jfield() { # KEY: the number of "KEY" in the JSON object on stdin (first one)
    "$PY" -c 'import json,sys
for line in sys.stdin:
    line=line.strip()
    if line.startswith("{"):
        v=json.loads(line).get(sys.argv[1])
        if v is not None: print(v); break' "$1"
}
fail_note() { # what logfile
    local msg
    msg=$(grep -v '^\s*$' "$2" 2>/dev/null | tail -1 | cut -c1-160)
    note "$1: ${msg:-failed}"
    echo n/a
}

en_bench() { # width args...: energon bench ..., tok_per_s
    local w=$1 log=$W/en.log
    shift
    local out
    if out=$("$ENERGON" bench "$@" --model "$MDIR" --threads "$THREADS" $EN_WFLAG "$w" \
        --repeats "$REPEATS" --json 2>"$log") && v=$(jfield tok_per_s <<<"$out") && [ -n "$v" ]; then
        echo "$v"
    else
        fail_note "energon $w bench $*" "$log"
    fi
}

lc_bench() { # width args...: llama-bench ..., median of its samples
    local w=$1 f log=$W/lc.log
    shift
    f=$(gguf_of "$w")
    [ -f "$f" ] || { note "llama.cpp $w: no GGUF"; echo n/a; return; }
    local out v
    # shellcheck disable=SC2046
    if out=$("$LLAMACPP_BIN/llama-bench" -m "$f" -t "$THREADS" -r "$REPEATS" $(repack_off llama-bench) \
        "$@" -o json 2>"$log") &&
        v=$("$PY" -c 'import json,sys; r=json.load(sys.stdin); s=sorted(r[0]["samples_ts"]); n=len(s)
print(s[n//2] if n % 2 else (s[n//2-1]+s[n//2])/2)' <<<"$out" 2>>"$log") && [ -n "$v" ]; then
        echo "$v"
    else
        fail_note "llama-bench $w $*" "$log"
    fi
}

# Decode at batch 1, energon and llama-bench taking turns repeat by repeat:
# the machine's memory read rate can move by 2x over minutes (seen on the
# 2-core EPYC this was written on), and one side's repeats all before the
# other's would compare two different machines. Each energon repeat also
# measures the read bandwidth right after it. Prints one line, medians:
#   en_tok/s lc_tok/s en_GB/s lc_GB/s en_share lc_share
# GB/s: tokens/s times the weight bytes energon reads per token at this
# width (llama.cpp's GGUF holds the same matrices at the same widths, so
# the same bytes); share: GB/s over the bandwidth of the same repeat.
gbs_share() { # tok/s bytes-per-token bandwidth: "GB/s percent-of-bandwidth"
    awk -v a="$1" -v b="$2" -v c="$3" 'BEGIN { g = a * b / 1e9
        printf "%.3f %.1f", g, (c > 0 ? 100 * g / c : 0) }'
}
decode1_pair() { # width
    local w=$1 f i out v t bytes="" en="" lc="" egb="" lgb="" esh="" lsh="" bw
    f=$(gguf_of "$w")
    for ((i = 0; i < REPEATS; i++)); do
        bw=""
        if out=$("$ENERGON" bench decode --tokens 64 --prompt 16 --model "$MDIR" \
            --threads "$THREADS" $EN_WFLAG "$w" --repeats 1 --json 2>"$W/en.log") &&
            v=$(jfield tok_per_s <<<"$out") && [ -n "$v" ]; then
            bytes=$(jfield param_bytes <<<"$out")
            bw=$(jfield read_bw_gb_per_s <<<"$out")
            en="$en $v"
            t=$(gbs_share "$v" "$bytes" "$bw")
            egb="$egb ${t% *}" esh="$esh ${t#* }"
        else
            fail_note "energon $w bench decode (paired)" "$W/en.log" >/dev/null
        fi
        [ -f "$f" ] || continue
        # shellcheck disable=SC2046
        if out=$("$LLAMACPP_BIN/llama-bench" -m "$f" -t "$THREADS" -r 1 \
            $(repack_off llama-bench) -p 0 -n 64 -d 16 -o json 2>"$W/lc.log") &&
            v=$("$PY" -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])' \
                <<<"$out" 2>>"$W/lc.log") && [ -n "$v" ]; then
            lc="$lc $v"
            if [ -n "$bytes" ] && [ -n "$bw" ]; then
                t=$(gbs_share "$v" "$bytes" "$bw")
                lgb="$lgb ${t% *}" lsh="$lsh ${t#* }"
            fi
        else
            fail_note "llama-bench $w (paired decode)" "$W/lc.log" >/dev/null
        fi
    done
    local x out_line=""
    for x in "$en" "$lc" "$egb" "$lgb" "$esh" "$lsh"; do
        v=$(median <<<"$x" 2>/dev/null) || v=n/a
        out_line="$out_line ${v:-n/a}"
    done
    echo "$out_line"
}

lc_batched() { # width: llama-batched-bench, 32 sequences, S_TG, median of REPEATS runs
    local w=$1 f log=$W/lcb.log vals="" i out v
    f=$(gguf_of "$w")
    [ -f "$f" ] || { note "llama.cpp $w: no GGUF"; echo n/a; return; }
    for ((i = 0; i < REPEATS; i++)); do
        # shellcheck disable=SC2046
        if out=$("$LLAMACPP_BIN/llama-batched-bench" -m "$f" -t "$THREADS" -tb "$THREADS" \
            $(repack_off llama-batched-bench) -c $((32 * 80)) -b 512 -ub 512 \
            -npp 16 -ntg 64 -npl 32 --output-format jsonl 2>"$log") &&
            v=$(jfield speed_tg <<<"$out") && [ -n "$v" ]; then
            vals="$vals $v"
        else
            fail_note "llama-batched-bench $w" "$log"
            return
        fi
    done
    median <<<"$vals"
}

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ready() { # pid port log: /health answers 200 within 300 s
    local i
    for ((i = 0; i < 600; i++)); do
        kill -0 "$1" 2>/dev/null || return 1
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$2/health")" = 200 ] && return 0
        sleep 0.5
    done
    return 1
}
stop_server() { # pid
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    local keep=() p
    for p in "${SERVER_PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
    SERVER_PIDS=("${keep[@]}")
}
SERVE_CONC="1 8 32"
serve_load() { # tag port: sets SERVED[C] to the median output tokens/s per concurrency
    local tag=$1 port=$2 c i out v vals log=$W/load.log
    for c in $SERVE_CONC; do
        vals=""
        for ((i = 0; i < SERVE_REPEATS; i++)); do
            if out=$("$ENERGON" bench serve --url "http://127.0.0.1:$port" --concurrency "$c" \
                --requests $((3 * c)) --prompt-tokens 64 --max-tokens 64 --json 2>"$log") &&
                v=$(jfield output_throughput <<<"$out") && [ -n "$v" ]; then
                vals="$vals $v"
            else
                [ -n "$out" ] && echo "$out" >>"$log"
                vals=""
                break
            fi
        done
        if [ -n "$vals" ]; then SERVED[$c]=$(median <<<"$vals"); else SERVED[$c]=$(fail_note "$tag, concurrency $c" "$log"); fi
    done
}
serve_na() { # tag log
    local c
    for c in $SERVE_CONC; do SERVED[$c]=n/a; done
    fail_note "$1" "$2" >/dev/null
}
en_serve() { # width
    local w=$1 port pid log=$W/en_serve.log
    port=$(free_port)
    "$ENERGON" serve --model "$MDIR" $EN_WFLAG "$w" --port "$port" --threads "$THREADS" \
        --max-batch 32 --ctx 256 --quiet >"$log" 2>&1 &
    pid=$!
    SERVER_PIDS+=("$pid")
    if wait_ready "$pid" "$port"; then
        serve_load "energon serve $w" "$port"
    else
        serve_na "energon serve $w did not start" "$log"
    fi
    stop_server "$pid"
}
lc_serve() { # width
    local w=$1 f port pid log=$W/lc_serve.log
    f=$(gguf_of "$w")
    if [ ! -f "$f" ]; then
        serve_na "llama-server $w: no GGUF" /dev/null
        return
    fi
    port=$(free_port)
    # shellcheck disable=SC2046
    "$LLAMACPP_BIN/llama-server" -m "$f" -t "$THREADS" -tb "$THREADS" -np 32 -c $((32 * 256)) \
        $(repack_off llama-server) --port "$port" --host 127.0.0.1 >"$log" 2>&1 &
    pid=$!
    SERVER_PIDS+=("$pid")
    if wait_ready "$pid" "$port"; then
        serve_load "llama-server $w" "$port"
    else
        serve_na "llama-server $w did not start" "$log"
    fi
    stop_server "$pid"
}

# ---------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------
ROWS=("decode tok/s, 1 sequence" "decode tok/s, 32 sequences" "prefill tok/s, 128 tokens"
    "served output tok/s, concurrency 1" "served output tok/s, concurrency 8"
    "served output tok/s, concurrency 32" "decode GB/s of weights, 1 sequence"
    "decode, % of the read bandwidth measured beside it")
ROW_ORDER="0 6 7 1 2 3 4 5"
[ "$SERVE_REPEATS" = 0 ] && ROW_ORDER="0 6 7 1 2"
declare -A EN LC SERVED
for w in $WIDTHS; do
    en_ok=1
    en_probe "$w" || en_ok=0
    if [ $en_ok = 1 ]; then
        log "width $w: energon bench decode / prefill"
        pair=$(decode1_pair "$w")
        read -r EN[$w,0] LC[$w,0] EN[$w,6] LC[$w,6] EN[$w,7] LC[$w,7] <<<"$pair"
        EN[$w,1]=$(en_bench "$w" decode --seqs 32 --tokens 64 --prompt 16)
        EN[$w,2]=$(en_bench "$w" prefill --tokens 128)
    else
        EN[$w,0]=n/a EN[$w,1]=n/a EN[$w,2]=n/a EN[$w,6]=n/a EN[$w,7]=n/a
        LC[$w,0]=$(lc_bench "$w" -p 0 -n 64 -d 16) LC[$w,6]=n/a LC[$w,7]=n/a
    fi
    log "width $w: llama-bench / llama-batched-bench"
    LC[$w,1]=$(lc_batched "$w")
    LC[$w,2]=$(lc_bench "$w" -p 128 -n 0)
    [ "$SERVE_REPEATS" = 0 ] && continue # --serve-repeats 0: no served rows
    if [ $en_ok = 1 ]; then
        log "width $w: energon serve"
        en_serve "$w"
        EN[$w,3]=${SERVED[1]} EN[$w,4]=${SERVED[8]} EN[$w,5]=${SERVED[32]}
    else
        EN[$w,3]=n/a EN[$w,4]=n/a EN[$w,5]=n/a
    fi
    log "width $w: llama-server"
    lc_serve "$w"
    LC[$w,3]=${SERVED[1]} LC[$w,4]=${SERVED[8]} LC[$w,5]=${SERVED[32]}
done

# ---------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------
fmt() { [[ $1 =~ ^[0-9.eE+-]+$ ]] && printf '%.1f' "$1" || echo "$1"; }
ratio() { # energon llama.cpp
    if [[ $1 =~ ^[0-9.eE+-]+$ && $2 =~ ^[0-9.eE+-]+$ ]]; then
        awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'
    else
        echo n/a
    fi
}
en_ver=$("$ENERGON" --version 2>/dev/null | head -1 || true)
en_rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || true)
echo
echo "## energon vs llama.cpp, CPU inference ($MODEL)"
echo
echo "- machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) hardware threads; $THREADS threads used on both sides"
echo "- energon: $ENERGON${en_ver:+ ($en_ver)}${en_rev:+, source $en_rev}; widths via $EN_WFLAG"
echo "- llama.cpp: $LLAMACPP_VERSION ($LLAMACPP_BIN); GGUF by convert_hf_to_gguf.py, llama-quantize --pure; weight repacking off"
echo "- q8/q4 on both sides: every transformer matrix at the width, the token embedding float32, the output projection q8"
echo "  (energon's default --output-weights; llama-quantize --token-embedding-type f32 --output-tensor-type q8_0)"
echo "- model: $MODEL ($(sed -n 's/.*"num_hidden_layers": *\([0-9]*\).*/\1 layers/p' "$MDIR/config.json"), $(sed -n 's/.*"hidden_size": *\([0-9]*\).*/hidden \1/p' "$MDIR/config.json"))"
echo "- tokens/s, median of $REPEATS (served rows: of $SERVE_REPEATS); ratio = energon / llama.cpp, above 1 means energon is faster"
echo "- decode, 1 sequence: energon and llama-bench take turns repeat by repeat; GB/s = tokens/s x the weight bytes energon reads per token (the same matrices at the same widths on both sides); the read bandwidth is energon bench decode's, measured right after each of its repeats"
echo "- llama.cpp rows: llama-bench -p 0 -n 64 -d 16 | llama-batched-bench -npp 16 -ntg 64 -npl 32 (S_TG) | llama-bench -p 128 -n 0 | llama-server -np 32 -c 8192"
echo
hdr="| measurement |" sep="|---|"
for w in $WIDTHS; do
    hdr="$hdr energon $w | llama.cpp $(qtype_of "$w") | ratio |"
    sep="$sep---:|---:|---:|"
done
echo "$hdr"
echo "$sep"
for r in $ROW_ORDER; do
    line="| ${ROWS[$r]} |"
    for w in $WIDTHS; do
        line="$line $(fmt "${EN[$w,$r]}") | $(fmt "${LC[$w,$r]}") | $(ratio "${EN[$w,$r]}" "${LC[$w,$r]}") |"
    done
    echo "$line"
done
if [ -s "$W/notes" ]; then
    echo
    echo "Notes (n/a and why):"
    sed 's/^/- /' "$W/notes"
fi
