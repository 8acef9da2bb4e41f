#!/usr/bin/env python3
"""Reference for `energon bench decode|prefill`: the same measurement with
PyTorch + Hugging Face transformers on the same model directory, thread
count, token counts and repeats, so figures can be quoted side by side as
ratios. Median of repeats after one warm-up, like energon's bench.

usage: torch_infer_bench.py MODEL_DIR [--threads 2] [--prefill 128]
                            [--decode 64] [--prompt 16] [--repeats 5]
Needs torch and transformers (PyPI); never used by energon itself.
"""
import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=128)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.eval()
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (1, a.prompt + max(a.decode, a.prefill)), generator=g)
    nbytes = sum(p.numel() for p in model.parameters()) * 4
    if model.config.tie_word_embeddings:
        pass  # parameters() already counts the shared matrix once

    def prefill():
        t0 = time.perf_counter()
        model(ids[:, :a.prefill], use_cache=True, logits_to_keep=1)
        return time.perf_counter() - t0

    def decode():
        cache = DynamicCache()
        out = model(ids[:, :a.prompt], past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        t0 = time.perf_counter()
        for t in range(a.decode):
            pos = a.prompt + t
            out = model(ids[:, pos:pos + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
        return time.perf_counter() - t0

    with torch.inference_mode():
        for name, fn, n in (("prefill", prefill, a.prefill), ("decode", decode, a.decode)):
            fn()  # warm-up
            times = [fn() for _ in range(a.repeats)]
            med = statistics.median(times)
            tps = n / med
            extra = f", weights read {nbytes * tps / 1e9:.2f} GB/s" if name == "decode" else ""
            print(f"torch {name}: {n} tokens, median of {a.repeats}, {a.threads} threads: "
                  f"{tps:.2f} tokens/s{extra}")


if __name__ == "__main__":
    main()
