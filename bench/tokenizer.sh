#!/usr/bin/env bash
# bench/tokenizer.sh ENERGON [TEXT] [BYTES]: encoding speed of energon's
# tokenizer.json reader beside the Python `tokenizers` package (the reference
# implementation, Rust), on the same text, same machine, same run: one encode
# call over the first BYTES of TEXT (default ../shared/models/text/sotu.txt,
# 1 MB), median of 5, for each tokenizer.json in ../shared/models. Prints
# MB/s for both and the ratio. Needs `pip install tokenizers` (it is only for
# measuring; energon does not use it).
set -euo pipefail
ENERGON=${1:?usage: bench/tokenizer.sh ENERGON [TEXT] [BYTES]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${EN_SHARED_DIR:-$ROOT/../shared}
TEXT=${2:-$SHARED/models/text/sotu.txt}
BYTES=${3:-1000000}
PY=${PYTHON:-python3}
printf "%-40s %12s %12s %8s\n" tokenizer "energon MB/s" "HF MB/s" ratio
for tj in "$SHARED/models/smollm2/tokenizer/tokenizer.json" \
          "$SHARED/models/real-tokenizers/qwen3/tokenizer.json" \
          "$SHARED/models/tiny-random-gpt2/tokenizer.json"; do
    [ -f "$tj" ] || continue
    en=$("$ENERGON" bench tokenize --model "$tj" --text "$TEXT" --bytes "$BYTES" --repeats 5 --json |
         "$PY" -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d["mb_per_s"], d["tokens"])')
    hf=$("$PY" - "$tj" "$TEXT" "$BYTES" <<'PYEOF'
import statistics, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
b = open(sys.argv[2], "rb").read()[: int(sys.argv[3])]
while b and (b[-1] & 0xC0) == 0x80:
    b = b[:-1]
text = b.decode("utf-8", errors="ignore")
ts = []
for _ in range(5):
    t0 = time.perf_counter()
    enc = tok.encode(text, add_special_tokens=False)
    ts.append(time.perf_counter() - t0)
print(len(b) / 1e6 / statistics.median(ts), len(enc.ids))
PYEOF
)
    read -r en_mbs en_n <<<"$en"
    read -r hf_mbs hf_n <<<"$hf"
    note=""
    [ "$en_n" = "$hf_n" ] || note=" (token counts differ: $en_n vs $hf_n)"
    printf "%-40s %12.2f %12.2f %7.2fx%s\n" "$(basename "$(dirname "$tj")")/$(basename "$tj")" \
        "$en_mbs" "$hf_mbs" "$("$PY" -c 'import sys; print(float(sys.argv[1]) / float(sys.argv[2]))' "$en_mbs" "$hf_mbs")" "$note"
done
