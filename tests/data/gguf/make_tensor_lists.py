#!/usr/bin/env python3
"""Writes what the `gguf` PyPI package reports for each tensor of a GGUF file, one line per tensor:
name, ggml type name, shape (ggml order, 'x'-separated), byte size, absolute data offset.

    python3 -m venv /tmp/v && /tmp/v/bin/pip install gguf numpy
    /tmp/v/bin/python tests/data/gguf/make_tensor_lists.py ~/.cache/hotcold/gemma-3-270m-q4_k_m.gguf > tests/data/gguf/gemma-3-270m-q4_k_m.tensors.tsv
    /tmp/v/bin/python tests/data/gguf/make_tensor_lists.py ~/.cache/hotcold/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf > tests/data/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.tensors.tsv
"""
import sys

import gguf

reader = gguf.GGUFReader(sys.argv[1])
for t in reader.tensors:
    shape = "x".join(str(int(d)) for d in t.shape)
    print(f"{t.name}\t{t.tensor_type.name}\t{shape}\t{int(t.n_bytes)}\t{int(t.data_offset)}")
