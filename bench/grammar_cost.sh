#!/usr/bin/env bash
# bench/grammar_cost.sh [--model DIR] [--repeats 5] [--tokens 256] [--threads 2]
#                       [--prompt TEXT]
#
# The cost of grammar-constrained sampling (issue 16): decode tokens/s of
# `energon generate` with a JSON Schema against without, on a random model
# of stories15M's shape (energon init with the Llama 2 tokenizer from
# ../shared; --model DIR reuses one). The schema is an object of realistic
# shape: a name string of at most 40 characters, an integer, an enum, an
# array of up to 8 strings, a nested object of three strings and a boolean.
# It is compiled by `energon generate --json-schema FILE --print-grammar`
# and wrapped in an array that never closes (root ::= "[" ws items, items
# ::= item "," ws items), so the constrained run never ends early and both
# decode the same number of tokens. The runs alternate (unconstrained, then
# constrained, same prompt and seed), N times each; tokens/s is generate's
# own decode figure (prompt and loading excluded). Prints each pair, the
# medians and their ratio (the issue asks for >= 0.90).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
ENERGON=${ENERGON:-$ROOT/build/energon}
SHARED=${EN_SHARED:-$(dirname "$ROOT")/shared}
MODEL= REPEATS=5 TOKENS=256 THREADS=2 PROMPT="The list of users:"
while [ $# -gt 0 ]; do
    case $1 in
    --model) MODEL=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --prompt) PROMPT=$2; shift 2 ;;
    *) echo "grammar_cost.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
log() { echo "grammar_cost: $*" >&2; }
[ -x "$ENERGON" ] || { log "no energon at $ENERGON (make build, or set ENERGON)"; exit 1; }
W=$(mktemp -d /tmp/en_grammar_cost_XXXXXX)
trap 'rm -rf "$W"' EXIT

if [ -z "$MODEL" ] || [ ! -f "$MODEL/config.json" ]; then
    TOK=${EN_LLAMA2_TOKENIZER:-$SHARED/models/llama2-tokenizer/tokenizer.model}
    [ -f "$TOK" ] || { log "no Llama 2 tokenizer at $TOK"; exit 1; }
    [ -z "$MODEL" ] && MODEL=$W/s15m
    cat >"$W/s15m.json" <<JSON
{"model_type": "llama", "hidden_size": 288, "intermediate_size": 768, "num_hidden_layers": 6,
 "num_attention_heads": 6, "num_key_value_heads": 6, "max_position_embeddings": 1024,
 "rms_norm_eps": 1e-5, "tie_word_embeddings": false}
JSON
    log "making a random s15m model in $MODEL"
    "$ENERGON" init --config "$W/s15m.json" --tokenizer "$TOK" --out "$MODEL" --seed 1 >/dev/null
fi

cat >"$W/schema.json" <<'JSON'
{"type": "object",
 "properties": {
   "name": {"type": "string", "maxLength": 40},
   "age": {"type": "integer"},
   "role": {"enum": ["admin", "editor", "viewer", "guest"]},
   "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 8},
   "address": {"type": "object",
               "properties": {"street": {"type": "string", "maxLength": 60},
                              "city": {"type": "string", "maxLength": 30},
                              "zip": {"type": "string", "maxLength": 10}},
               "required": ["street", "city"]},
   "active": {"type": "boolean"}},
 "required": ["name", "age", "role", "tags", "address", "active"]}
JSON
{
    printf 'root ::= "[" ws items\nitems ::= item "," ws items\n'
    "$ENERGON" generate --json-schema "$W/schema.json" --print-grammar |
        sed 's/^root ::= /item ::= /'
} >"$W/stream.gbnf"

# decode tokens/s of one run (its stderr in $1), checking it made $TOKENS
rate() {
    local line
    line=$(grep -o 'generated [0-9]* tokens in [0-9.]* s ([0-9.]* tok/s)' "$1") ||
        { log "no timing line in $1:"; cat "$1" >&2; exit 1; }
    set -- $line
    [ "$2" = "$TOKENS" ] || { log "a run generated $2 tokens, not $TOKENS"; exit 1; }
    echo "${7#(}"
}
median() {
    sort -g | awk '{v[NR] = $1}
        END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

run() { # seed, extra args...
    local seed=$1
    shift
    "$ENERGON" generate --model "$MODEL" --prompt "$PROMPT" --max-tokens "$TOKENS" \
        --threads "$THREADS" --seed "$seed" "$@" >"$W/out.txt" 2>"$W/err.txt"
}
: >"$W/plain" && : >"$W/constrained"
for i in $(seq 1 "$REPEATS"); do
    run "$i"
    u=$(rate "$W/err.txt")
    run "$i" --grammar "$W/stream.gbnf"
    c=$(rate "$W/err.txt")
    echo "$u" >>"$W/plain" && echo "$c" >>"$W/constrained"
    masks=$(grep -o '[0-9]* token masks, [0-9]* from the cache' "$W/err.txt" || true)
    printf 'run %d: unconstrained %7.1f tok/s, json schema %7.1f tok/s (%s)\n' "$i" "$u" "$c" \
        "$masks"
done
mu=$(median <"$W/plain")
mc=$(median <"$W/constrained")
printf 'median of %d: unconstrained %.1f tok/s, json schema %.1f tok/s, ratio %.3f\n' \
    "$REPEATS" "$mu" "$mc" "$(awk -v a="$mc" -v b="$mu" 'BEGIN {print a / b}')"
