#!/usr/bin/env python3
"""gen_gguf_model_fixtures.py - GGUF model files and their reference logits,
for tests/test_gguf_model.c (en_model_load on a .gguf file).

  python3 tests/gen/gen_gguf_model_fixtures.py

Needs the `gguf` package (llama.cpp's gguf-py; 0.19.0 used), torch,
transformers, safetensors, numpy. Deterministic: the tiny synthetic model uses
seed 4321, the damaged files' random bytes seed 1234; the other weights are
those of tests/fixtures/hf/ (tests/gen/gen_hf_fixtures.py,
gen_family_fixtures.py). Everything goes to tests/fixtures/gguf/.

How the files are written (as llama.cpp's convert_hf_to_gguf.py does):
  metadata  general.architecture, general.name, general.file_type and
            <arch>.context_length, embedding_length, feed_forward_length,
            block_count, attention.head_count, attention.head_count_kv,
            rope.freq_base, attention.layer_norm_rms_epsilon;
            attention.key_length / value_length only where head_dim differs
            from hidden_size / num_attention_heads (qwen3 here); llama also
            <arch>.vocab_size and rope.dimension_count (= head_dim).
  tensors   token_embd, blk.N.attn_q/k/v/output (+ .bias), attn_q_norm,
            attn_k_norm, attn_norm, ffn_norm, ffn_gate/up/down, output_norm,
            output (absent when the embeddings are tied), in the
            safetensors' (sorted) name order, so output_norm.weight is last.
            llama's q and k rows are permuted like LlamaModel.permute:
            w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2)
            with n_head = num_key_value_heads for k; qwen2/qwen3 are not.
  Q8_0      every 2-D tensor whose rows (GGUF dim 0) are a multiple of 32 is
            gguf.quants.quantize'd (after the permutation, as llama.cpp
            does); other 2-D tensors, norms and biases stay F32. Which ones
            stayed F32 is written to MODELS.txt.

Good files (each with <file>.logits.bin, the logits.bin format of
tests/test_model_logits.c: "ENFX", u32 version 1, u32 T, u32 V, int32 ids[T],
float32 logits[T*V]):
  llama_gqa_tied_f32.gguf   hf/llama_gqa_tied: llama, 6 heads / 2 kv heads,
                            tied (no output.weight), permuted q/k; also
                            tokenizer.ggml.bos_token_id 1 / eos_token_id 2
                            (the only tokenizer metadata, no vocabulary)
  qwen2_f32.gguf            hf/qwen2: q/k/v biases
  qwen3_f32.gguf            hf/qwen3: q/k norms, head_dim 16 != 48 / 4
  llama_bf16_q8_0.gguf      hf/llama_bf16 (hidden 64): Q8_0 but ffn_down
                            (rows of 100) and the norms; permuted q/k
  qwen2_swa_q8_0.gguf       hf/qwen2_swa (hidden 32) written as a plain qwen2
                            (a qwen2 GGUF has no sliding-window key; the
                            reference has no window either): Q8_0 but
                            ffn_down (rows of 60), norms and biases
  tiny_llama_q8_0.gguf      a synthetic llama (V 64, C 32, F 64, 4 / 2
                            heads, 2 layers, tied), all matrices Q8_0; the
                            base of the damaged files below
Q8_0 files also get <file>.f32.logits.bin: the same ids through the same
model with the weights before quantisation, so that a test can check that its
logits are NOT those (quantisation really applied). hidden_size 48 (the
llama_gqa_tied / qwen2 / qwen3 fixtures) leaves no 2-D tensor of those with
rows a multiple of 32 except qwen3's o_proj, so their Q8_0 variants would be
(nearly) their f32 files again and are not written; the two 32/64-wide
fixtures above stand in for them.

The ids are those of the source model's logits.bin (tiny: 20 random ids,
seed 4321). The reference reads the weights BACK from the written file with
gguf.GGUFReader + gguf.quants.dequantize, undoes the q/k permutation with its
inverse (w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2)),
loads them into the transformers model of the source config.json and runs it
in float32 with eager attention: it does not depend on our C code. For the
f32 files it is checked to equal the source's own logits.bin (< 1e-5).

Damaged files (all from tiny_llama_q8_0's content; what the loader must say):
  bad_quant.gguf       blk.0.attn_v.weight stored as IQ4_NL (random bytes of
                       the right size; a type we cannot dequantise)
  bad_arch.gguf        general.architecture "falcon" (falcon.* keys)
  missing_tensor.gguf  no blk.1.ffn_down.weight
  bad_shape.gguf       blk.0.ffn_gate.weight of 63 rows instead of 64
                       (GGUF dims [32, 63])
  truncated.gguf       tiny_llama_q8_0.gguf without its last 1000 bytes
  bad_offset.gguf      tiny_llama_q8_0.gguf with the data offset of its last
                       tensor (output_norm.weight) patched in the tensor-info
                       table to an aligned offset 4096 bytes past the end
"""
import os
import struct
import sys

import numpy as np
import torch
import transformers
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
HF = os.path.join(ROOT, "tests", "fixtures", "hf")
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf")
MAGIC, VERSION = b"ENFX", 1
ALIGN = 32  # GGUF's default

# Hugging Face per-layer name -> GGUF name
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def gguf_name(hf):
    if hf in TOP_NAMES:
        return TOP_NAMES[hf]
    parts = hf.split(".", 3)  # model, layers, N, rest
    assert parts[0] == "model" and parts[1] == "layers", hf
    return f"blk.{int(parts[2])}.{LAYER_NAMES[parts[3]]}"


def hf_name(g):
    for k, v in TOP_NAMES.items():
        if v == g:
            return k
    _, n, rest = g.split(".", 2)
    inv = {v: k for k, v in LAYER_NAMES.items()}
    return f"model.layers.{int(n)}.{inv[rest]}"


def permute(w, n_head):
    """llama.cpp's LlamaModel.permute (convert_hf_to_gguf.py)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute(w, n_head):
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_logits(path, ids, logits):
    t, v = logits.shape
    assert t == len(ids)
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<III", VERSION, t, v))
        f.write(np.asarray(ids, dtype="<i4").tobytes())
        f.write(np.ascontiguousarray(logits, dtype="<f4").tobytes())


def read_logits(path):
    b = open(path, "rb").read()
    assert b[:4] == MAGIC
    _, t, v = struct.unpack("<III", b[4:16])
    ids = np.frombuffer(b, dtype="<i4", count=t, offset=16).tolist()
    lg = np.frombuffer(b, dtype="<f4", count=t * v, offset=16 + 4 * t).reshape(t, v)
    return ids, lg


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def hf_config(src, cfg_over):
    if isinstance(src, LlamaConfig):
        cfg = src
    else:
        cfg = AutoConfig.from_pretrained(os.path.join(HF, src))
    for k, v in cfg_over.items():
        setattr(cfg, k, v)
    cfg._attn_implementation = "eager"
    cfg.dtype = torch.float32
    return cfg


def head_dim(cfg):
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def write_model(path, arch, cfg, weights, qtype, extra=None, drop=(), replace=None,
                arch_name=None):
    """weights: HF name -> float32 numpy array (HF orientation), in order.
    Returns the names of the 2-D tensors kept F32 in a Q8_0 file.
    drop: GGUF names to leave out; replace: GGUF name -> (raw array,
    raw_dtype) written instead of the real tensor."""
    arch_name = arch_name or arch
    w = GGUFWriter(path, arch_name)
    w.add_name(os.path.basename(path)[:-5])
    w.add_file_type(7 if qtype == QT.Q8_0 else 0)  # MOSTLY_Q8_0 / ALL_F32
    D = head_dim(cfg)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    if D != cfg.hidden_size // cfg.num_attention_heads:
        w.add_key_length(D)
        w.add_value_length(D)
    theta = cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None) \
        else cfg.rope_theta
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    if arch == "llama":
        w.add_vocab_size(cfg.vocab_size)
        w.add_rope_dimension_count(D)
    for k, v in (extra or {}).items():
        w.add_uint32(k, v)
    kept = []
    for name, t in weights.items():
        g = gguf_name(name)
        if g in drop:
            continue
        if replace and g in replace:
            raw, rt = replace[g]
            w.add_tensor(g, raw, raw_dtype=rt)
            continue
        t = np.ascontiguousarray(t, dtype=np.float32)
        if arch == "llama" and g.endswith(("attn_q.weight", "attn_q.bias")):
            t = permute(t, cfg.num_attention_heads)
        if arch == "llama" and g.endswith(("attn_k.weight", "attn_k.bias")):
            t = permute(t, cfg.num_key_value_heads)
        if qtype == QT.Q8_0 and t.ndim == 2:
            if t.shape[-1] % 32 == 0:
                w.add_tensor(g, quantize(t, QT.Q8_0), raw_dtype=QT.Q8_0)
                continue
            kept.append(f"{g} (rows of {t.shape[-1]})")
        w.add_tensor(g, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return kept


def read_back(path, arch, cfg):
    """HF name -> float32 torch tensor, from the file (dequantised,
    un-permuted)."""
    r = GGUFReader(path)
    sd = {}
    for t in r.tensors:
        a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        a = a.reshape([int(d) for d in reversed(list(t.shape))])
        if arch == "llama" and t.name.endswith(("attn_q.weight", "attn_q.bias")):
            a = unpermute(a, cfg.num_attention_heads)
        if arch == "llama" and t.name.endswith(("attn_k.weight", "attn_k.bias")):
            a = unpermute(a, cfg.num_key_value_heads)
        sd[hf_name(t.name)] = torch.from_numpy(a.copy())
    return sd


def run(cfg, sd, ids):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    assert model.config._attn_implementation == "eager"
    sd = dict(sd)
    if cfg.tie_word_embeddings:
        assert "lm_head.weight" not in sd
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert not missing, missing
    if cfg.tie_word_embeddings:
        assert torch.equal(model.lm_head.weight, sd["model.embed_tokens.weight"])
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    lg = out.logits[0].float().numpy()
    assert np.isfinite(lg).all()
    return lg


def hf_weights(src):
    sd = load_file(os.path.join(HF, src, "model.safetensors"))
    return {k: sd[k].float().numpy() for k in sorted(sd)}


def tiny_model():
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                      num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                      max_position_embeddings=128, tie_word_embeddings=True,
                      rope_theta=10000.0, rms_norm_eps=1e-5, hidden_act="silu",
                      attn_implementation="eager")
    gen = torch.Generator().manual_seed(4321)
    torch.manual_seed(4321)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # as gen_hf_fixtures.reinit
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.1
            if name.endswith("norm.weight"):
                r += 1.0
            p.copy_(r)
    ids = torch.randint(0, cfg.vocab_size, (20,), generator=gen).tolist()
    sd = {k: v.detach().clone().numpy() for k, v in model.state_dict().items()
          if k != "lm_head.weight"}
    return cfg, {k: sd[k] for k in sorted(sd)}, ids


# (file, source dir or None for the tiny model, arch, qtype, config overrides,
# extra uint32 keys)
GOOD = [
    ("llama_gqa_tied_f32", "llama_gqa_tied", "llama", QT.F32, {},
     {"tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}),
    ("qwen2_f32", "qwen2", "qwen2", QT.F32, {}, None),
    ("qwen3_f32", "qwen3", "qwen3", QT.F32, {}, None),
    ("llama_bf16_q8_0", "llama_bf16", "llama", QT.Q8_0, {}, None),
    ("qwen2_swa_q8_0", "qwen2_swa", "qwen2", QT.Q8_0,
     {"use_sliding_window": False, "sliding_window": None,
      "layer_types": ["full_attention"] * 3}, None),
    ("tiny_llama_q8_0", None, "llama", QT.Q8_0, {}, None),
]


def make_good(notes):
    tiny = None
    for fname, src, arch, qt, over, extra in GOOD:
        path = os.path.join(OUT, fname + ".gguf")
        if src is None:
            cfg, weights, ids = tiny_model()
            tiny = (cfg, weights)
            src_logits = None
        else:
            cfg = hf_config(src, over)
            weights = hf_weights(src)
            ids, src_logits = read_logits(os.path.join(HF, src, "logits.bin"))
        assert cfg.model_type == arch, (cfg.model_type, arch)
        kept = write_model(path, arch, cfg, weights, qt, extra=extra)
        ref = run(cfg, read_back(path, arch, cfg), ids)
        write_logits(path + ".logits.bin", ids, ref)
        note = f"{fname}.gguf: {os.path.getsize(path)} bytes, T={len(ids)} V={ref.shape[1]}"
        if qt == QT.F32:
            e = rel_err(ref, src_logits)
            assert e < 1e-5, (fname, e)
            note += f"; reference vs {src}/logits.bin {e:.1e}"
        else:
            unq = run(cfg, {k: torch.from_numpy(v.copy()) for k, v in weights.items()}, ids)
            if src_logits is not None and not over:
                assert rel_err(unq, src_logits) < 1e-5
            write_logits(path + ".f32.logits.bin", ids, unq)
            d = rel_err(ref, unq)
            assert d > 1e-3, (fname, d)  # well above the test's 1e-4 tolerance
            note += f"; Q8_0 vs unquantised logits differ by {d:.2e} (max rel)"
            note += "; kept F32: " + (", ".join(kept) if kept else "none (2-D)")
        notes.append(note)
        print(note)
    return tiny


def tensor_info_offset_pos(r, t):
    """File position of tensor t's u64 data offset in the tensor-info table."""
    f = t.field
    pos = f.offset
    (nlen,) = struct.unpack_from("<Q", r.data, pos)
    pos += 8 + nlen
    (nd,) = struct.unpack_from("<I", r.data, pos)
    pos += 4 + 8 * nd + 4
    return pos


def make_bad(tiny, notes):
    cfg, weights = tiny
    rng = np.random.default_rng(1234)
    base = os.path.join(OUT, "tiny_llama_q8_0.gguf")

    # (a) an IQ4_NL tensor (block 32, 18 bytes: fp16 scale + 16 nibble bytes)
    rows = cfg.num_key_value_heads * head_dim(cfg)
    raw = rng.integers(0, 256, size=(rows, cfg.hidden_size // 32 * 18), dtype=np.uint8)
    raw[:, 0:2] = np.full((rows, 1), 0.01, dtype=np.float16).view(np.uint8)
    write_model(os.path.join(OUT, "bad_quant.gguf"), "llama", cfg, weights, QT.Q8_0,
                replace={"blk.0.attn_v.weight": (raw, QT.IQ4_NL)})
    # (b) architecture falcon
    write_model(os.path.join(OUT, "bad_arch.gguf"), "llama", cfg, weights, QT.Q8_0,
                arch_name="falcon")
    # (c) a tensor left out
    write_model(os.path.join(OUT, "missing_tensor.gguf"), "llama", cfg, weights, QT.Q8_0,
                drop=("blk.1.ffn_down.weight",))
    # (d) 63 rows instead of 64
    g = np.ascontiguousarray(weights["model.layers.0.mlp.gate_proj.weight"][:63])
    write_model(os.path.join(OUT, "bad_shape.gguf"), "llama", cfg, weights, QT.Q8_0,
                replace={"blk.0.ffn_gate.weight": (quantize(g, QT.Q8_0), QT.Q8_0)})
    # (e) truncated; the last tensor's offset past the end
    data = open(base, "rb").read()
    with open(os.path.join(OUT, "truncated.gguf"), "wb") as f:
        f.write(data[:-1000])
    r = GGUFReader(base)
    last = r.tensors[-1]
    assert last.name == "output_norm.weight", last.name
    pos = tensor_info_offset_pos(r, last)
    (old,) = struct.unpack_from("<Q", data, pos)
    assert old == last.data_offset - r.data_offset, (old, last.data_offset, r.data_offset)
    room = len(data) - r.data_offset
    new = (room + 4096 + ALIGN - 1) // ALIGN * ALIGN
    patched = bytearray(data)
    struct.pack_into("<Q", patched, pos, new)
    with open(os.path.join(OUT, "bad_offset.gguf"), "wb") as f:
        f.write(bytes(patched))
    # the package's own reader must see the damage too
    for bad in ("bad_quant", "bad_arch", "missing_tensor", "bad_shape"):
        GGUFReader(os.path.join(OUT, bad + ".gguf"))
    for bad in ("truncated", "bad_offset"):
        try:
            GGUFReader(os.path.join(OUT, bad + ".gguf"))
            ok = True
        except Exception:
            ok = False
        notes.append(f"{bad}.gguf: gguf.GGUFReader {'reads it (!)' if ok else 'refuses it'}")
    notes.append(f"bad_offset.gguf: output_norm.weight offset {old} -> {new} "
                 f"(data section {room} bytes), info at file byte {pos}")
    for bad in ("bad_quant", "bad_arch", "missing_tensor", "bad_shape", "truncated",
                "bad_offset"):
        notes.append(f"{bad}.gguf: {os.path.getsize(os.path.join(OUT, bad + '.gguf'))} bytes")


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    # self-check of the permutation pair
    x = np.arange(6 * 8 * 5, dtype=np.float32).reshape(48, 5)
    assert np.array_equal(unpermute(permute(x, 6), 6), x)
    assert not np.array_equal(permute(x, 6), x)
    notes = []
    tiny = make_good(notes)
    make_bad(tiny, notes)
    import gguf
    with open(os.path.join(OUT, "MODELS.txt"), "w") as f:
        f.write("Generated by tests/gen/gen_gguf_model_fixtures.py\n")
        f.write(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
                f"transformers {transformers.__version__}, numpy {np.__version__}, "
                f"gguf {getattr(gguf, '__version__', '0.19.0')}\n")
        for n in notes:
            f.write(n + "\n")
    for n in notes[len(GOOD):]:
        print(n)


if __name__ == "__main__":
    main()
