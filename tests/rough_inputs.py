"""Inputs for the rough-edge tests (issue 18): tiny models on disk and GGUF files laid out by hand."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from tests.safetensors_files import LLAMA, write_st

# The tiny Llama of tests.safetensors_files.LLAMA as a config.json (hidden 16, 1 layer, vocab 32).
LLAMA_CONFIG = {
    "model_type": "llama",
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 32,
    "tie_word_embeddings": False,
}


def huge_int_json(doc: dict, digits: int = 5000) -> str:
    """``doc`` as JSON with one more key holding an integer literal of ``digits`` digits."""
    return json.dumps(doc)[:-1] + (", " if doc else "") + f'"x": {"9" * digits}' + "}"


def nested_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def sharded_model(folder: Path, n: int = 4, *, index: bool = True) -> list[Path]:
    """The tiny Llama split over ``n`` shards named as transformers names them, with config.json and (when
    ``index``) model.safetensors.index.json; returns the shard paths."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    names = list(LLAMA)
    per = -(-len(names) // n)
    shards, weight_map = [], {}
    for i in range(n):
        part = {t: LLAMA[t] for t in names[i * per : (i + 1) * per]}
        shard = folder / f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        shards.append(write_st(shard, part))
        weight_map |= dict.fromkeys(part, shard.name)
    if index:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return shards


# ---- GGUF by hand (ggml docs/gguf.md): magic, version, counts, key-values, tensor infos, padding, data ----

U32, F32, STRING = 4, 6, 8  # GGUFValueType
GGML_F32 = 0  # GGMLQuantizationType.F32
ALIGN = 32  # GGUF_DEFAULT_ALIGNMENT


def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_bytes(
    kvs: list[tuple[str, int, object]], tensors: list[tuple[str, int]], offsets: list[int] | None = None
) -> bytes:
    """A GGUF v3 file: ``kvs`` as (key, value type, value); ``tensors`` as (name, elements) of F32, laid out
    back to back (padded to 32 bytes) unless ``offsets`` says otherwise; data of zeros."""
    body = b""
    for key, vtype, value in kvs:
        body += _s(key) + struct.pack("<I", vtype)
        if vtype == STRING:
            body += _s(str(value))
        elif vtype == F32:
            body += struct.pack("<f", value)
        else:
            body += struct.pack("<I", value)
    layout, pos = [], 0
    for _name, n in tensors:
        layout.append(pos)
        pos += -(-4 * n // ALIGN) * ALIGN
    for (name, n), off in zip(tensors, offsets or layout, strict=True):
        body += _s(name) + struct.pack("<IQIQ", 1, n, GGML_F32, off)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + body
    return head + b"\0" * (-len(head) % ALIGN) + b"\0" * pos


def llama_gguf_kvs(**over: tuple[int, object]) -> list[tuple[str, int, object]]:
    """A minimal Llama's metadata; ``over`` replaces keys (``block_count=(F32, inf)``)."""
    kv = {
        "general.architecture": (STRING, "llama"),
        "llama.embedding_length": (U32, 16),
        "llama.block_count": (U32, 1),
        "llama.attention.head_count": (U32, 2),
        "llama.feed_forward_length": (U32, 24),
        "llama.vocab_size": (U32, 32),
    }
    kv |= {f"llama.{k}": v for k, v in over.items()}
    return [(k, t, v) for k, (t, v) in kv.items()]


LLAMA_GGUF_TENSORS = [
    ("token_embd.weight", 16 * 32),
    ("blk.0.attn_norm.weight", 16),
    ("output_norm.weight", 16),
]
