"""Fuzz: safetensors and GGUF files through ``load_model`` (alone, and beside a config.json).

Every generated file is a model or one GpumemInputError (tests/fuzz_strategies.py states the property).
safetensors: the headers of tests/safetensors_files.py mutated as documents (tensor names with 5,000-digit
layer numbers, unknown dtypes, extreme shapes and offsets) and as bytes (the length prefix, flipped bytes,
cut short). GGUF: a tiny Llama written by ``gguf.GGUFWriter`` with its metadata retyped and revalued (an
integer key stored as FLOAT32 +inf, counts over 2^32), tensors renamed and reshaped, then bytes flipped.
"""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from hypothesis import assume, example, given
from hypothesis import strategies as st

from gpumem_gui.core import load_model
from tests.fuzz_strategies import (
    EXTREME_INTS,
    accepted_or_refused,
    documents,
    dumps,
    fuzz_settings,
    json_values,
    long_values,
    mutated,
    passing_over_known_bugs,
    values_in,
)
from tests.safetensors_files import AWQ, BNB4, FP8, GPTQ, LLAMA, header_json

LONG_LAYER = "9" * 5000  # the tensor name with a 5,000-digit layer number
# a llama config matching tests/safetensors_files.LLAMA (vocab 32, hidden 16, 4 heads of 4, 2 KV heads)
TINY_CONFIG = {
    "model_type": "llama",
    "vocab_size": 32,
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}

# ---- safetensors ---------------------------------------------------------------------------------------

ST_DTYPES = ["F32", "F16", "BF16", "I32", "I8", "U8", "F8_E4M3", "F64", "I64", "F4", "BOOL", "bogus", ""]
ST_NAMES = [
    f"model.layers.{LONG_LAYER}.self_attn.q_proj.weight",
    "model.layers.4097.mlp.up_proj.weight",
    "model.layers.-1.mlp.up_proj.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "lm_head.weight",
    "__metadata__",
    "",
    "x" * 300,
]
_dims = st.sampled_from(EXTREME_INTS) | st.integers(0, 64)
_tensor_entry = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(ST_DTYPES),
        "shape": st.lists(_dims, max_size=4),
        "data_offsets": st.lists(_dims, min_size=2, max_size=2) | st.lists(_dims, max_size=3),
    }
)
BASES = [header_json(spec)[0] for spec in (LLAMA, GPTQ, AWQ, BNB4, FP8)]


@st.composite
def safetensors_bytes(draw: st.DrawFn) -> bytes:
    header = draw(mutated(BASES, keys=ST_NAMES, values=_tensor_entry | json_values(), max_changes=3))
    text = dumps(header).encode()
    text += b" " * (-len(text) % 8)
    offsets = [e.get("data_offsets") for e in header.values() if isinstance(e, dict)]
    ends = [o[-1] for o in offsets if isinstance(o, list) and o]
    declared = max([e for e in ends if isinstance(e, int)] or [0])
    data = min(max(declared, 0), 1 << 16)  # the file holds at most 64 KiB of data
    size = draw(st.sampled_from([data, data, 0, data // 2, data + 8]))
    prefix = draw(st.sampled_from([len(text)] * 6 + [0, 7, len(text) + 100, 2**63, 2**64 - 1, 100_000_001]))
    blob = bytearray(struct.pack("<Q", prefix) + text + b"\0" * size)
    for _ in range(draw(st.integers(0, 2))):  # a few flipped bytes in the header
        pos = draw(st.integers(0, min(len(blob), 4096) - 1))
        blob[pos] = draw(st.integers(0, 255))
    if draw(st.integers(0, 5)) == 0:
        blob = blob[: draw(st.integers(0, len(blob)))]
    return bytes(blob)


def _st_file(header: dict[str, Any], data: int) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + b"\0" * data


_LONG_NAME = {
    f"model.layers.{LONG_LAYER}.self_attn.q_proj.weight": LLAMA["model.layers.0.self_attn.q_proj.weight"]
}
REPRO_LONG_LAYER = _st_file(*header_json({**LLAMA, **_LONG_NAME}))


@fuzz_settings(300)
@given(blob=safetensors_bytes(), with_config=st.booleans())
@example(blob=REPRO_LONG_LAYER, with_config=False)
@example(blob=REPRO_LONG_LAYER, with_config=True)
@example(blob=struct.pack("<Q", 2**64 - 1) + b"{}", with_config=False)
def test_safetensors_is_a_model_or_one_line(blob: bytes, with_config: bool) -> None:
    values = _header_values(blob)
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        (folder / "model.safetensors").write_bytes(blob)
        if with_config:
            (folder / "config.json").write_text(json.dumps(TINY_CONFIG))
        source = folder if with_config else folder / "model.safetensors"
        with passing_over_known_bugs():
            accepted_or_refused(lambda: load_model(str(source)), values)


def _header_values(blob: bytes) -> list[str]:
    try:
        return long_values(json.loads(blob[8:].decode("utf-8", "replace").rstrip("\0 ")))
    except (ValueError, RecursionError):
        return [LONG_LAYER] if LONG_LAYER[:100].encode() in blob else []


# ---- GGUF ----------------------------------------------------------------------------------------------

V = gguf.GGUFValueType
H, HEADS, KV, HD, FF, VOCAB = 64, 4, 2, 16, 128, 16
BASE_KV: dict[str, tuple[str, Any]] = {
    "general.name": ("STRING", "fuzz"),
    "llama.context_length": ("UINT32", 128),
    "llama.embedding_length": ("UINT32", H),
    "llama.block_count": ("UINT32", 1),
    "llama.feed_forward_length": ("UINT32", FF),
    "llama.attention.head_count": ("UINT32", HEADS),
    "llama.attention.head_count_kv": ("UINT32", KV),
    "llama.rope.dimension_count": ("UINT32", HD),
    "llama.attention.layer_norm_rms_epsilon": ("FLOAT32", 1e-5),
}
BASE_TENSORS: dict[str, list[int]] = {
    "token_embd.weight": [VOCAB, H],
    "blk.0.attn_norm.weight": [H],
    "blk.0.attn_q.weight": [HEADS * HD, H],
    "blk.0.attn_k.weight": [KV * HD, H],
    "blk.0.attn_v.weight": [KV * HD, H],
    "blk.0.attn_output.weight": [H, HEADS * HD],
    "blk.0.ffn_norm.weight": [H],
    "blk.0.ffn_gate.weight": [FF, H],
    "blk.0.ffn_up.weight": [FF, H],
    "blk.0.ffn_down.weight": [H, FF],
    "output_norm.weight": [H],
    "output.weight": [VOCAB, H],
}
KV_KEYS = [
    *BASE_KV,
    "llama.vocab_size",
    "llama.expert_count",
    "llama.expert_used_count",
    "llama.attention.key_length",
    "llama.attention.value_length",
    "llama.attention.sliding_window",
    "general.alignment",
    "general.architecture",
    "general.file_type",
]
TENSOR_NAMES = [
    *BASE_TENSORS,
    f"blk.{LONG_LAYER}.attn_q.weight",
    "blk.4097.attn_q.weight",
    "blk.-1.ffn_up.weight",
]
_INTS = {"UINT8": (0, 255), "INT8": (-128, 127), "UINT16": (0, 2**16 - 1), "INT16": (-(2**15), 2**15 - 1)}
_INTS |= {"UINT32": (0, 2**32 - 1), "INT32": (-(2**31), 2**31 - 1), "UINT64": (0, 2**64 - 1)}
_INTS |= {"INT64": (-(2**63), 2**63 - 1)}
_FLOATS = st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e38, -1.0, 0.0, 2.5, 4097.0])


@st.composite
def _kv_value(draw: st.DrawFn) -> tuple[str, Any]:
    vtype = draw(st.sampled_from([*_INTS, "FLOAT32", "FLOAT64", "BOOL", "STRING", "ARRAY"]))
    if vtype in _INTS:
        lo, hi = _INTS[vtype]
        extremes = [v for v in EXTREME_INTS if lo <= v <= hi]
        return vtype, draw(st.sampled_from([lo, hi, *extremes]) | st.integers(lo, hi))
    if vtype in ("FLOAT32", "FLOAT64"):
        return vtype, draw(_FLOATS | st.floats(width=32))
    if vtype == "BOOL":
        return vtype, draw(st.booleans())
    if vtype == "STRING":
        return vtype, draw(st.text(max_size=12) | st.just("x" * 300))
    return vtype, draw(st.lists(st.integers(0, 2**31), max_size=4))


@st.composite
def gguf_plans(draw: st.DrawFn) -> dict[str, Any]:
    """What to write: metadata {key: (type, value)}, tensors {name: shape}, then byte changes."""
    kv = dict(BASE_KV)
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(KV_KEYS))
        if draw(st.integers(0, 3)) == 0:
            kv.pop(key, None)
        else:
            kv[key] = draw(_kv_value())
    tensors = dict(BASE_TENSORS)
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(sorted(tensors)))
        shape = tensors.pop(name)
        if draw(st.booleans()):
            tensors[draw(st.sampled_from(TENSOR_NAMES))] = draw(
                st.sampled_from([shape, [1], [H, 1], [3, 5], [H, H, 2]])
            )
    flips = draw(st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)), max_size=3))
    cut = draw(st.none() | st.integers(0, 1 << 16))
    return {"kv": kv, "tensors": tensors, "flips": flips, "cut": cut}


def write_plan(path: Path, plan: dict[str, Any]) -> bytes:
    w = gguf.GGUFWriter(path, "llama")
    try:
        for key, (vtype, value) in plan["kv"].items():
            if vtype == "ARRAY":
                w.add_key_value(key, value, V.ARRAY, V.UINT32)
            else:
                w.add_key_value(key, value, V[vtype])
        w.add_token_list([f"t{i}" for i in range(VOCAB)])
        for name, shape in plan["tensors"].items():
            w.add_tensor(name, np.zeros(shape, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    blob = bytearray(path.read_bytes())
    for pos, byte in plan["flips"]:
        if pos < len(blob):
            blob[pos] = byte
    if plan["cut"] is not None:
        blob = blob[: plan["cut"]]
    path.write_bytes(bytes(blob))
    return bytes(blob)


def _plan(kv: dict[str, tuple[str, Any]] | None = None, tensors: dict[str, list[int]] | None = None) -> dict:
    return {"kv": {**BASE_KV, **(kv or {})}, "tensors": tensors or BASE_TENSORS, "flips": [], "cut": None}


REPRO_INF_BLOCKS = _plan(kv={"llama.block_count": ("FLOAT32", float("inf"))})
REPRO_NAN_HEADS = _plan(kv={"llama.attention.head_count": ("FLOAT32", float("nan"))})
REPRO_GGUF_LONG_LAYER = _plan(tensors={**BASE_TENSORS, f"blk.{LONG_LAYER}.attn_q.weight": [HEADS * HD, H]})
REPRO_HUGE_BLOCKS = _plan(kv={"llama.block_count": ("UINT64", 2**64 - 1)})


@fuzz_settings(250)
@given(plan=gguf_plans())
@example(plan=REPRO_INF_BLOCKS)
@example(plan=REPRO_NAN_HEADS)
@example(plan=REPRO_GGUF_LONG_LAYER)
@example(plan=REPRO_HUGE_BLOCKS)
def test_gguf_is_a_model_or_one_line(plan: dict[str, Any]) -> None:
    values = [v for v in (LONG_LAYER, "x" * 300) if any(v in n for n in plan["tensors"])]
    values += [v for _, v in plan["kv"].values() if isinstance(v, str) and len(v) > 80]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.gguf"
        try:
            write_plan(path, plan)
        except (ValueError, TypeError, OverflowError, struct.error):  # the writer refuses (not gpumem)
            assume(False)
        with passing_over_known_bugs():
            accepted_or_refused(lambda: load_model(str(path)), values)


# ---- sharded safetensors: model.safetensors.index.json + shards -----------------------------------------

SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
_NAMES = list(LLAMA)
SHARD_SPECS = [
    {n: LLAMA[n] for n in _NAMES[: len(_NAMES) // 2]},
    {n: LLAMA[n] for n in _NAMES[len(_NAMES) // 2 :]},
]
INDEX = {
    "metadata": {"total_size": sum(header_json(s)[1] for s in SHARD_SPECS)},
    "weight_map": {n: SHARDS[i] for i, spec in enumerate(SHARD_SPECS) for n in spec},
}
INDEX_KEYS = ["metadata", "weight_map", "total_size", *SHARDS, *ST_NAMES[:3]]


def check_sharded_folder(index_text: str, with_config: bool, only_shard: int | None) -> None:
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        (folder / "model.safetensors.index.json").write_text(index_text, encoding="utf-8")
        for name, spec in zip(SHARDS, SHARD_SPECS, strict=True):
            (folder / name).write_bytes(_st_file(*header_json(spec)))
        if with_config:
            (folder / "config.json").write_text(json.dumps(TINY_CONFIG))
        source = folder / SHARDS[only_shard] if only_shard is not None else folder
        accepted_or_refused(lambda: load_model(str(source)), values_in(index_text))


@fuzz_settings(100)
@given(
    index_text=documents([INDEX], INDEX_KEYS),
    with_config=st.booleans(),
    only_shard=st.none() | st.sampled_from([0, 1]),
)
@example(
    index_text='{"metadata": {"total_size": ' + "9" * 4301 + '}, "weight_map": {}}',
    with_config=True,
    only_shard=None,
)
@example(index_text=json.dumps(INDEX), with_config=True, only_shard=0)  # a shard given alone
def test_sharded_folder_is_a_model_or_one_line(
    index_text: str, with_config: bool, only_shard: int | None
) -> None:
    with passing_over_known_bugs():
        check_sharded_folder(index_text, with_config, only_shard)
