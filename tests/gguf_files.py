"""Tiny GGUF files for the reader's tests, written with gguf.GGUFWriter (tests/test_gguf_*.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType

# Bytes per block and elements per block, written out from ggml's block structs
# (ggml/src/ggml-common.h): block_q8_0 = fp16 scale + 32 int8 (34 B / 32), block_q4_K = two fp16 +
# 12 bytes of 6-bit scales + 128 bytes of nibbles (144 B / 256).
BLOCK = {Q.F32: (1, 4), Q.F16: (1, 2), Q.Q8_0: (32, 34), Q.Q4_K: (256, 144)}


def nbytes(qtype: gguf.GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    block, size = BLOCK[qtype]
    n = 1
    for d in shape:
        n *= d
    assert shape[-1] % block == 0
    return n // block * size


Tensors = dict[str, tuple[tuple[int, ...], gguf.GGMLQuantizationType]]


def write_gguf(
    path: Path, arch: str, meta: Callable[[gguf.GGUFWriter], None], tensors: Tensors, n_tokens: int = 0
) -> Path:
    """A GGUF file with ``tensors`` (name -> row-major shape, type) filled with zero bytes."""
    w = gguf.GGUFWriter(path, arch)
    meta(w)
    if n_tokens:
        w.add_token_list([f"t{i}" for i in range(n_tokens)])
    for name, (shape, qtype) in tensors.items():
        if qtype == Q.F32:
            w.add_tensor(name, np.zeros(shape, np.float32))
        elif qtype == Q.F16:
            w.add_tensor(name, np.zeros(shape, np.float16))
        else:
            block, size = BLOCK[qtype]
            raw = np.zeros((*shape[:-1], shape[-1] // block * size), np.uint8)
            w.add_tensor(name, raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
