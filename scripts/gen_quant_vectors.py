#!/usr/bin/env python3
"""Bit-exact test vectors for hotcold's ggml quantisation formats, from gguf-py's `gguf.quants`.

Writes `core/tests/data/quant/gguf_<kind>_<type>.bin` (see README.md there for the layout):
- kind `quant`: deterministic f32 inputs (seeded, with zero, tiny, tie, outlier and extreme blocks),
  `gguf.quants.quantize` of them, and `gguf.quants.dequantize` of those bytes;
- kind `random`: random block bytes whose f16 scale fields are set to sane finite values, and
  `gguf.quants.dequantize` of them (the only gguf-py reference for the K-quants, which it cannot
  quantise).

Usage: python3 -m venv /tmp/qvenv && /tmp/qvenv/bin/pip install gguf numpy
       /tmp/qvenv/bin/python scripts/gen_quant_vectors.py [out_dir]
"""

import os
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

MAGIC = b"HCQV"
VERSION = 1
HAS_INPUT, HAS_QUANT, HAS_DEQUANT = 1, 2, 4

# Types gguf-py quantises (F32/F16 through quants.quantize's special cases).
QUANT_TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
# Types whose dequantisation gguf-py has and hotcold supports, tested on random block bytes.
RANDOM_TYPES = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
                T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]

# Byte offsets of the f16 scale fields inside one block, per type.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}


def write_vector(path, qtype, n, x=None, q=None, y=None):
    flags = (HAS_INPUT if x is not None else 0) | (HAS_QUANT if q is not None else 0) \
        | (HAS_DEQUANT if y is not None else 0)
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<IIII", VERSION, int(qtype), n, flags))
        if x is not None:
            f.write(np.asarray(x, dtype="<f4").tobytes())
        if q is not None:
            f.write(np.asarray(q, dtype=np.uint8).tobytes())
        if y is not None:
            f.write(np.asarray(y, dtype="<f4").tobytes())


def edge_blocks(rng, bs):
    """Blocks of `bs` f32 values covering rounding edge cases, then plain random ones."""
    blocks = []
    blocks.append(np.zeros(bs))                                   # all zero
    blocks.append(rng.standard_normal(bs) * 1e-30)                # tiny (below f16 range)
    blocks.append(rng.standard_normal(bs) * 1e-6)                 # tiny, f16-subnormal scales
    b = rng.standard_normal(bs); b[bs // 3] = 3000.0              # one large outlier
    blocks.append(b)
    b = rng.standard_normal(bs) * 10; b[bs - 1] = -30000.0        # negative extreme
    blocks.append(b)
    # exact ties: with max = -8 (Q4_0 d = 1) or 127 (Q8_0 d = 1), halves land on .5 exactly
    blocks.append(np.resize(np.arange(-16, 16) * 0.5, bs))
    b = np.resize(np.arange(-127, 128, 8) + 0.5, bs); b[0] = 127.0
    blocks.append(b)
    blocks.append(np.full(bs, 0.75))                              # constant (max == min)
    blocks.append(-np.abs(rng.standard_normal(bs)))               # all negative
    blocks.append(np.abs(rng.standard_normal(bs)) + 1.0)          # all positive, min > 0
    b = rng.standard_normal(bs); b[::7] = 0.0                     # sparse (many exact zeros)
    blocks.append(b)
    blocks.append(rng.uniform(-1, 1, bs))
    blocks.append(rng.standard_normal(bs) * 0.02)                 # weight-like
    blocks.append(rng.standard_normal(bs) * 100)
    return np.concatenate(blocks).astype(np.float32)


def float_inputs(rng):
    """F16/BF16 rounding edge cases (no NaN: numpy's NaN conversion differs from ggml's)."""
    special = [0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 65504.0, 65519.0, 65520.0, 65536.0, -65520.0,
               2.0**-24, 2.0**-25, 2.0**-25 * 1.0000001, 3 * 2.0**-25, 2.0**-14, 2.0**-14 * 0.99999,
               1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1e-40, -1e-45,
               3.4028235e38, -3.4028235e38, 1.17549435e-38]
    x = np.concatenate([np.array(special), rng.standard_normal(230) * 10.0**rng.integers(-8, 6, 230)])
    return x.astype(np.float32)


def random_blocks(rng, qtype, nblocks):
    bs, tb = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(nblocks, tb), dtype=np.uint8)
    if qtype in (T.F16, T.BF16):
        raw = raw.reshape(-1, 2)
        # keep them finite: clear one exponent bit where the exponent is all ones
        hi = raw[:, 1]
        if qtype == T.F16:
            hi[(hi & 0x7C) == 0x7C] &= 0xFB
        else:
            e = ((raw[:, 1].astype(np.uint16) & 0x7F) << 1) | (raw[:, 0] >> 7)
            hi[e == 0xFF] &= 0xBF
        return raw.reshape(-1)
    for off in F16_FIELDS[qtype]:
        mag = rng.uniform(-3, 1, nblocks)
        v = (10.0**mag * rng.choice([-1.0, 1.0], nblocks)).astype(np.float16)
        raw[:, off:off + 2] = v.view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(-1)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "core", "tests", "data", "quant")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(20240601)
    for qtype in QUANT_TYPES:
        bs, _ = GGML_QUANT_SIZES[qtype]
        x = float_inputs(rng) if bs == 1 else edge_blocks(rng, bs)
        q = quants.quantize(x, qtype).view(np.uint8).reshape(-1)
        y = quants.dequantize(q.copy(), qtype).astype(np.float32).reshape(-1)
        write_vector(os.path.join(out, f"gguf_quant_{qtype.name.lower()}.bin"), qtype, x.size, x, q, y)
    for qtype in RANDOM_TYPES:
        bs, _ = GGML_QUANT_SIZES[qtype]
        nblocks = 256 if bs == 1 else (16 if bs == 32 else 6)
        q = random_blocks(rng, qtype, nblocks)
        y = quants.dequantize(q.copy(), qtype).astype(np.float32).reshape(-1)
        write_vector(os.path.join(out, f"gguf_random_{qtype.name.lower()}.bin"), qtype, nblocks * bs, None, q, y)


if __name__ == "__main__":
    main()
