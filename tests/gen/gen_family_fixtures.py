#!/usr/bin/env python3
"""gen_family_fixtures.py - tiny random Hugging Face models of further model
families (Llama rope scalings, Qwen2 sliding window, Qwen3, Gemma 2, Gemma 3,
Phi-3, GPT-2) and their reference logits, for tests/test_model_logits.c.

Same method and file formats as gen_hf_fixtures.py: for each model below a
small random model is built with transformers (fixed seed), saved with
save_pretrained(safe_serialization=True) to tests/fixtures/hf/<name>/ (only
config.json and model.safetensors are kept), loaded back and run in float32
with attn_implementation="eager" over a fixed random token sequence; the
logits of every position are written to tests/fixtures/hf/<name>/logits.bin.

logits.bin format (version 1, little-endian, no padding):
    char     magic[4]   "ENFX"
    uint32   version    1
    uint32   n_tokens   T
    uint32   n_vocab    V
    int32    ids[T]     the input token ids
    float32  logits[T*V] row t = logits after reading ids[0..t], from ONE
                        full forward over all T tokens (use_cache=False)

phi3 also gets logits_short.bin (same format, T = 12 = the first 12 ids),
because Phi-3 longrope uses different frequencies below and above
original_max_position_embeddings (16).

Every parameter is drawn again from a fixed generator, in name order:
matrices and biases ~ N(0, 0.1^2), norm weights ~ 1 + N(0, 0.1^2) (for Gemma,
whose RMSNorm computes x * (1 + w), ~ N(0, 0.1^2) around 0).

Each model's special feature is checked to matter: the logits are computed
again with the feature switched off (rope scaling removed, softcap removed,
sliding window removed, ...) and the script fails if the max relative
difference is below MIN_EFFECT. The figures, the HF KV-cache (incremental,
one token at a time) versus full-forward difference and the rope frequencies
actually used are written to tests/fixtures/hf/VERSIONS_families.txt.
See tests/fixtures/hf/FAMILIES.md for what each fixture exercises.

Usage (from the repository root; Python is needed only to regenerate):
    python3 tests/gen/gen_family_fixtures.py [out_dir]
The run is deterministic: the same torch/transformers versions give the same
files.
"""
import copy
import math
import os
import shutil
import struct
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Phi3Config,
                          Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

SEED = 4321
N_TOKENS = 20
N_SHORT = 12          # phi3 logits_short.bin
N_PREFILL_HF = 7      # HF incremental check: prefill this many, then one at a time
MAGIC = b"ENFX"
VERSION = 1
MIN_EFFECT = 1e-3     # a feature switched off must change the logits at least this much (rel)
INC_TOL = 1e-5        # HF incremental vs full, where they are expected to agree

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "fixtures", "hf")
VERSIONS_NAME = "VERSIONS_families.txt"

LLAMA = dict(attn_implementation="eager", hidden_act="silu", rms_norm_eps=1e-5)


def models():
    """(name, config class, model class, config kwargs, gemma-style norms)."""
    return [
        # head_dim 16, theta 1e4: wavelengths 2*pi*1e4^(i/8) = 6.3, 19.9, 62.8, ...
        # against original_max_position_embeddings 32: high_freq_wavelen 32/4 = 8,
        # low_freq_wavelen 32/1 = 32 -> i=0 high (kept), i=1 medium (smoothed),
        # i>=2 low (divided by 8).
        ("llama3_rope", LlamaConfig, LlamaForCausalLM,
         dict(LLAMA, num_hidden_layers=2, vocab_size=300, hidden_size=48, intermediate_size=76,
              num_attention_heads=3, num_key_value_heads=1, head_dim=16,
              max_position_embeddings=128, tie_word_embeddings=False,
              rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 32}), False),
        # head_dim 16 != hidden 48 / 4 heads; q/k/v/o and gate/up/down biases; GQA 4/2.
        ("llama_linear_hd", LlamaConfig, LlamaForCausalLM,
         dict(LLAMA, num_hidden_layers=2, vocab_size=296, hidden_size=48, intermediate_size=68,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=128, tie_word_embeddings=False, attention_bias=True,
              mlp_bias=True,
              rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
         False),
        # max_position_embeddings 16 < T = 20: the full forward rescales the base.
        ("llama_dynamic", LlamaConfig, LlamaForCausalLM,
         dict(LLAMA, num_hidden_layers=2, vocab_size=302, hidden_size=48, intermediate_size=76,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
              tie_word_embeddings=False,
              rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
         False),
        # theta 1000 (not 1e4) so that the yarn ramp over the 8 frequencies has a
        # fractional value with original_max_position_embeddings 16 (checked).
        ("llama_yarn", LlamaConfig, LlamaForCausalLM,
         dict(LLAMA, num_hidden_layers=2, vocab_size=298, hidden_size=48, intermediate_size=76,
              num_attention_heads=3, num_key_value_heads=1, head_dim=16,
              max_position_embeddings=64, tie_word_embeddings=False,
              rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                               "original_max_position_embeddings": 16}), False),
        # layer_types become [full, sliding, sliding] (layers >= max_window_layers slide).
        ("qwen2_swa", Qwen2Config, Qwen2ForCausalLM,
         dict(attn_implementation="eager", hidden_act="silu", num_hidden_layers=3,
              vocab_size=306, hidden_size=32, intermediate_size=60, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
              rms_norm_eps=1e-6, use_sliding_window=True, sliding_window=8,
              max_window_layers=1), False),
        ("qwen3", Qwen3Config, Qwen3ForCausalLM,
         dict(attn_implementation="eager", hidden_act="silu", num_hidden_layers=2,
              vocab_size=292, hidden_size=48, intermediate_size=68, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
              tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
              rms_norm_eps=1e-6, attention_bias=False), False),
        # layer_types default to [sliding, full, sliding]; tied (Gemma default).
        ("gemma2", Gemma2Config, Gemma2ForCausalLM,
         dict(attn_implementation="eager", num_hidden_layers=3, vocab_size=310, hidden_size=32,
              intermediate_size=60, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              hidden_activation="gelu_pytorch_tanh", max_position_embeddings=128,
              rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
              query_pre_attn_scalar=24, sliding_window=8, attn_logit_softcapping=2.0,
              final_logit_softcapping=3.0, tie_word_embeddings=True), True),
        # rope per layer type: sliding layers default rope theta 1e4, full layers
        # linear factor 2 with theta 1e6 (as the 4B+ Gemma 3 models).
        ("gemma3", Gemma3TextConfig, Gemma3ForCausalLM,
         dict(attn_implementation="eager", num_hidden_layers=3, vocab_size=308, hidden_size=32,
              intermediate_size=60, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              hidden_activation="gelu_pytorch_tanh", max_position_embeddings=128,
              rms_norm_eps=1e-6, query_pre_attn_scalar=20, sliding_window=8,
              layer_types=["sliding_attention", "sliding_attention", "full_attention"],
              rope_parameters={
                  "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                  "full_attention": {"rope_type": "linear", "factor": 2.0,
                                     "rope_theta": 1000000.0}},
              tie_word_embeddings=True), True),
        # head_dim 12 -> 6 factors each; max_position_embeddings / original = 64 / 16
        # gives the attention factor sqrt(1 + ln 4 / ln 16).
        ("phi3", Phi3Config, Phi3ForCausalLM,
         dict(attn_implementation="eager", hidden_act="silu", num_hidden_layers=2,
              vocab_size=300, hidden_size=48, intermediate_size=64, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64,
              original_max_position_embeddings=16, rms_norm_eps=1e-5,
              tie_word_embeddings=False, pad_token_id=None, bos_token_id=None,
              eos_token_id=None,
              rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                               "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                               "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0]}), False),
        ("gpt2", GPT2Config, GPT2LMHeadModel,
         dict(attn_implementation="eager", vocab_size=294, n_positions=64, n_embd=40, n_layer=2,
              n_head=4, n_inner=None, activation_function="gelu_new", layer_norm_epsilon=1e-5,
              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
              bos_token_id=None, eos_token_id=None), False),
    ]


def is_norm_param(model, name):
    """A norm weight (RMSNorm / LayerNorm scale), by the owning module's class."""
    if not name.endswith(".weight"):
        return False
    mod = model.get_submodule(name[: -len(".weight")])
    return "Norm" in type(mod).__name__


def reinit(model, gen, gemma):
    """Re-initialise every parameter from `gen`, in name order: matrices and
    biases N(0, 0.1^2), norm weights 1 + N(0, 0.1^2) (Gemma: N(0, 0.1^2))."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.1
            if is_norm_param(model, name) and not gemma:
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
        cache = out.cache
        for t in range(k, len(ids)):
            out = model(input_ids=torch.tensor([[ids[t]]], dtype=torch.long), cache=cache,
                        use_cache=True)
            cache = out.cache
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


def fmt(xs):
    return "[" + ", ".join(f"{float(x):.6g}" for x in xs) + "]"


class Ctx:
    """One fixture: the saved directory, its config kwargs and the ids."""

    def __init__(self, name, cfg_cls, model_cls, kw, out_dir, ids):
        self.name, self.cfg_cls, self.model_cls, self.kw = name, cfg_cls, model_cls, kw
        self.out_dir, self.ids = out_dir, ids
        self.notes = []

    def load(self):
        """A fresh model from disk (fresh: dynamic/longrope rope state is per instance)."""
        return self.model_cls.from_pretrained(self.out_dir, dtype=torch.float32,
                                              attn_implementation="eager").float().eval()

    def variant(self, **changes):
        """The saved weights under a config with `changes` applied."""
        kw = copy.deepcopy(self.kw)
        kw.update(copy.deepcopy(changes))
        m = self.model_cls(self.cfg_cls(**kw)).eval()
        sd = self.load().state_dict()
        missing, unexpected = m.load_state_dict(sd, strict=False)
        assert not unexpected, unexpected
        # only the tied lm_head may be missing from the state dict
        assert all(k == "lm_head.weight" for k in missing), missing
        return m

    def effect(self, label, ref, model_or_logits, ids=None):
        """Record (and require) how much switching a feature off changes the logits."""
        if isinstance(model_or_logits, np.ndarray):
            other = model_or_logits
        else:
            other = forward_logits(model_or_logits, ids if ids is not None else self.ids)
        e = rel_err(other, ref)
        assert e >= MIN_EFFECT, f"{self.name}: '{label}' changes the logits by only {e:.2e}"
        self.notes.append(f"  feature off: {label}: rel diff {e:.3e}")
        return e

    def record(self, label, ref, model):
        """Record a difference that is allowed to be small."""
        e = rel_err(forward_logits(model, self.ids), ref)
        self.notes.append(f"  {label}: rel diff {e:.3e} (recorded, not required)")
        return e

    def note(self, s):
        self.notes.append("  " + s)


# --- per-model checks -------------------------------------------------------

def check_llama3(c, ref):
    m = c.load()
    rp = m.config.rope_parameters
    d = m.config.head_dim
    base = rp["rope_theta"]
    inv = 1.0 / (base ** (np.arange(0, d, 2, dtype=np.float64) / d))
    wl = 2 * math.pi / inv
    lo_wl = rp["original_max_position_embeddings"] / rp["low_freq_factor"]
    hi_wl = rp["original_max_position_embeddings"] / rp["high_freq_factor"]
    regime = ["high" if w < hi_wl else "low" if w > lo_wl else "medium" for w in wl]
    for r in ("high", "medium", "low"):
        assert r in regime, (regime, wl)
    got = m.model.rotary_emb.inv_freq.numpy()
    c.note(f"llama3 wavelengths {fmt(wl)} vs high_freq_wavelen {hi_wl:g}, low_freq_wavelen "
           f"{lo_wl:g}: regimes {regime}")
    c.note(f"llama3 inv_freq / default inv_freq = {fmt(got / inv)}")
    c.effect("rope_type llama3 -> default (same theta)", ref,
             c.variant(rope_parameters={"rope_type": "default", "rope_theta": base}))


def check_linear_hd(c, ref):
    m = c.load()
    assert m.config.head_dim * m.config.num_attention_heads != m.config.hidden_size
    c.note(f"inv_freq {fmt(m.model.rotary_emb.inv_freq.numpy())} (default / 2)")
    c.effect("rope linear factor 2 -> default", ref,
             c.variant(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))
    nb = c.load()
    with torch.no_grad():
        for n, p in nb.named_parameters():
            if n.endswith(".bias"):
                p.zero_()
    c.effect("all q/k/v/o and gate/up/down biases zeroed", ref, nb)


def check_dynamic(c, ref):
    m = c.load()
    init_inv = m.model.rotary_emb.inv_freq.clone().numpy()
    lg = forward_logits(m, c.ids)
    assert np.array_equal(lg, ref)
    used = m.model.rotary_emb.inv_freq.numpy()
    d = m.config.head_dim
    L, M, f = len(c.ids), m.config.max_position_embeddings, 2.0
    base = 10000.0 * ((f * L / M) - (f - 1)) ** (d / (d - 2))
    want = 1.0 / (base ** (np.arange(0, d, 2, dtype=np.float64) / d))
    e = float(np.max(np.abs(used - want) / want))
    assert e < 1e-5, e
    c.note(f"dynamic: T={L} > max_position_embeddings {M}: full forward uses base "
           f"10000*({f:g}*{L}/{M}-{f - 1:g})^({d}/{d - 2}) = {base:.6g}, inv_freq {fmt(used)} "
           f"(formula agrees to {e:.1e} rel); before any forward (and for T <= {M}) "
           f"inv_freq {fmt(init_inv)}")
    c.effect("rope dynamic -> default", ref,
             c.variant(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))
    # The full forward is not causal across calls: rows of the T=20 forward differ
    # from a fresh forward over only the first 16 ids (no rescaling there).
    short = forward_logits(c.load(), c.ids[:M])
    e16 = rel_err(short, ref[:M])
    c.note(f"dynamic: rows 0..{M - 1} of the T={L} forward vs a fresh forward of the first "
           f"{M} ids (unscaled): rel diff {e16:.3e}")


def check_yarn(c, ref):
    m = c.load()
    rp = m.config.rope_parameters
    d = m.config.head_dim
    base, factor, omax = rp["rope_theta"], rp["factor"], rp["original_max_position_embeddings"]

    def corr(nrot):
        return d * math.log(omax / (nrot * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(math.floor(corr(32)), 0), min(math.ceil(corr(1)), d - 1)
    ramp = np.clip((np.arange(d // 2) - low) / ((high - low) if high != low else 0.001), 0, 1)
    assert np.any((ramp > 0) & (ramp < 1)), ramp
    af = 0.1 * math.log(factor) + 1.0
    assert abs(m.model.rotary_emb.attention_scaling - af) < 1e-12
    pos = base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    want = (1 / (factor * pos)) * ramp + (1 / pos) * (1 - ramp)
    got = m.model.rotary_emb.inv_freq.numpy()
    e = float(np.max(np.abs(got - want) / want))
    assert e < 1e-6, e
    c.note(f"yarn: low {low} high {high} (from beta_fast 32, beta_slow 1, truncated), ramp "
           f"(weight of the interpolated 1/(factor*pos)) {fmt(ramp)}, attention_factor "
           f"0.1*ln({factor:g})+1 = {af:.7g}, inv_freq {fmt(got)} (formula agrees to {e:.1e})")
    nof = c.variant(rope_parameters=dict(copy.deepcopy(c.kw["rope_parameters"]),
                                         attention_factor=1.0))
    c.effect("yarn attention_factor -> 1.0 (frequencies kept)", ref, nof)
    c.effect("rope yarn -> default", ref,
             c.variant(rope_parameters={"rope_type": "default", "rope_theta": base}))


def check_qwen2_swa(c, ref):
    m = c.load()
    lt = list(m.config.layer_types)
    assert lt == ["full_attention", "sliding_attention", "sliding_attention"], lt
    win = [a.self_attn.sliding_window for a in m.model.layers]
    c.note(f"qwen2 layer_types {lt} (layer i slides iff use_sliding_window and i >= "
           f"max_window_layers {m.config.max_window_layers}); per-layer window {win}")
    w = m.config.sliding_window
    nw = c.variant(use_sliding_window=False)
    assert all(a.self_attn.sliding_window is None for a in nw.model.layers)
    lnw = forward_logits(nw, c.ids)
    d_before = float(np.max(np.abs(lnw[:w] - ref[:w])))
    assert d_before < 1e-5, d_before
    assert np.max(np.abs(lnw[w] - ref[w])) > 1e-4
    c.note(f"sliding window {w}: rows < {w} equal to no-window (max diff {d_before:.1e})")
    c.effect(f"use_sliding_window false (rows >= {w})", ref[w:], lnw[w:])


def _identity_qk_norm(model):
    for layer in model.model.layers:
        layer.self_attn.q_norm = torch.nn.Identity()
        layer.self_attn.k_norm = torch.nn.Identity()
    return model


def check_qwen3(c, ref):
    m = c.load()
    assert m.config.head_dim * m.config.num_attention_heads != m.config.hidden_size
    c.effect("q_norm/k_norm replaced by identity", ref, _identity_qk_norm(c.load()))


def _embed_scale_note(c, m):
    es = m.model.embed_tokens.embed_scale
    c.note(f"embed_scale buffer dtype {es.dtype} value {float(es):.9g} "
           f"(sqrt({m.config.hidden_size}) = {math.sqrt(m.config.hidden_size):.9g})")


def check_gemma2(c, ref):
    m = c.load()
    lt = list(m.config.layer_types)
    assert lt == ["sliding_attention", "full_attention", "sliding_attention"], lt
    c.note(f"gemma2 layer_types {lt}")
    _embed_scale_note(c, m)
    # how far the caps bite: the largest pre-cap final logit
    nf = c.variant(final_logit_softcapping=None)
    raw = forward_logits(nf, c.ids)
    c.note(f"max |final logit| before the cap {np.max(np.abs(raw)):.4f} "
           f"(cap {m.config.final_logit_softcapping})")
    c.effect("final_logit_softcapping -> None", ref, raw)
    c.effect("attn_logit_softcapping -> None", ref, c.variant(attn_logit_softcapping=None))
    c.effect("sliding_window removed (all layers full)", ref,
             c.variant(layer_types=["full_attention"] * 3))
    c.effect(f"query_pre_attn_scalar {m.config.query_pre_attn_scalar} -> head_dim "
             f"{m.config.head_dim}", ref, c.variant(query_pre_attn_scalar=m.config.head_dim))


def check_gemma3(c, ref):
    m = c.load()
    lt = list(m.config.layer_types)
    assert lt == ["sliding_attention", "sliding_attention", "full_attention"], lt
    re = m.model.rotary_emb
    c.note(f"gemma3 layer_types {lt}; rope_parameters {m.config.rope_parameters}")
    c.note(f"sliding inv_freq {fmt(re.sliding_attention_inv_freq.numpy())}, full inv_freq "
           f"{fmt(re.full_attention_inv_freq.numpy())}")
    _embed_scale_note(c, m)
    # the legacy config keys give the same rope parameters
    legacy = dict(copy.deepcopy(c.kw))
    del legacy["rope_parameters"]
    lc = Gemma3TextConfig(**legacy, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                          rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert lc.rope_parameters == m.config.rope_parameters, (lc.rope_parameters,
                                                            m.config.rope_parameters)
    c.note("legacy keys rope_theta 1e6 + rope_local_base_freq 1e4 + rope_scaling "
           "{linear, 2} give the same rope_parameters")
    rp = copy.deepcopy(c.kw["rope_parameters"])
    rp["full_attention"] = {"rope_type": "default", "rope_theta": 1000000.0}
    c.effect("full-layer rope linear factor 2 -> default", ref, c.variant(rope_parameters=rp))
    rp = copy.deepcopy(c.kw["rope_parameters"])
    rp["sliding_attention"]["rope_theta"] = 1000000.0
    c.effect("sliding-layer rope theta 1e4 -> 1e6 (= full)", ref, c.variant(rope_parameters=rp))
    rp = copy.deepcopy(c.kw["rope_parameters"])
    rp["sliding_attention"] = copy.deepcopy(rp["full_attention"])
    c.effect("sliding layers use the full layers' rope (theta 1e6, linear 2)", ref,
             c.variant(rope_parameters=rp))
    c.effect("sliding_window removed (all layers full attention masks, rope kept)", ref,
             c.variant(sliding_window=10**6))
    c.effect("q_norm/k_norm replaced by identity", ref, _identity_qk_norm(c.load()))
    c.effect(f"query_pre_attn_scalar {m.config.query_pre_attn_scalar} -> head_dim "
             f"{m.config.head_dim}", ref, c.variant(query_pre_attn_scalar=m.config.head_dim))


def check_phi3(c, ref, out_dir):
    m = c.load()
    rp = m.config.rope_parameters
    omax = rp["original_max_position_embeddings"]
    assert omax == 16 and m.config.max_position_embeddings == 64, rp
    f = m.config.max_position_embeddings / omax
    af = math.sqrt(1 + math.log(f) / math.log(omax))
    assert abs(m.model.rotary_emb.attention_scaling - af) < 1e-12
    d = m.config.hidden_size // m.config.num_attention_heads
    inv0 = 1.0 / (10000.0 ** (np.arange(0, d, 2, dtype=np.float64) / d))
    short_inv = m.model.rotary_emb.inv_freq.clone().numpy()
    lg = forward_logits(m, c.ids)          # T = 20 > 16: switches to long factors
    assert np.array_equal(lg, ref)
    long_inv = m.model.rotary_emb.inv_freq.clone().numpy()
    e_s = float(np.max(np.abs(short_inv - inv0 / np.array(rp["short_factor"])) / short_inv))
    e_l = float(np.max(np.abs(long_inv - inv0 / np.array(rp["long_factor"])) / long_inv))
    assert e_s < 1e-6 and e_l < 1e-6, (e_s, e_l)
    c.note(f"phi3 longrope: factor = max_position_embeddings/original = {f:g}, "
           f"attention_factor sqrt(1+ln {f:g}/ln {omax}) = {af:.7g} (both regimes)")
    c.note(f"T={len(c.ids)} > {omax}: inv_freq = 1/(long_factor*theta^(2i/d)) {fmt(long_inv)}")
    c.note(f"T <= {omax}: inv_freq = 1/(short_factor*theta^(2i/d)) {fmt(short_inv)}")
    c.effect("longrope -> default rope (no factors, no attention factor)", ref,
             c.variant(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))
    rp1 = copy.deepcopy(c.kw["rope_parameters"])
    rp1["long_factor"] = list(rp1["short_factor"])
    c.effect("long_factor -> short_factor at T=20", ref, c.variant(rope_parameters=rp1))
    rp2 = copy.deepcopy(c.kw["rope_parameters"])
    rp2["attention_factor"] = 1.0
    c.effect("attention_factor -> 1.0 (factors kept)", ref, c.variant(rope_parameters=rp2))

    # T = 12 <= 16: short factors
    sids = c.ids[:N_SHORT]
    ms = c.load()
    short = forward_logits(ms, sids)
    assert np.array_equal(ms.model.rotary_emb.inv_freq.numpy(), short_inv)
    e_vs = rel_err(short, ref[:N_SHORT])
    assert e_vs >= MIN_EFFECT, e_vs
    c.note(f"logits_short.bin (first {N_SHORT} ids, short factors) vs rows 0..{N_SHORT - 1} "
           f"of logits.bin (long factors): rel diff {e_vs:.3e}")
    c.effect(f"T={N_SHORT}: longrope -> default rope", short,
             c.variant(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
             ids=sids)
    inc = incremental_logits(c.load(), sids, N_PREFILL_HF)
    e_inc = rel_err(inc, short)
    assert e_inc < INC_TOL, e_inc
    c.note(f"T={N_SHORT}: HF incremental vs full {e_inc:.2e}")
    write_logits(os.path.join(out_dir, "logits_short.bin"), sids, short)


def check_gpt2(c, ref):
    m = c.load()
    assert m.lm_head.weight.data_ptr() == m.transformer.wte.weight.data_ptr()
    np_ = m.transformer.wpe.weight.shape[0]
    c.note(f"gpt2 wpe {tuple(m.transformer.wpe.weight.shape)}, c_attn.weight "
           f"{tuple(m.transformer.h[0].attn.c_attn.weight.shape)} (in, out), n_inner "
           f"{m.config.n_inner} -> mlp {m.transformer.h[0].mlp.c_fc.weight.shape[1]}")
    assert np_ == 64
    nw = c.load()
    with torch.no_grad():
        nw.transformer.wpe.weight.zero_()
    c.effect("learned positions (wpe) zeroed", ref, nw)
    c.record("activation gelu_new -> exact erf gelu", ref, c.variant(activation_function="gelu"))


CHECKS = {
    "llama3_rope": check_llama3, "llama_linear_hd": check_linear_hd,
    "llama_dynamic": check_dynamic, "llama_yarn": check_yarn, "qwen2_swa": check_qwen2_swa,
    "qwen3": check_qwen3, "gemma2": check_gemma2, "gemma3": check_gemma3, "gpt2": check_gpt2,
}

# HF incremental decoding is expected to differ from the full forward here
# (the rope frequencies depend on the length of the current call).
INC_MAY_DIFFER = {"llama_dynamic", "phi3"}


def make(name, cfg_cls, model_cls, kw, gemma, seed, out_root):
    gen = torch.Generator().manual_seed(seed)
    cfg = cfg_cls(**copy.deepcopy(kw))
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    reinit(model, gen, gemma)
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    ids = torch.randint(0, cfg.vocab_size, (N_TOKENS,), generator=gen).tolist()

    out_dir = os.path.join(out_root, name)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        os.makedirs(out_dir)
        files = sorted(os.listdir(tmp))
        assert "config.json" in files and "model.safetensors" in files, files
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(tmp, f), os.path.join(out_dir, f))

    c = Ctx(name, cfg_cls, model_cls, kw, out_dir, ids)
    ref_model = c.load()
    logits = forward_logits(ref_model, ids)
    assert np.isfinite(logits).all()
    # the model as built and as loaded back agree
    assert rel_err(forward_logits(model, ids), logits) < 1e-6

    inc = incremental_logits(c.load(), ids, N_PREFILL_HF)
    e_inc = rel_err(inc, logits)
    if name not in INC_MAY_DIFFER:
        assert e_inc < INC_TOL, (name, e_inc)
    spread = float(np.mean(np.std(logits, axis=1)))
    head = (f"{name}: {type(cfg).__name__} V={cfg.vocab_size} T={N_TOKENS} logit std "
            f"{spread:.3f}, HF incremental (prefill {N_PREFILL_HF}, then 1 token) vs full "
            f"{e_inc:.2e}")
    if name in INC_MAY_DIFFER:
        rows = [t for t in range(N_TOKENS) if np.max(np.abs(inc[t] - logits[t])) > 1e-5]
        head += f" (expected to differ; rows that differ: {rows})"
    c.notes.append(head)

    if name == "phi3":
        check_phi3(c, logits, out_dir)
    else:
        CHECKS[name](c, logits)

    write_logits(os.path.join(out_dir, "logits.bin"), ids, logits)
    sizes = ", ".join(f"{f} {os.path.getsize(os.path.join(out_dir, f))}"
                      for f in sorted(os.listdir(out_dir)))
    c.note(f"files: {sizes} bytes")
    return "\n".join(c.notes)


def main():
    out_root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT)
    os.makedirs(out_root, exist_ok=True)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    notes = []
    for i, (name, cfg_cls, model_cls, kw, gemma) in enumerate(models()):
        notes.append(make(name, cfg_cls, model_cls, kw, gemma, SEED + i, out_root))
        print(notes[-1])
    import safetensors
    with open(os.path.join(out_root, VERSIONS_NAME), "w") as f:
        f.write("Generated by tests/gen/gen_family_fixtures.py\n")
        f.write(f"python {sys.version.split()[0]}\n")
        f.write(f"torch {torch.__version__}\n")
        f.write(f"transformers {transformers.__version__}\n")
        f.write(f"safetensors {safetensors.__version__}\n")
        f.write(f"numpy {np.__version__}\n")
        f.write(f"seed {SEED} (model i uses seed {SEED}+i), {N_TOKENS} tokens; a feature "
                f"switched off must change the logits by >= {MIN_EFFECT:g} (max rel)\n")
        for n in notes:
            f.write(n + "\n")


if __name__ == "__main__":
    main()
