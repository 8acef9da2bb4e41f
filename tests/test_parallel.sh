#!/usr/bin/env bash
# test_parallel.sh ENERGON FIXTURES SHARED MPIEXEC
# Data parallelism through the command line, under mpirun on CPU:
#  - per-step losses of 10 steps with the same global batch equal the
#    single-process run within 1e-5 relative for dp2, dp2 + ZeRO-1 and dp4;
#  - a rank SIGKILLed mid-run ends the job at once, naming the rank, and the
#    run resumes from its newest checkpoint;
#  - checkpoints are layout-free: a dp2 + ZeRO-1 run resumed by one process,
#    and a one-process run resumed under dp2 + ZeRO-1, continue the
#    reference curve;
#  - tensor-parallel inference (generate, eval --tp 2) equals one process;
#    sizes that do not divide are refused;
#  - tensor-parallel training (tp2 with each recompute mode, with sequence
#    parallelism, tp2 x dp2 with ZeRO-1) follows the one-process losses; the
#    printed activation bytes per layer follow the formula (1/T with SP);
#    checkpoints resume under other layouts and the final model is whole;
#    LoRA under tp2 and tp2 x dp2 + SP follows one process's LoRA run.
set -u
ENERGON=$1
FIX=$2
SHARED=${3:-}
MPIEXEC=${4:-mpirun}
T=$(mktemp -d /tmp/en_par_XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
MPI=("$MPIEXEC" --allow-run-as-root --oversubscribe)
command -v "$MPIEXEC" >/dev/null || { echo "test_parallel: SKIPPED: $MPIEXEC not found"; exit 77; }

# a small model made here (tokenizer + energon init), so this runs anywhere
for i in $(seq 1 120); do
    echo "Shipment $i left dock $((i % 7)) with $((i % 13)) pallets of crates."
    [ $((i % 6)) -eq 0 ] && echo
done >"$T/docs.txt"
"$ENERGON" tokenizer train --data "$T/docs.txt" --vocab-size 300 --out "$T/tok.model" >/dev/null 2>&1 || { echo "FAIL tokenizer"; exit 1; }
echo '{"model_type":"llama","hidden_size":48,"intermediate_size":96,"num_hidden_layers":2,
 "num_attention_heads":4,"num_key_value_heads":2,"max_position_embeddings":64}' >"$T/cfg.json"
"$ENERGON" init --config "$T/cfg.json" --tokenizer "$T/tok.model" --out "$T/base" >/dev/null 2>&1 || { echo "FAIL init"; exit 1; }

ARGS=(--model "$T/base" --data "$T/docs.txt" --doc-sep blank --seq-len 32 --batch 2
      --batch-tokens 256 --steps 10 --lr 2e-3 --warmup 2 --weight-decay 0.1 --save-every 5
      --keep 3 --eval-every 0 --threads 1 --seed 5)
losses() { grep -o '"loss":[^,]*' "$1/metrics.jsonl" | cut -d: -f2; }
# compare NAME DIR: every step's loss within 1e-5 relative of the reference
compare() {
    if [ ! -f "$2/metrics.jsonl" ]; then echo "FAIL $1: no metrics"; fail=$((fail + 1)); return; fi
    local worst
    worst=$(paste <(losses "$T/ref") <(losses "$2") | awk '
        { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > w) w = r }
        END { if (n != 10) print "count", n; else printf "%.2e\n", w }')
    if awk -v w="$worst" 'BEGIN { exit !(w + 0 <= 1e-5 && w !~ /count/) }'; then
        echo "  ok $1: 10 losses within $worst relative of one process"; pass=$((pass + 1))
    else
        echo "FAIL $1: $worst"; paste <(losses "$T/ref") <(losses "$2") | head -10; fail=$((fail + 1))
    fi
}

# resume_in NAME SRC TAG NP [FLAGS...]: copy run SRC, drop its last
# checkpoint, resume it on NP processes (1: without mpirun) with FLAGS, and
# compare its losses with the reference's
resume_in() {
    local name=$1 src=$2 d="$T/resume_$3" np=$4
    shift 4
    local launch=()
    [ "$np" -gt 1 ] && launch=("${MPI[@]}" -np "$np")
    cp -r "$src" "$d"
    rm -rf "$d/checkpoints/step-00000010"
    "${launch[@]}" "$ENERGON" finetune --resume "$d" --threads 1 "$@" >"$d.log" 2>&1
    if grep -q "resuming from .*step-00000005" "$d.log"; then
        compare "$name" "$d"
    else
        echo "FAIL $name: did not resume from step 5"; tail -3 "$d.log"; fail=$((fail + 1))
    fi
}
# same_nll NAME A B: two eval nll figures within 1e-5 relative
same_nll() {
    if awk -v a="$2" -v b="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 1e-5 * a) }'; then
        echo "  ok $1: nll $3 (one process: $2)"; pass=$((pass + 1))
    else
        echo "FAIL $1: nll $3 vs $2"; fail=$((fail + 1))
    fi
}
nll_of() { "$@" --json 2>/dev/null | sed -E 's/.*"nll":([^,]*),.*/\1/'; }

"$ENERGON" finetune "${ARGS[@]}" --out "$T/ref" >"$T/ref.log" 2>&1 || { echo "FAIL reference"; tail -3 "$T/ref.log"; exit 1; }
"${MPI[@]}" -np 2 "$ENERGON" finetune "${ARGS[@]}" --out "$T/dp2" >"$T/dp2.log" 2>&1
compare "dp2" "$T/dp2"
"${MPI[@]}" -np 2 "$ENERGON" finetune "${ARGS[@]}" --zero 1 --out "$T/dp2z" >"$T/dp2z.log" 2>&1
compare "dp2 + ZeRO-1" "$T/dp2z"
grep -q "ZeRO-1: each rank keeps 1/D" "$T/dp2z.log" && grep -q "global batch = 2 sequences x 2 accumulation x 2 ranks" "$T/dp2z.log" &&
    { echo "  ok the run reports the global batch and the optimizer sharding"; pass=$((pass + 1)); } ||
    { echo "FAIL global batch report"; fail=$((fail + 1)); }
"${MPI[@]}" -np 4 "$ENERGON" finetune "${ARGS[@]}" --zero 1 --out "$T/dp4" >"$T/dp4.log" 2>&1
compare "dp4 + ZeRO-1" "$T/dp4"

# A rank killed mid-run (SIGKILL to rank 1 of a dp2 run once 6 steps are
# logged: rank 0 is then in, or about to enter, a gradient all-reduce with
# it): the job must end well within the collective watchdog's 300 s with a
# message naming rank 1, and `--resume` must continue from the newest
# checkpoint the job left (a half-written one is skipped), to the end (K + 10 steps, every step
# logged once, in order). Resuming along the reference curve is checked by
# resume_in below.
kill_rank() {
    local d="$T/killed" start pid r killed= k
    "${MPI[@]}" -np 2 "$ENERGON" finetune "${ARGS[@]}" --steps 100000 --save-every 5 \
        --out "$d" >"$d.log" 2>&1 &
    local job=$!
    for _ in $(seq 1 1200); do
        [ -f "$d/metrics.jsonl" ] && [ "$(grep -c '"loss"' "$d/metrics.jsonl")" -ge 6 ] && break
        sleep 0.05
    done
    start=$(date +%s)
    for pid in $(pgrep -f -- "--out $d\$"); do
        r=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
        [ "$r" = 1 ] && kill -KILL "$pid" && killed=$pid
    done
    wait "$job"
    local rc=$? secs=$(($(date +%s) - start))
    k=$(ls "$d/checkpoints" 2>/dev/null | grep -E '^step-[0-9]+$' | sort | tail -1)
    if [ -z "$killed" ] || [ -z "$k" ]; then
        echo "FAIL rank killed: rank 1 '$killed', checkpoint '$k'"; fail=$((fail + 1)); return
    fi
    if [ "$rc" -ne 0 ] && [ "$secs" -lt 120 ] && grep -qE "rank 1[^0-9]" "$d.log"; then
        echo "  ok rank 1 killed at $k+: the job ended in ${secs} s (rc $rc), naming rank 1"
        pass=$((pass + 1))
    else
        echo "FAIL rank killed: rc $rc after ${secs} s"; tail -5 "$d.log"; fail=$((fail + 1))
    fi
    k=$((10#${k#step-}))
    "${MPI[@]}" -np 2 "$ENERGON" finetune --resume "$d" --threads 1 --steps $((k + 10)) \
        >"$d.r.log" 2>&1
    local steps
    steps=$(grep -o '"step":[0-9]*' "$d/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
    if grep -q "resuming from .*step-$(printf %08d "$k")" "$d.r.log" &&
        [ "$steps" = "$(seq -s ' ' 1 $((k + 10))) " ]; then
        echo "  ok the killed run resumed from step $k, its last checkpoint, to step $((k + 10))"
        pass=$((pass + 1))
    else
        echo "FAIL killed run resumed: steps '$steps'"; tail -3 "$d.r.log"; fail=$((fail + 1))
    fi
}
kill_rank

# layout-free checkpoints: drop the last checkpoint and resume under another layout
resume_in "dp2 + ZeRO-1 run resumed by one process" "$T/dp2z" r1 1
resume_in "one-process run resumed under dp2 + ZeRO-1" "$T/ref" r2 2 --zero 1

# tensor-parallel inference: greedy ids and eval nll equal one process
one=$("$ENERGON" generate --model "$T/ref/model" --prompt "Shipment 7 left dock" --temperature 0 --max-tokens 24 --ignore-eos --json 2>/dev/null)
two=$("${MPI[@]}" -np 2 "$ENERGON" generate --model "$T/ref/model" --prompt "Shipment 7 left dock" --temperature 0 --max-tokens 24 --ignore-eos --json --tp 2 2>/dev/null)
ids1=$(echo "$one" | grep -o '"ids":\[[0-9,]*\]')
ids2=$(echo "$two" | grep -o '"ids":\[[0-9,]*\]')
if [ -n "$ids1" ] && [ "$ids1" = "$ids2" ]; then
    echo "  ok generate --tp 2 (mpirun -np 2): the same 24 greedy ids as one process"; pass=$((pass + 1))
else
    echo "FAIL generate --tp 2: '$ids1' vs '$ids2'"; fail=$((fail + 1))
fi
e1=$(nll_of "$ENERGON" eval --model "$T/ref/model" --data "$T/docs.txt")
e2=$(nll_of "${MPI[@]}" -np 2 "$ENERGON" eval --model "$T/ref/model" --data "$T/docs.txt" --tp 2)
same_nll "eval --tp 2 equals one process" "$e1" "$e2"
# 2 kv heads on 4 ranks: each kv head replicated on 2 ranks
four=$("${MPI[@]}" -np 4 "$ENERGON" generate --model "$T/ref/model" --prompt "Shipment 7 left dock" --temperature 0 --max-tokens 24 --ignore-eos --json --tp 4 2>/dev/null)
ids4=$(echo "$four" | grep -o '"ids":\[[0-9,]*\]')
if [ -n "$ids1" ] && [ "$ids1" = "$ids4" ]; then
    echo "  ok generate --tp 4 (2 kv heads, each on 2 ranks): the same greedy ids"; pass=$((pass + 1))
else
    echo "FAIL generate --tp 4: '$ids4'"; fail=$((fail + 1))
fi
"${MPI[@]}" -np 3 "$ENERGON" generate --model "$T/ref/model" --prompt "x" --tp 3 >"$T/tp3.log" 2>&1
if [ $? -ne 0 ] && grep -q "tensor-parallel size 3 does not divide num_attention_heads 4" "$T/tp3.log"; then
    echo "  ok --tp 3 refused: $(grep -m1 'does not divide' "$T/tp3.log" | sed 's/.*config.json: //')"; pass=$((pass + 1))
else
    echo "FAIL --tp 3 not refused clearly"; tail -3 "$T/tp3.log"; fail=$((fail + 1))
fi

# tensor-parallel training: tp2, tp2 + sequence of recompute modes, tp2 x dp2
"${MPI[@]}" -np 2 "$ENERGON" finetune "${ARGS[@]}" --tp 2 --out "$T/tp2" >"$T/tp2.log" 2>&1
compare "tp2" "$T/tp2"
"${MPI[@]}" -np 2 "$ENERGON" finetune "${ARGS[@]}" --tp 2 --recompute full --out "$T/tp2full" >"$T/tp2full.log" 2>&1
compare "tp2 + full recompute" "$T/tp2full"
"${MPI[@]}" -np 2 "$ENERGON" finetune "${ARGS[@]}" --tp 2 --recompute none --out "$T/tp2none" >"$T/tp2none.log" 2>&1
compare "tp2 + no recompute" "$T/tp2none"
"${MPI[@]}" -np 4 "$ENERGON" finetune "${ARGS[@]}" --tp 2 --zero 1 --out "$T/tp2dp2" >"$T/tp2dp2.log" 2>&1
compare "tp2 x dp2 + ZeRO-1" "$T/tp2dp2"
"${MPI[@]}" -np 2 "$ENERGON" finetune "${ARGS[@]}" --tp 2 --sequence-parallel --out "$T/tp2sp" >"$T/tp2sp.log" 2>&1
compare "tp2 + sequence parallel (selective recompute)" "$T/tp2sp"
"${MPI[@]}" -np 2 "$ENERGON" finetune "${ARGS[@]}" --tp 2 --sequence-parallel --recompute full --out "$T/tp2spf" >"$T/tp2spf.log" 2>&1
compare "tp2 + sequence parallel + full recompute" "$T/tp2spf"
"${MPI[@]}" -np 4 "$ENERGON" finetune "${ARGS[@]}" --tp 2 --sequence-parallel --zero 1 --out "$T/tp2spdp2" >"$T/tp2spdp2.log" 2>&1
compare "tp2 x dp2 + sequence parallel + ZeRO-1" "$T/tp2spdp2"
# activation bytes per layer printed by the runs, against the formula of
# models/train.h: 4 bytes x (rows_C * 4C + N * (2 QD + 2 KVD + 3F)) with the
# tensor-parallel shard's QD, KVD, F and rows_C = N (or N / tp with SP);
# model: C 48, 4 heads of 12, 2 kv heads, F 96; N = 2 x 32 tokens.
bytes() { grep -o '[0-9]* bytes per layer' "$1" | head -1 | cut -d' ' -f1; }
b1=$(bytes "$T/ref.log"); b2=$(bytes "$T/tp2.log"); b3=$(bytes "$T/tp2sp.log")
w1=$((4 * (64 * 4 * 48 + 64 * (2 * 48 + 2 * 24 + 3 * 96))))
w2=$((4 * (64 * 4 * 48 + 64 * (2 * 24 + 2 * 12 + 3 * 48))))
w3=$((4 * (32 * 4 * 48 + 64 * (2 * 24 + 2 * 12 + 3 * 48))))
if [ "$b1" = "$w1" ] && [ "$b2" = "$w2" ] && [ "$b3" = "$w3" ]; then
    echo "  ok activations per layer: 1 rank $b1 B, tp2 $b2 B, tp2 + SP $b3 B (= 1/2 of one rank's), as the formula says"; pass=$((pass + 1))
else
    echo "FAIL activations per layer: got $b1 $b2 $b3, formula $w1 $w2 $w3"; fail=$((fail + 1))
fi
"${MPI[@]}" -np 2 "$ENERGON" finetune "${ARGS[@]}" --sequence-parallel --out "$T/sp1" >"$T/sp1.log" 2>&1
[ $? -ne 0 ] && grep -q "needs tensor parallelism" "$T/sp1.log" &&
    { echo "  ok --sequence-parallel without --tp refused"; pass=$((pass + 1)); } ||
    { echo "FAIL --sequence-parallel without --tp"; fail=$((fail + 1)); }
"${MPI[@]}" -np 4 "$ENERGON" finetune "${ARGS[@]}" --tp 4 --sequence-parallel --out "$T/tp4sp" >"$T/tp4sp.log" 2>&1
compare "tp4 + sequence parallel (kv heads replicated)" "$T/tp4sp"
# layout-free: a tp2 x dp2 checkpoint resumed by one process, and the reverse with tp2
resume_in "tp2 x dp2 run resumed by one process" "$T/tp2dp2" r3 1
resume_in "one-process run resumed under tp2" "$T/ref" r4 2 --tp 2
resume_in "tp4 + SP run (replicated kv heads) resumed by one process" "$T/tp4sp" r5 1
# the final model of a tp2 run is a whole Hugging Face model: same eval as one process's
e1=$(nll_of "$ENERGON" eval --model "$T/ref/model" --data "$T/docs.txt")
e3=$(nll_of "$ENERGON" eval --model "$T/tp2/model" --data "$T/docs.txt")
same_nll "the tp2 run's exported model scores like one process's" "$e1" "$e3"
# a vocabulary tp does not divide (301 words; untied output matrix): padded
echo '{"model_type":"llama","hidden_size":48,"intermediate_size":96,"num_hidden_layers":2,
 "num_attention_heads":4,"num_key_value_heads":2,"max_position_embeddings":64,
 "vocab_size":301,"tie_word_embeddings":false}' >"$T/cfg301.json"
"$ENERGON" init --config "$T/cfg301.json" --tokenizer "$T/tok.model" --out "$T/base301" >/dev/null 2>&1
PARGS=("${ARGS[@]}")
PARGS[1]="$T/base301"
"$ENERGON" finetune "${PARGS[@]}" --out "$T/pref" >"$T/pref.log" 2>&1 || { echo "FAIL vocab-301 reference"; fail=$((fail + 1)); }
mv "$T/ref" "$T/ref_keep" && cp -r "$T/pref" "$T/ref"
"${MPI[@]}" -np 2 "$ENERGON" finetune "${PARGS[@]}" --tp 2 --out "$T/ptp2" >"$T/ptp2.log" 2>&1
compare "tp2 with vocab 301 (padded to 302)" "$T/ptp2"
"${MPI[@]}" -np 4 "$ENERGON" finetune "${PARGS[@]}" --tp 4 --sequence-parallel --out "$T/ptp4" >"$T/ptp4.log" 2>&1
compare "tp4 + SP with vocab 301 (padded to 304)" "$T/ptp4"
rm -rf "$T/ref" && mv "$T/ref_keep" "$T/ref"
g1=$("$ENERGON" generate --model "$T/pref/model" --prompt "Shipment 7 left dock" --temperature 0 --max-tokens 24 --ignore-eos --json 2>/dev/null | grep -o '"ids":\[[0-9,]*\]')
g4=$("${MPI[@]}" -np 4 "$ENERGON" generate --model "$T/pref/model" --prompt "Shipment 7 left dock" --temperature 0 --max-tokens 24 --ignore-eos --json --tp 4 2>/dev/null | grep -o '"ids":\[[0-9,]*\]')
if [ -n "$g1" ] && [ "$g1" = "$g4" ]; then
    echo "  ok generate --tp 4 with a padded vocabulary: the same greedy ids"; pass=$((pass + 1))
else
    echo "FAIL generate --tp 4 padded: '$g1' vs '$g4'"; fail=$((fail + 1))
fi
e1=$(nll_of "$ENERGON" eval --model "$T/pref/model" --data "$T/docs.txt")
e4=$(nll_of "$ENERGON" eval --model "$T/ptp4/model" --data "$T/docs.txt")
same_nll "the tp4 run's final model (padding dropped) scores like one process's" "$e1" "$e4"

# LoRA under tensor parallelism (adapters shard with the layers they adapt)
LARGS=("${ARGS[@]}" --lora-rank 4 --lora-targets q,k,v,o,gate,up,down --lr 5e-3)
"$ENERGON" finetune "${LARGS[@]}" --out "$T/lref" >"$T/lref.log" 2>&1 || { echo "FAIL LoRA reference"; tail -3 "$T/lref.log"; fail=$((fail + 1)); }
mv "$T/ref" "$T/ref_full" && cp -r "$T/lref" "$T/ref"   # compare() reads $T/ref
"${MPI[@]}" -np 2 "$ENERGON" finetune "${LARGS[@]}" --tp 2 --out "$T/ltp2" >"$T/ltp2.log" 2>&1
compare "LoRA under tp2" "$T/ltp2"
"${MPI[@]}" -np 4 "$ENERGON" finetune "${LARGS[@]}" --tp 2 --sequence-parallel --zero 1 --out "$T/ltp2dp2" >"$T/ltp2dp2.log" 2>&1
compare "LoRA under tp2 x dp2 + sequence parallel + ZeRO-1" "$T/ltp2dp2"
"${MPI[@]}" -np 4 "$ENERGON" finetune "${LARGS[@]}" --tp 4 --out "$T/ltp4" >"$T/ltp4.log" 2>&1
compare "LoRA under tp4 (kv heads replicated)" "$T/ltp4"
rm -rf "$T/ref" && mv "$T/ref_full" "$T/ref"
la=$(nll_of "$ENERGON" eval --model "$T/base" --adapter "$T/lref" --data "$T/docs.txt")
lb=$(nll_of "$ENERGON" eval --model "$T/base" --adapter "$T/ltp2" --data "$T/docs.txt")
same_nll "the tp2 run's adapter (gathered, PEFT layout) scores like one process's" "$la" "$lb"

echo "test_parallel: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
