#!/usr/bin/env bash
# bench/perplexity.sh [--ctx 512] [--tokens 4096] [--threads 2] [--widths "f32 bf16 q8 q4"]
#                     [--text FILE] [--model HF_DIR] [--energon PATH]
# Perplexity of SmolLM2-135M-Instruct on English prose at each weight width,
# energon (`energon eval --weights W`) beside llama.cpp (llama-perplexity on
# GGUF files it makes itself from the same Hugging Face directory: f32 by
# convert_hf_to_gguf.py, then BF16 / Q8_0 / Q4_0 by llama-quantize --pure).
# At q8 and q4 both sides quantise every matrix of the transformer and keep
# the token embedding and the output projection (tied to it) float32:
# energon --output-weights f32, llama-quantize --token-embedding-type f32
# --output-tensor-type f32.
#
# Model: the Hugging Face directory of shared/models/smollm2/get.sh DIR --hf
# (cached at ~/.cache/energon/smollm2/hf; made there when missing), or
# --model HF_DIR. Its float32 weights are SmolLM2's PyPI GGUF (Q4_1)
# dequantised, so "f32" means those values exactly.
# Text: by default the start of shared/models/text/sotu.txt (U.S. State of
# the Union addresses, public domain), cut to about --tokens tokens as
# described below; --text FILE for another.
# llama.cpp comes from bench/vs_llamacpp.sh --peer-only (built once into
# LLAMACPP_DIR, default ~/.cache/energon/peers; never vendored).
#
# The same definition on both sides. energon eval scores a text in windows
# of --ctx W tokens that overlap by one token: every token after the first
# is predicted once, with the window's earlier tokens (0 .. W-2 of them) as
# context. llama-perplexity by default scores only the second half of each
# n_ctx chunk (at least n_ctx/2 tokens of context), which gives a lower
# figure; its strided mode (--ppl-stride S: windows of n_ctx tokens every S
# tokens, the last S of each scored) with S = W-1 and n_ctx = W is energon's
# scheme exactly. It drops a window that does not fit whole, so the text is
# cut (at a word boundary, checked to tokenize the same) to k*(W-1)+1 tokens
# for energon, and llama-perplexity gets the same text plus a few more words
# it never scores: both score the same k*(W-1) tokens with the same
# contexts. (llama-perplexity widens n_ctx by S/2 in strided mode, so it is
# asked for -c W-S/2, and -b the same so one window is one sequence.) The
# table also gives llama-perplexity's default figure (-c W) for reference.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
SHARED=${EN_SHARED:-$(cd "$ROOT/.." && pwd)/shared}
PY=${PYTHON:-python3}

CTX=512
TOKENS=4096
THREADS=2
WIDTHS="f32 bf16 q8 q4"
TEXT=$SHARED/models/text/sotu.txt
HF=
ENERGON=

log() { echo "perplexity: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}
usage() { sed -n '2,3p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case $1 in
    --ctx) CTX=${2:?--ctx needs a value}; shift 2 ;;
    --tokens) TOKENS=${2:?--tokens needs a value}; shift 2 ;;
    --threads) THREADS=${2:?--threads needs a value}; shift 2 ;;
    --widths) WIDTHS=${2:?--widths needs a value}; shift 2 ;;
    --text) TEXT=${2:?--text needs a value}; shift 2 ;;
    --model) HF=${2:?--model needs a value}; shift 2 ;;
    --energon) ENERGON=${2:?--energon needs a value}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
    esac
done
for n in "$CTX" "$TOKENS" "$THREADS"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "--ctx, --tokens and --threads take positive integers"
done
[ "$CTX" -ge 8 ] || die "--ctx must be at least 8"
[ "$TOKENS" -ge $((2 * CTX + 2)) ] || die "--tokens must be at least 2 x --ctx + 2 (llama-perplexity needs two windows)"
for w in $WIDTHS; do
    case $w in f32 | bf16 | q8 | q4) ;; *) die "--widths: '$w' is not one of f32 bf16 q8 q4" ;; esac
done
[ -f "$TEXT" ] || die "no text at $TEXT"

if [ -z "$ENERGON" ]; then
    for c in "$ROOT/build/energon" "$ROOT/build-release/energon"; do
        [ -x "$c" ] && ENERGON=$c && break
    done
fi
[ -n "$ENERGON" ] && [ -x "$ENERGON" ] || die "no energon binary (build it, or pass --energon PATH)"

# llama.cpp: LLAMACPP_SRC, LLAMACPP_BIN, LLAMACPP_PYTHON, LLAMACPP_VERSION
peer=$("$HERE/vs_llamacpp.sh" --peer-only) || die "bench/vs_llamacpp.sh --peer-only failed"
eval "$peer"

# the model
if [ -z "$HF" ]; then
    HF=$HOME/.cache/energon/smollm2/hf
    if [ ! -f "$HF/config.json" ]; then
        log "making SmolLM2-135M-Instruct's Hugging Face directory with shared/models/smollm2/get.sh"
        # with llama.cpp's python (torch, transformers), plus what
        # transformers needs to read a GGUF file
        "$LLAMACPP_PYTHON" -c "import gguf, accelerate" 2>/dev/null ||
            "$LLAMACPP_PYTHON" -m pip install --quiet "gguf>=0.10.0" accelerate >&2 ||
            die "pip install gguf accelerate failed"
        PYTHON=$LLAMACPP_PYTHON "$SHARED/models/smollm2/get.sh" "$HOME/.cache/energon/smollm2" \
            --hf >&2 || die "get.sh failed"
    fi
fi
[ -f "$HF/config.json" ] && [ -f "$HF/tokenizer.json" ] || die "$HF: no config.json / tokenizer.json"

W=$(mktemp -d "${TMPDIR:-/tmp}/en_perplexity_XXXXXX")
trap 'rm -rf "$W"' EXIT
touch "$W/notes"
note() { echo "$*" >>"$W/notes"; }

# ---------------------------------------------------------------------------
# the text: k*(W-1)+1 tokens for energon, a few more words for llama.cpp
# ---------------------------------------------------------------------------
log "cutting $TEXT to about $TOKENS tokens at a word boundary"
"$LLAMACPP_PYTHON" - "$HF/tokenizer.json" "$TEXT" "$CTX" "$TOKENS" "$W" >"$W/text.info" <<'PY' ||
import re, sys
from tokenizers import Tokenizer
tok_path, text_path, W, target, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
tok = Tokenizer.from_file(tok_path)
src = open(text_path, encoding="utf-8").read()
S = W - 1
k = (target - 1) // S
n_special = len(tok.encode("a").ids) - len(tok.encode("a", add_special_tokens=False).ids)
want = k * S + 1 - n_special  # text tokens for energon (the special ones are added by both tools)
starts = [0] + [m.end() for m in re.finditer(r"\n\s*\n", src)]
for a in starts[:200]:
    body = src[a:a + 12 * target]
    enc = tok.encode(body, add_special_tokens=False)
    if len(enc.ids) < want + 40:
        break
    cut = enc.offsets[want - 1][1]
    # a word ends here and the next begins with a space: a pre-token boundary
    if not (body[cut - 1].isalnum() or body[cut - 1] in ".,;:!?'\")") or body[cut] != " " or not body[cut + 1].isalpha():
        continue
    e_text = body[:cut]
    rest = body[cut:cut + 120]
    l_text = e_text + rest[:rest.rfind(" ")]
    e_ids = tok.encode(e_text, add_special_tokens=False).ids
    l_ids = tok.encode(l_text, add_special_tokens=False).ids
    if len(e_ids) != want or l_ids[:want] != e_ids or len(l_ids) - want < 2 or len(l_ids) + n_special > (k + 1) * S:
        continue
    open(out + "/text_energon.txt", "w", encoding="utf-8").write(e_text)
    open(out + "/text_llamacpp.txt", "w", encoding="utf-8").write(l_text)
    print(f"chars {a}..{a + cut} of {text_path} ({len(e_text)} characters); "
          f"{want + n_special} tokens ({n_special} special) for energon, "
          f"{len(l_ids) + n_special} for llama-perplexity; {k} windows x {S} scored tokens = {k * S}")
    print(k * S)
    sys.exit(0)
sys.exit("no usable cut found: the text is too short for --tokens, or has no plain word boundaries")
PY
    die "could not prepare the text"
TEXT_INFO=$(head -1 "$W/text.info")
SCORED=$(sed -n 2p "$W/text.info")

# ---------------------------------------------------------------------------
# GGUF files
# ---------------------------------------------------------------------------
log "convert_hf_to_gguf.py -> f32 GGUF"
PYTHONPATH="$LLAMACPP_SRC/gguf-py${PYTHONPATH:+:$PYTHONPATH}" "$LLAMACPP_PYTHON" \
    "$LLAMACPP_SRC/convert_hf_to_gguf.py" "$HF" --outtype f32 --outfile "$W/model-f32.gguf" \
    >"$W/convert.log" 2>&1 || {
    tail -20 "$W/convert.log" >&2
    die "convert_hf_to_gguf.py failed"
}
gguf_of() {
    case $1 in f32) echo "$W/model-f32.gguf" ;; bf16) echo "$W/model-bf16.gguf" ;;
    q8) echo "$W/model-q8_0.gguf" ;; q4) echo "$W/model-q4_0.gguf" ;; esac
}
qtype_of() { case $1 in f32) echo F32 ;; bf16) echo BF16 ;; q8) echo Q8_0 ;; q4) echo Q4_0 ;; esac; }
# q8/q4: the transformer's matrices quantised, the token embedding and the
# output projection (tied to it in SmolLM2) float32, on both sides
quant_args() { case $1 in q8 | q4) echo "--token-embedding-type f32 --output-tensor-type f32" ;; esac; }
en_args() { case $1 in q8 | q4) echo "--output-weights f32" ;; esac; }
for w in $WIDTHS; do
    [ "$w" = f32 ] && continue
    log "llama-quantize --pure $(quant_args "$w") -> $(qtype_of "$w")"
    # shellcheck disable=SC2046
    "$LLAMACPP_BIN/llama-quantize" --pure $(quant_args "$w") "$W/model-f32.gguf" "$(gguf_of "$w")" "$(qtype_of "$w")" \
        "$THREADS" >"$W/quantize-$w.log" 2>&1 || {
        note "llama-quantize to $(qtype_of "$w"): $(tail -1 "$W/quantize-$w.log")"
        rm -f "$(gguf_of "$w")"
    }
done

# (every loading command parses it the same way; eval takes --help after it)
if "$ENERGON" eval --weights f32 --help >/dev/null 2>&1; then
    EN_WFLAG=--weights
else
    EN_WFLAG=--dtype
    log "this energon has no --weights yet: --dtype for f32/bf16, q8/q4 will fail (n/a)"
fi
REPACK=
lp_help=$("$LLAMACPP_BIN/llama-perplexity" --help 2>&1 || true) # not piped into grep -q: SIGPIPE
if grep -q -- '--no-repack' <<<"$lp_help"; then
    REPACK=--no-repack # its quantized kernels crash with repacking on some machines
else
    note "llama-perplexity has no --no-repack; it ran with weight repacking on"
fi

# ---------------------------------------------------------------------------
# the runs
# ---------------------------------------------------------------------------
S=$((CTX - 1))
LC_C=$((CTX - S / 2)) # strided mode adds S/2 back: n_ctx = CTX
declare -A EN LC LCD
# energon must really hold the width asked for (one that does not know a
# width may fall back to another): bench prefill reports "weights"
en_probe() { # width
    local out got
    # shellcheck disable=SC2046
    out=$("$ENERGON" bench prefill --model "$HF" --tokens 4 --repeats 1 --threads "$THREADS" \
        $EN_WFLAG "$1" $(en_args "$1") --json 2>"$W/probe.log") || return 0 # eval reports the error
    got=$("$PY" -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1]).get("weights",""))' <<<"$out")
    case $got in
    "$1"* | "") return 0 ;;
    *) note "energon $EN_WFLAG $1 loaded $got weights: its column is n/a"; return 1 ;;
    esac
}
for w in $WIDTHS; do
    log "width $w: energon eval"
    # shellcheck disable=SC2046
    if ! en_probe "$w"; then
        EN[$w]=n/a
    elif out=$("$ENERGON" eval --model "$HF" --data "$W/text_energon.txt" --ctx "$CTX" \
        --threads "$THREADS" $EN_WFLAG "$w" $(en_args "$w") --json 2>"$W/en.log"); then
        EN[$w]=$("$PY" -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["ppl"])' <<<"$out")
        n=$("$PY" -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["tokens"])' <<<"$out")
        [ "$n" = "$SCORED" ] || note "energon $w scored $n tokens, not $SCORED: its tokenization differs from tokenizer.json's"
    else
        EN[$w]=n/a
        note "energon eval $w: $(grep -v '^\s*$' "$W/en.log" | tail -1 | cut -c1-160)"
    fi
    f=$(gguf_of "$w")
    if [ ! -f "$f" ]; then
        LC[$w]=n/a LCD[$w]=n/a
        continue
    fi
    log "width $w: llama-perplexity, strided (energon's windows)"
    if "$LLAMACPP_BIN/llama-perplexity" -m "$f" -f "$W/text_llamacpp.txt" -c "$LC_C" -b "$LC_C" \
        --ppl-stride "$S" -t "$THREADS" $REPACK >"$W/lc.log" 2>&1; then
        LC[$w]=$(grep -oE '\[[0-9]+\][0-9.]+' "$W/lc.log" | tail -1 | sed 's/.*\]//')
        chunks=$(sed -n 's/.*computing over \([0-9]*\) chunks.*/\1/p' "$W/lc.log" | head -1)
        [ -n "${LC[$w]}" ] || LC[$w]=n/a
        [ "$((chunks * S))" = "$SCORED" ] ||
            note "llama-perplexity $w scored $chunks x $S tokens, not $SCORED: its tokenization differs"
    else
        LC[$w]=n/a
        note "llama-perplexity $w: $(grep -v '^\s*$' "$W/lc.log" | tail -1 | cut -c1-160)"
    fi
    log "width $w: llama-perplexity, default (second half of each $CTX-token chunk)"
    if "$LLAMACPP_BIN/llama-perplexity" -m "$f" -f "$W/text_llamacpp.txt" -c "$CTX" \
        -t "$THREADS" $REPACK >"$W/lcd.log" 2>&1; then
        LCD[$w]=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$W/lcd.log" | tail -1)
        [ -n "${LCD[$w]}" ] || LCD[$w]=n/a
    else
        LCD[$w]=n/a
        note "llama-perplexity (default) $w: $(grep -v '^\s*$' "$W/lcd.log" | tail -1 | cut -c1-160)"
    fi
done

# ---------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------
isnum() { [[ $1 =~ ^[0-9.eE+-]+$ ]]; }
fmt() { if isnum "$1"; then printf '%.4f' "$1"; else echo "$1"; fi; }
rel() { # x base
    if isnum "$1" && isnum "$2"; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f", a / b }'; else echo n/a; fi
}
base_en=${EN[f32]:-n/a} base_lc=${LC[f32]:-n/a}
echo
echo "## perplexity, SmolLM2-135M-Instruct: energon vs llama.cpp"
echo
echo "- machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $THREADS threads"
echo "- energon: $ENERGON ($("$ENERGON" --version 2>/dev/null | head -1)); widths via $EN_WFLAG"
echo "- llama.cpp: $LLAMACPP_VERSION; GGUF by convert_hf_to_gguf.py --outtype f32, llama-quantize --pure${REPACK:+; $REPACK}"
echo "- q8/q4 on both sides: every transformer matrix at the width; the token embedding and the (tied) output"
echo "  projection float32 (energon --output-weights f32; llama-quantize --token-embedding-type f32 --output-tensor-type f32)"
echo "- model: $HF"
echo "- text: $TEXT_INFO"
echo "- scoring, both tools: windows of $CTX tokens overlapping by one, every token after the first scored once"
echo "  (energon eval --ctx $CTX; llama-perplexity -c $LC_C -b $LC_C --ppl-stride $S, i.e. n_ctx $CTX)."
echo "  Last column: llama-perplexity's own default (-c $CTX: only the second half of each chunk is scored,"
echo "  with at least $((CTX / 2)) tokens of context), not comparable with the others."
echo
echo "| width | energon ppl | ratio to energon f32 | llama.cpp ppl | ratio to llama.cpp f32 | llama.cpp default ppl |"
echo "|---|---:|---:|---:|---:|---:|"
for w in $WIDTHS; do
    echo "| $w / $(qtype_of "$w") | $(fmt "${EN[$w]}") | $(rel "${EN[$w]}" "$base_en") | $(fmt "${LC[$w]}") | $(rel "${LC[$w]}" "$base_lc") | $(fmt "${LCD[$w]}") |"
done
if [ -s "$W/notes" ]; then
    echo
    echo "Notes:"
    sed 's/^/- /' "$W/notes"
fi
