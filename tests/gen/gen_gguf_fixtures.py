#!/usr/bin/env python3
"""gen_gguf_fixtures.py - fixtures for tests/test_gguf.c, written with the
`gguf` Python package (llama.cpp's gguf-py; tested with 0.19.0, numpy).

  python3 tests/gen/gen_gguf_fixtures.py [SMOLLM2_GGUF]

Writes (seed 1234, deterministic):
  tests/fixtures/gguf/all_types.gguf   metadata of every value type (arrays of
      strings, nested arrays), alignment 64, tensors of every type the C
      reader dequantises plus one Q5_0 (known, not converted); quantised
      blocks are random bytes with random finite fp16 scales.
  tests/fixtures/gguf/all_types.json   the expected metadata, tensor shapes
      (ggml order, fastest first) and every value that gguf.quants.dequantize
      gives for each tensor, read back with gguf.GGUFReader.
  tests/fixtures/gguf/smollm2.json     (only with SMOLLM2_GGUF, default
      /root/.cache/energon/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf):
      metadata checks and, for three tensors (Q8_0, Q4_1, F32), the first and
      last 128 dequantised values and the float64 sum of all of them.
  tests/fuzz/corpus/gguf/*.gguf        tiny seeds for tests/fuzz/fuzz_gguf.c.
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGUFWriter, GGUFReader, GGUFValueType as VT, GGMLQuantizationType as QT
from gguf.quants import dequantize

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FIX = os.path.join(ROOT, "tests", "fixtures", "gguf")
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus", "gguf")
SMOLLM2 = "/root/.cache/energon/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# (key, value type, value, array element type or None)
METADATA = [
    ("test.u8", VT.UINT8, 200, None),
    ("test.i8", VT.INT8, -100, None),
    ("test.u16", VT.UINT16, 60000, None),
    ("test.i16", VT.INT16, -30000, None),
    ("test.u32", VT.UINT32, 4000000000, None),
    ("test.i32", VT.INT32, -2000000000, None),
    ("test.f32", VT.FLOAT32, 0.15625, None),
    ("test.bool_t", VT.BOOL, True, None),
    ("test.bool_f", VT.BOOL, False, None),
    ("test.str", VT.STRING, "h\u00e9llo \u2603 world", None),
    ("test.str_empty", VT.STRING, "", None),
    ("test.u64", VT.UINT64, 2**63 + 5, None),
    ("test.i64", VT.INT64, -(2**62) - 3, None),
    ("test.f64", VT.FLOAT64, -1.0 / 3.0, None),
    ("test.arr_i16", VT.ARRAY, [1, -2, 30000, -30000], VT.INT16),
    ("test.arr_u8", VT.ARRAY, [0, 1, 255], VT.UINT8),
    ("test.arr_f32", VT.ARRAY, [0.5, -1.25, 3.0], VT.FLOAT32),
    ("test.arr_f64", VT.ARRAY, [1e300, -2.5], VT.FLOAT64),
    ("test.arr_bool", VT.ARRAY, [True, False, True], VT.BOOL),
    ("test.arr_str", VT.ARRAY, ["a", "", "\u00fcber", "<|im_end|>"], VT.STRING),
    ("test.arr_u64", VT.ARRAY, [0, 2**64 - 1], VT.UINT64),
    ("test.arr_i64", VT.ARRAY, [-(2**63), 2**63 - 1], VT.INT64),
    ("test.arr_nested", VT.ARRAY, [[1, 2, 3], [4], [5, 6]], VT.ARRAY),
    ("test.arr_nested_str", VT.ARRAY, [["x", "yy"], ["zzz"]], VT.ARRAY),
]

# (name, type, numpy shape slowest first)
TENSORS = [
    ("t.f32", QT.F32, (2, 4, 64)),
    ("t.f16", QT.F16, (2, 256)),
    ("t.bf16", QT.BF16, (2, 256)),
    ("t.q8_0", QT.Q8_0, (2, 256)),
    ("t.q4_0", QT.Q4_0, (2, 256)),
    ("t.q4_1", QT.Q4_1, (2, 256)),
    ("t.q4_k", QT.Q4_K, (2, 256)),
    ("t.q5_k", QT.Q5_K, (2, 256)),
    ("t.q6_k", QT.Q6_K, (2, 256)),
    ("t.q5_0_unsupported", QT.Q5_0, (1, 32)),
]

# byte offsets of the fp16 scale fields inside one block, per type
FP16_FIELDS = {QT.Q8_0: [0], QT.Q4_0: [0], QT.Q4_1: [0, 2], QT.Q5_0: [0],
               QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208]}


def tensor_bytes(rng, qtype, shape):
    """Random data of a tensor: floats for F32/F16, bytes for the rest."""
    if qtype == QT.F32:
        return rng.standard_normal(shape).astype(np.float32)
    if qtype == QT.F16:
        return rng.standard_normal(shape).astype(np.float16)
    if qtype == QT.BF16:
        f = rng.standard_normal(shape).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(shape[:-1] + (-1,))
    blk, size = gguf.GGML_QUANT_SIZES[qtype]
    nblocks = int(np.prod(shape)) // blk
    raw = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint8)
    for off in FP16_FIELDS[qtype]:  # finite scales in [-1, 1]
        d = rng.uniform(-1, 1, size=nblocks).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(shape[:-1] + (shape[-1] // blk * size,))


def jsonable(vt, v, sub):
    if vt == VT.ARRAY:
        if sub == VT.ARRAY:
            et = VT.STRING if isinstance(v[0][0], str) else VT.INT32
            return {"elem_type": int(VT.ARRAY), "values": [jsonable(VT.ARRAY, x, et) for x in v]}
        return {"elem_type": int(sub), "values": [jsonable(sub, x, None) for x in v]}
    if vt in (VT.UINT64, VT.INT64):
        return str(v)  # beyond a JSON double
    if vt == VT.BOOL:
        return bool(v)
    return v


def write_all_types(path, rng, metadata, tensors, alignment=64):
    w = GGUFWriter(path, arch="test")
    w.add_custom_alignment(alignment)
    for key, vt, v, sub in metadata:
        w.add_key_value(key, v, vt, sub_type=sub if sub != VT.ARRAY else None)
    for name, qt, shape in tensors:
        data = tensor_bytes(rng, qt, shape)
        w.add_tensor(name, data, raw_dtype=None if qt in (QT.F32, QT.F16) else qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def f32_list(a):
    return [float(x) for x in np.asarray(a, dtype=np.float32).reshape(-1)]


def gen_all_types(rng):
    path = os.path.join(FIX, "all_types.gguf")
    write_all_types(path, rng, METADATA, TENSORS)
    r = GGUFReader(path)
    out = {"generator": "tests/gen/gen_gguf_fixtures.py", "gguf_py": "0.19.0", "seed": 1234,
           "version": 3, "alignment": 64, "metadata": [], "tensors": []}
    # GGUFReader adds GGUF.version / tensor_count / kv_count pseudo-fields
    out["n_kv"] = len([k for k in r.fields if not k.startswith("GGUF.")])
    out["metadata"].append({"key": "general.architecture", "type": int(VT.STRING), "value": "test"})
    out["metadata"].append({"key": "general.alignment", "type": int(VT.UINT32), "value": 64})
    for key, vt, v, sub in METADATA:
        out["metadata"].append({"key": key, "type": int(vt), "value": jsonable(vt, v, sub)})
    for t in r.tensors:
        vals = dequantize(t.data, t.tensor_type)
        out["tensors"].append({"name": t.name, "type": int(t.tensor_type),
                               "dims": [int(d) for d in t.shape], "offset": int(t.data_offset - r.data_offset),
                               "values": f32_list(vals)})
    with open(os.path.join(FIX, "all_types.json"), "w") as f:
        json.dump(out, f, indent=0)


def gen_smollm2(path):
    r = GGUFReader(path)
    out = {"file": os.path.basename(path), "n_tensors": len(r.tensors), "tensors": []}
    f = r.fields
    out["general.architecture"] = bytes(f["general.architecture"].parts[-1]).decode()
    out["tokenizer.ggml.tokens"] = len(f["tokenizer.ggml.tokens"].data)
    out["tokenizer.ggml.merges"] = len(f["tokenizer.ggml.merges"].data)
    toks = f["tokenizer.ggml.tokens"]
    out["tokens_first"] = [bytes(toks.parts[i]).decode() for i in toks.data[:3]]
    out["tokens_last"] = bytes(toks.parts[toks.data[-1]]).decode()
    by_type = {}
    for t in r.tensors:
        by_type.setdefault(t.tensor_type, t)
    for qt in (QT.Q8_0, QT.Q4_1, QT.F32):
        t = by_type[qt]
        v = dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float32)
        out["tensors"].append({"name": t.name, "type": int(qt), "dims": [int(d) for d in t.shape],
                               "first": f32_list(v[:128]), "last": f32_list(v[-128:]),
                               "sum": float(v.astype(np.float64).sum())})
    with open(os.path.join(FIX, "smollm2.json"), "w") as fo:
        json.dump(out, fo, indent=0)


def gen_corpus(rng):
    os.makedirs(CORPUS, exist_ok=True)
    write_all_types(os.path.join(CORPUS, "meta.gguf"), rng, METADATA, [("t", QT.F32, (2, 3))], 32)
    small = [(n, q, (1, 256) if q not in (QT.F32, QT.F16, QT.BF16) else (1, 8))
             for n, q, _ in TENSORS]
    write_all_types(os.path.join(CORPUS, "tensors.gguf"), rng, METADATA[:2], small, 32)


def main():
    rng = np.random.default_rng(1234)
    os.makedirs(FIX, exist_ok=True)
    gen_all_types(rng)
    gen_corpus(rng)
    sm = sys.argv[1] if len(sys.argv) > 1 else SMOLLM2
    if os.path.exists(sm):
        gen_smollm2(sm)
    else:
        print(f"{sm} not found: smollm2.json not written", file=sys.stderr)


if __name__ == "__main__":
    main()
