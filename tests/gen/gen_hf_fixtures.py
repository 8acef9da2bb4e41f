#!/usr/bin/env python3
"""gen_hf_fixtures.py - tiny random Hugging Face models and their reference
logits, for tests/test_model_logits.c.

For each model below this script builds a small random model with
transformers (fixed seed), saves it with save_pretrained(safe_serialization=
True) to tests/fixtures/hf/<name>/ (only config.json and model.safetensors are
kept), runs a float32 forward with attn_implementation="eager" over a fixed
random token sequence and writes the logits of every position to
tests/fixtures/hf/<name>/logits.bin.

logits.bin format (version 1, little-endian, no padding):
    char     magic[4]   "ENFX"
    uint32   version    1
    uint32   n_tokens   T
    uint32   n_vocab    V
    int32    ids[T]     the input token ids
    float32  logits[T*V] row t = logits after reading ids[0..t] (full causal
                        forward, i.e. what an incremental run must reproduce)

Models (all 2 layers, max_position_embeddings 128, intermediate size not a
multiple of 8, weights ~ N(0, 0.1^2), norm weights ~ 1 + N(0, 0.1^2),
biases ~ N(0, 0.1^2) so that the logits are far from flat):
    llama_mha       LlamaConfig, H == Hkv, untied, rope_theta 1e4
    llama_gqa_tied  LlamaConfig, 6 heads / 2 kv heads, tied, rope_theta 5e5
    mistral         MistralConfig, GQA, sliding_window 8 < T (checked to
                    change the logits versus sliding_window=None)
    qwen2           Qwen2Config, q/k/v bias, untied, rope_theta 1e6
    llama_bf16      llama GQA stored as BF16; reference computed in float32
                    from the BF16 weights as loaded back from disk
    llama_f16       the same with F16 storage

Usage (from the repository root; Python is needed only to regenerate):
    python3 tests/gen/gen_hf_fixtures.py [out_dir]
The run is deterministic: the same torch/transformers versions give the same
files. Versions used are written to tests/fixtures/hf/VERSIONS.txt.
"""
import os
import shutil
import struct
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

SEED = 1234
N_TOKENS = 20
MAGIC = b"ENFX"
VERSION = 1

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "fixtures", "hf")

COMMON = dict(num_hidden_layers=2, max_position_embeddings=128, hidden_act="silu",
              attn_implementation="eager")


def models():
    """(name, config class, model class, config kwargs, storage dtype)."""
    return [
        ("llama_mha", LlamaConfig, LlamaForCausalLM,
         dict(vocab_size=300, hidden_size=48, intermediate_size=92, num_attention_heads=4,
              num_key_value_heads=4, tie_word_embeddings=False, rope_theta=10000.0,
              rms_norm_eps=1e-5), torch.float32),
        ("llama_gqa_tied", LlamaConfig, LlamaForCausalLM,
         dict(vocab_size=333, hidden_size=48, intermediate_size=92, num_attention_heads=6,
              num_key_value_heads=2, tie_word_embeddings=True, rope_theta=500000.0,
              rms_norm_eps=1e-6), torch.float32),
        ("mistral", MistralConfig, MistralForCausalLM,
         dict(vocab_size=317, hidden_size=48, intermediate_size=92, num_attention_heads=4,
              num_key_value_heads=2, tie_word_embeddings=False, rope_theta=10000.0,
              rms_norm_eps=1e-6, sliding_window=8), torch.float32),
        ("qwen2", Qwen2Config, Qwen2ForCausalLM,
         dict(vocab_size=301, hidden_size=48, intermediate_size=92, num_attention_heads=4,
              num_key_value_heads=2, tie_word_embeddings=False, rope_theta=1000000.0,
              rms_norm_eps=1e-6, use_sliding_window=False), torch.float32),
        ("llama_bf16", LlamaConfig, LlamaForCausalLM,
         dict(vocab_size=320, hidden_size=64, intermediate_size=100, num_attention_heads=8,
              num_key_value_heads=2, tie_word_embeddings=False, rope_theta=10000.0,
              rms_norm_eps=1e-5), torch.bfloat16),
        ("llama_f16", LlamaConfig, LlamaForCausalLM,
         dict(vocab_size=320, hidden_size=64, intermediate_size=100, num_attention_heads=8,
              num_key_value_heads=2, tie_word_embeddings=False, rope_theta=10000.0,
              rms_norm_eps=1e-5), torch.float16),
        # Saved in several shards with model.safetensors.index.json
        # (SHARDED below), as large checkpoints are.
        ("llama_sharded", LlamaConfig, LlamaForCausalLM,
         dict(vocab_size=310, hidden_size=48, intermediate_size=92, num_attention_heads=4,
              num_key_value_heads=2, tie_word_embeddings=False, rope_theta=10000.0,
              rms_norm_eps=1e-5), torch.float32),
    ]


# Models saved with this max_shard_size (several files plus an index).
SHARDED = {"llama_sharded": "60KB"}


def reinit(model, gen):
    """Re-initialise every parameter from `gen`, in name order: matrices and
    biases N(0, 0.1^2), norm weights 1 + N(0, 0.1^2)."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.1
            if name.endswith("norm.weight"):
                r += 1.0
            p.copy_(r)


def forward_logits(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float32).numpy()


def incremental_logits(model, ids, k):
    """Prefill ids[:k] then decode one token at a time with the HF cache."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids[:k]], dtype=torch.long), use_cache=True)
        rows = [out.logits[0]]
        cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
        for t in range(k, len(ids)):
            out = model(input_ids=torch.tensor([[ids[t]]], dtype=torch.long),
                        past_key_values=cache, use_cache=True)
            cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
            rows.append(out.logits[0])
    return torch.cat(rows, 0).to(torch.float32).numpy()


def write_logits(path, ids, logits):
    t, v = logits.shape
    assert t == len(ids)
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<III", VERSION, t, v))
        f.write(np.asarray(ids, dtype="<i4").tobytes())
        f.write(np.ascontiguousarray(logits, dtype="<f4").tobytes())


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def make(name, cfg_cls, model_cls, kw, dtype, seed, out_root):
    gen = torch.Generator().manual_seed(seed)
    cfg = cfg_cls(**COMMON, **kw)
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    reinit(model, gen)
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = torch.randint(0, cfg.vocab_size, (N_TOKENS,), generator=gen).tolist()

    out_dir = os.path.join(out_root, name)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        kwargs = {"max_shard_size": SHARDED[name]} if name in SHARDED else {}
        model.to(dtype).save_pretrained(tmp, safe_serialization=True, **kwargs)
        os.makedirs(out_dir)
        files = sorted(f for f in os.listdir(tmp)
                       if f == "config.json" or f.endswith(".safetensors")
                       or f == "model.safetensors.index.json")
        if name in SHARDED:
            shards = [f for f in files if f.endswith(".safetensors")]
            assert len(shards) >= 3 and "model.safetensors.index.json" in files, files
        for f in files:
            shutil.copy(os.path.join(tmp, f), os.path.join(out_dir, f))

    # Reference: load what was written (so BF16/F16 rounding is included),
    # then compute in float32 with eager attention.
    ref = model_cls.from_pretrained(out_dir, dtype=dtype, attn_implementation="eager")
    ref = ref.float().eval()
    logits = forward_logits(ref, ids)
    assert np.isfinite(logits).all()

    # Sanity: the HF KV-cache path agrees with the full forward.
    inc = incremental_logits(ref, ids, 7)
    e_inc = rel_err(inc, logits)
    assert e_inc < 1e-5, (name, e_inc)

    spread = float(np.mean(np.std(logits, axis=1)))
    note = f"{name}: V={cfg.vocab_size} T={N_TOKENS} logit std {spread:.3f}, " \
           f"HF incremental vs full {e_inc:.2e}"

    if getattr(cfg, "sliding_window", None) and cfg.model_type == "mistral":
        # The window must really be applied by eager attention: the same
        # weights without a window must give different logits after the
        # window fills, and identical ones before.
        w = cfg.sliding_window
        assert w < N_TOKENS
        nw = model_cls.from_pretrained(out_dir, dtype=dtype, attn_implementation="eager",
                                       sliding_window=None).float().eval()
        assert nw.config.sliding_window is None
        lnw = forward_logits(nw, ids)
        d_before = float(np.max(np.abs(lnw[:w] - logits[:w])))
        d_after = rel_err(lnw[w:], logits[w:])
        assert d_before < 1e-5, d_before
        assert d_after > 1e-2, d_after
        # Position w is the first whose window drops key 0 (keys s with
        # s > pos - w): it must differ, position w-1 must not.
        assert np.max(np.abs(lnw[w] - logits[w])) > 1e-4
        note += f"; sliding window {w}: rows < {w} equal to no-window " \
                f"(max diff {d_before:.1e}), rows >= {w} differ (rel {d_after:.2e})"

    write_logits(os.path.join(out_dir, "logits.bin"), ids, logits)
    return note


def main():
    out_root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT)
    os.makedirs(out_root, exist_ok=True)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    notes = []
    for i, (name, cfg_cls, model_cls, kw, dtype) in enumerate(models()):
        notes.append(make(name, cfg_cls, model_cls, kw, dtype, SEED + i, out_root))
        print(notes[-1])
    with open(os.path.join(out_root, "VERSIONS.txt"), "w") as f:
        f.write("Generated by tests/gen/gen_hf_fixtures.py\n")
        f.write(f"python {sys.version.split()[0]}\n")
        f.write(f"torch {torch.__version__}\n")
        f.write(f"transformers {transformers.__version__}\n")
        import safetensors
        f.write(f"safetensors {safetensors.__version__}\n")
        f.write(f"numpy {np.__version__}\n")
        f.write(f"seed {SEED} (model i uses seed {SEED}+i), {N_TOKENS} tokens\n")
        for n in notes:
            f.write(n + "\n")


if __name__ == "__main__":
    main()
