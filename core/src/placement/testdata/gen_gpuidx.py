#!/usr/bin/env python3
"""Writes powerinfer.gpuidx with PowerInfer's own gguf-py, the way its
powerinfer-py/powerinfer/export_split.py does (append_gpu_idx + export_split), for
GpuIndex's byte-for-byte test.

export_split.py picks each layer's hot set with torch.topk over activation counts; torch is not
needed for the file layout, so the hot sets are given here directly (numpy only).

Usage (PowerInfer checkout at commit d3ebd7c5666348cf43c22f0d62dfbc9a763cffb8, numpy installed):
    python3 gen_gpuidx.py /path/to/PowerInfer powerinfer.gpuidx
"""
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(sys.argv[1]) / "gguf-py"))
import gguf  # noqa: E402  (PowerInfer's gguf-py)
import numpy as np  # noqa: E402
from gguf.constants import GGMLQuantizationType  # noqa: E402

N_NEURONS = [8, 8, 4]
HOT = [[1, 3, 4], [], [0, 1, 2, 3]]
VRAM_CAPACITY = 123456789


def append_gpu_idx(out, i_layer, n, hot):
    # export_split.py: gpu_idx = zeros_like(activation); gpu_idx[indices] = 1; int32
    gpu_idx = np.zeros(n, dtype=np.int32)
    gpu_idx[hot] = 1
    out.add_tensor(name=f"blk.{i_layer}.gpu_idx", tensor=gpu_idx,
                   raw_shape=gpu_idx.shape[::-1], raw_dtype=GGMLQuantizationType.I32)
    # export_split.py: gpu_bucket = np.sort(indices.astype(int32))
    gpu_bucket = np.sort(np.array(hot, dtype=np.int32))
    out.add_tensor(name=f"blk.{i_layer}.gpu_bucket", tensor=gpu_bucket,
                   raw_shape=gpu_bucket.shape[::-1], raw_dtype=GGMLQuantizationType.I32)


def main():
    output_path = sys.argv[2]
    out = gguf.GGUFWriter(output_path, "generic.gpu_index")
    for i, (n, hot) in enumerate(zip(N_NEURONS, HOT)):
        append_gpu_idx(out, i, n, hot)
    out.add_block_count(len(HOT))
    out.add_uint64(gguf.Keys.Split.VRAM_CAPACITY, VRAM_CAPACITY)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    # export_split.py's post-processing: PowerInfer's magic and version 3
    with open(output_path, "r+b") as f:
        f.write(struct.pack("<I", int.from_bytes(b"PWRI", "little")))
        f.write(struct.pack("<I", 3))


main()
