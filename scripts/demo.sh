#!/usr/bin/env bash
# The demo of the transformer core: convert the pretrained stories260K
# llama2.c checkpoint (../shared/models) into a Hugging Face directory, then
# continue "Once upon a time" greedily, score a held-out sentence, and time
# decoding. The fine-tuning issue turns this into the full company-data story.
set -euo pipefail
ENERGON=${1:-build/energon}
HERE=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${ENERGON_SHARED:-$HERE/../shared}
OUT=$HERE/demo-out
S260=$SHARED/models/stories260K

if [ ! -f "$S260/stories260K.bin" ]; then
    echo "demo: $S260/stories260K.bin not found; the demo needs the shared model files" >&2
    echo "      (set ENERGON_SHARED to the folder that holds models/)" >&2
    exit 1
fi
mkdir -p "$OUT"
echo "== 1. convert the llama2.c checkpoint to a Hugging Face directory"
"$ENERGON" convert llama2c --checkpoint "$S260/stories260K.bin" \
    --tokenizer "$S260/tok512.model" --out "$OUT/stories260K"
ls -l "$OUT/stories260K"
echo
echo "== 2. greedy continuation of \"Once upon a time\""
printf 'Once upon a time'
"$ENERGON" generate --model "$OUT/stories260K" --prompt "Once upon a time" \
    --temperature 0 --max-tokens 200
echo
echo "== 3. sampled continuation (temperature 0.8, top-p 0.9, seed 7)"
printf 'The little dog'
"$ENERGON" generate --model "$OUT/stories260K" --prompt "The little dog" \
    --temperature 0.8 --top-p 0.9 --seed 7 --max-tokens 120
echo
echo "== 4. perplexity on a short story the model has not seen"
cat > "$OUT/story.txt" <<'TXT'
Tom had a red ball. He liked to throw the ball to his dog. One day the ball
went over the fence. Tom was sad. His mom helped him find the ball, and Tom
was happy again. He said thank you to his mom and they played together.
TXT
"$ENERGON" eval --model "$OUT/stories260K" --data "$OUT/story.txt"
echo
echo "== 5. decode speed"
"$ENERGON" bench decode --model "$OUT/stories260K" --tokens 128 --repeats 3
