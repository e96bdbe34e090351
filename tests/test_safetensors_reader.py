"""safetensors headers -> WeightsInventory: exact bytes, strict validation, fuzzing."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.safetensors import (
    DTYPE_BITS,
    MAX_HEADER_BYTES,
    inventory_from_safetensor_headers,
    inventory_from_safetensors,
    read_safetensors_header,
)

# Bytes per element, written out here independently of the reader's table (safetensors tensor.rs
# Dtype::bitsize / 8); F4 is two elements per byte.
ITEM_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I8": 1, "U8": 1, "F8_E4M3": 1, "F64": 8, "I64": 8}

Spec = dict[str, tuple[str, list[int]]]


def _nbytes(dtype: str, shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    if dtype == "F4":
        return n // 2
    return n * ITEM_BYTES[dtype]


def header_json(tensors: Spec, metadata: dict[str, str] | None = None) -> tuple[dict[str, Any], int]:
    """The header object for ``tensors`` laid out back to back (in the given order), and the data size."""
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    pos = 0
    for name, (dtype, shape) in tensors.items():
        n = _nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + n]}
        pos += n
    return header, pos


def raw_file(header: object, data_size: int, *, pad: bool = True) -> bytes:
    text = json.dumps(header).encode()
    if pad:  # the reference writer pads the header with spaces to a multiple of 8
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"\0" * data_size


def write_st(path: Path, tensors: Spec, metadata: dict[str, str] | None = None) -> Path:
    header, size = header_json(tensors, metadata)
    path.write_bytes(raw_file(header, size))
    return path


LLAMA: Spec = {
    "model.embed_tokens.weight": ("BF16", [32, 16]),
    "model.layers.0.input_layernorm.weight": ("F32", [16]),
    "model.layers.0.self_attn.q_proj.weight": ("BF16", [16, 16]),
    "model.layers.0.self_attn.k_proj.weight": ("BF16", [8, 16]),
    "model.layers.0.self_attn.v_proj.weight": ("BF16", [8, 16]),
    "model.layers.0.self_attn.o_proj.weight": ("BF16", [16, 16]),
    "model.layers.0.post_attention_layernorm.weight": ("F32", [16]),
    "model.layers.0.mlp.gate_proj.weight": ("BF16", [24, 16]),
    "model.layers.0.mlp.up_proj.weight": ("BF16", [24, 16]),
    "model.layers.0.mlp.down_proj.weight": ("BF16", [16, 24]),
    "model.norm.weight": ("F32", [16]),
    "lm_head.weight": ("BF16", [32, 16]),
}


# ---- valid files -------------------------------------------------------------------------------------


def test_single_file_exact_totals(tmp_path: Path) -> None:
    f = write_st(tmp_path / "model.safetensors", LLAMA, metadata={"format": "pt"})
    inv = inventory_from_safetensors(f)
    assert inv.format == "safetensors"
    assert inv.files == (str(f),)
    assert inv.tensor_count == 12
    assert inv.quantization is None
    # BF16: embed 512 + q 256 + k 128 + v 128 + o 256 + gate 384 + up 384 + down 384 + head 512 = 2944
    assert inv.elements_by_dtype == {"BF16": 2944, "F32": 48}
    assert inv.bytes_by_dtype == {"BF16": 5888, "F32": 192}
    assert inv.total_bytes == 6080
    assert inv.total_elements == 2992
    assert inv.elements_by_component["embedding"] == 512
    assert inv.elements_by_component["attention"] == 768
    assert inv.elements_by_component["mlp"] == 1152
    assert inv.elements_by_component["norms"] == 48
    assert inv.elements_by_component["lm_head"] == 512
    assert inv.bytes_by_component["attention"] == 1536
    assert inv.bytes_by_component["norms"] == 192
    assert inv.bytes_by_component["other"] == 0
    assert sum(inv.bytes_by_component.values()) == inv.total_bytes
    t = inv.tensor("model.layers.0.mlp.down_proj.weight")
    assert t is not None
    assert (t.shape, t.elements, t.nbytes, t.component, t.layer) == ((16, 24), 384, 768, "mlp", 0)


def test_header_keeps_metadata_apart_and_orders_by_offset(tmp_path: Path) -> None:
    tensors: Spec = {"b": ("F32", [2]), "a": ("F16", [3])}
    header, size = header_json(tensors, metadata={"format": "pt", "note": "x"})
    f = tmp_path / "m.safetensors"
    f.write_bytes(raw_file(header, size))
    h = read_safetensors_header(f)
    assert h["metadata"] == {"format": "pt", "note": "x"}
    assert list(h["tensors"]) == ["b", "a"]
    assert h["tensors"]["a"] == {"dtype": "F16", "shape": (3,), "data_offsets": (8, 14)}
    assert h["file_size"] == f.stat().st_size
    assert h["header_length"] == f.stat().st_size - 8 - 14


def test_only_header_bytes_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = write_st(tmp_path / "model.safetensors", LLAMA)
    header_len = struct.unpack("<Q", f.read_bytes()[:8])[0]
    read_sizes: list[int] = []
    real_open = Path.open

    class Counting:
        def __init__(self, fh: Any) -> None:
            self.fh = fh

        def read(self, n: int = -1) -> bytes:
            b = self.fh.read(n)
            read_sizes.append(len(b))
            return b

        def fileno(self) -> int:
            return self.fh.fileno()

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: object) -> None:
            self.fh.close()

    def counting_open(self: Path, mode: str = "r", *a: Any, **k: Any) -> Any:
        fh = real_open(self, mode, *a, **k)
        return Counting(fh) if "b" in mode and self.suffix == ".safetensors" else fh

    monkeypatch.setattr(Path, "open", counting_open)
    inventory_from_safetensors(f)
    assert sum(read_sizes) == 8 + header_len


def test_sharded_with_index(tmp_path: Path) -> None:
    names = list(LLAMA)
    shard1 = {n: LLAMA[n] for n in names[:6]}
    shard2 = {n: LLAMA[n] for n in names[6:]}
    write_st(tmp_path / "model-00001-of-00002.safetensors", shard1)
    write_st(tmp_path / "model-00002-of-00002.safetensors", shard2)
    # a stray consolidated file the index does not name must not be counted
    write_st(tmp_path / "consolidated.safetensors", LLAMA)
    weight_map = {n: "model-00001-of-00002.safetensors" for n in shard1} | {
        n: "model-00002-of-00002.safetensors" for n in shard2
    }
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 6080}, "weight_map": weight_map})
    )
    (tmp_path / "one").mkdir()
    single = inventory_from_safetensors(write_st(tmp_path / "one" / "x.safetensors", LLAMA))
    for source in (tmp_path, tmp_path / "model.safetensors.index.json"):
        inv = inventory_from_safetensors(source)
        assert [Path(f).name for f in inv.files] == [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ]
        assert inv.tensor_count == 12
        assert inv.total_bytes == 6080
        assert inv.bytes_by_dtype == single.bytes_by_dtype
        assert inv.bytes_by_component == single.bytes_by_component


def test_folder_without_index_reads_every_file(tmp_path: Path) -> None:
    names = list(LLAMA)
    write_st(tmp_path / "a.safetensors", {n: LLAMA[n] for n in names[:3]})
    write_st(tmp_path / "b.safetensors", {n: LLAMA[n] for n in names[3:]})
    inv = inventory_from_safetensors(tmp_path)
    assert [Path(f).name for f in inv.files] == ["a.safetensors", "b.safetensors"]
    assert inv.total_bytes == 6080


def test_index_problems(tmp_path: Path) -> None:
    write_st(tmp_path / "s1.safetensors", {"a.weight": ("F32", [2])})
    index = tmp_path / "model.safetensors.index.json"

    index.write_text(json.dumps({"weight_map": {"a.weight": "s1.safetensors", "b.weight": "s2.safetensors"}}))
    with pytest.raises(GpumemInputError, match=r"shard 's2.safetensors' .* does not exist"):
        inventory_from_safetensors(tmp_path)

    index.write_text(json.dumps({"weight_map": {"a.weight": "s1.safetensors", "c.weight": "s1.safetensors"}}))
    with pytest.raises(GpumemInputError, match=r"tensor 'c.weight' is listed in .* but is not in it"):
        inventory_from_safetensors(tmp_path)

    write_st(tmp_path / "s2.safetensors", {"a.weight": ("F32", [2]), "b.weight": ("F32", [1])})
    index.write_text(json.dumps({"weight_map": {"a.weight": "s1.safetensors", "b.weight": "s2.safetensors"}}))
    with pytest.raises(GpumemInputError, match=r"tensor 'a.weight' is also stored in shard 's1.safetensors'"):
        inventory_from_safetensors(tmp_path)

    for bad in (
        {"weight_map": {}},
        {"weight_map": {"a.weight": 3}},
        {"weight_map": {"a.weight": "../x.safetensors"}},
        {"nothing": 1},
        [1, 2],
    ):
        index.write_text(json.dumps(bad))
        with pytest.raises(GpumemInputError, match=r"model\.safetensors\.index\.json"):
            inventory_from_safetensors(tmp_path)
    index.write_text("{not json")
    with pytest.raises(GpumemInputError, match="malformed JSON"):
        inventory_from_safetensors(tmp_path)


def test_path_problems(tmp_path: Path) -> None:
    with pytest.raises(GpumemInputError, match="no such file or folder"):
        inventory_from_safetensors(tmp_path / "missing.safetensors")
    with pytest.raises(GpumemInputError, match=r"holds no \.safetensors files"):
        inventory_from_safetensors(tmp_path)
    (tmp_path / "x.bin").write_bytes(b"1234")
    with pytest.raises(GpumemInputError, match=r"not a \.safetensors file"):
        inventory_from_safetensors(tmp_path / "x.bin")


# ---- quantized layouts -----------------------------------------------------------------------------------

IN, OUT, GROUP = 64, 32, 32  # a q_proj of 64 inputs, 32 outputs; 4-bit, group size 32; int32 packs 8 values


def _base() -> Spec:
    return {
        "model.embed_tokens.weight": ("F16", [16, IN]),
        "model.layers.0.input_layernorm.weight": ("F16", [IN]),
    }


GPTQ: Spec = {
    **_base(),
    "model.layers.0.self_attn.q_proj.qweight": ("I32", [IN // 8, OUT]),
    "model.layers.0.self_attn.q_proj.qzeros": ("I32", [IN // GROUP, OUT // 8]),
    "model.layers.0.self_attn.q_proj.scales": ("F16", [IN // GROUP, OUT]),
    "model.layers.0.self_attn.q_proj.g_idx": ("I32", [IN]),
}
AWQ: Spec = {
    **_base(),
    "model.layers.0.self_attn.q_proj.qweight": ("I32", [IN, OUT // 8]),
    "model.layers.0.self_attn.q_proj.qzeros": ("I32", [IN // GROUP, OUT // 8]),
    "model.layers.0.self_attn.q_proj.scales": ("F16", [IN // GROUP, OUT]),
}
BNB4: Spec = {
    **_base(),
    "model.layers.0.self_attn.q_proj.weight": ("U8", [IN * OUT // 2, 1]),
    "model.layers.0.self_attn.q_proj.weight.absmax": ("U8", [IN * OUT // 64]),
    "model.layers.0.self_attn.q_proj.weight.nested_absmax": ("F32", [1]),
    "model.layers.0.self_attn.q_proj.weight.nested_quant_map": ("F32", [256]),
    "model.layers.0.self_attn.q_proj.weight.quant_map": ("F32", [16]),
    "model.layers.0.self_attn.q_proj.weight.quant_state.bitsandbytes__nf4": ("U8", [120]),
}
BNB8: Spec = {
    **_base(),
    "model.layers.0.self_attn.q_proj.weight": ("I8", [OUT, IN]),
    "model.layers.0.self_attn.q_proj.SCB": ("F32", [OUT]),
    "model.layers.0.self_attn.q_proj.weight_format": ("U8", []),
}
FP8: Spec = {
    **_base(),
    "model.layers.0.self_attn.q_proj.weight": ("F8_E4M3", [OUT, IN]),
    "model.layers.0.self_attn.q_proj.weight_scale_inv": ("F32", [1, 1]),
}


@pytest.mark.parametrize(
    ("tensors", "scheme", "attention_bytes", "attention_elements"),
    [
        # qweight 8*32*4 + qzeros 2*4*4 + scales 2*32*2 + g_idx 64*4
        (GPTQ, "gptq", 1024 + 32 + 128 + 256, 256 + 8 + 64 + 64),
        # qweight 64*4*4 + qzeros 2*4*4 + scales 2*32*2
        (AWQ, "awq", 1024 + 32 + 128, 256 + 8 + 64),
        # weight 1024 + absmax 32 + nested_absmax 4 + nested_quant_map 1024 + quant_map 64 + state 120
        (BNB4, "bitsandbytes-4bit", 1024 + 32 + 4 + 1024 + 64 + 120, 1024 + 32 + 1 + 256 + 16 + 120),
        # weight 2048 + SCB 128 + weight_format 1
        (BNB8, "bitsandbytes-8bit", 2048 + 128 + 1, 2048 + 32 + 1),
        # weight 2048 + scale 4
        (FP8, "fp8", 2048 + 4, 2048 + 1),
    ],
)
def test_quantized_layouts(
    tmp_path: Path, tensors: Spec, scheme: str, attention_bytes: int, attention_elements: int
) -> None:
    inv = inventory_from_safetensors(write_st(tmp_path / "model.safetensors", tensors))
    assert inv.quantization == scheme
    assert inv.bytes_by_component["attention"] == attention_bytes
    assert inv.elements_by_component["attention"] == attention_elements
    assert inv.bytes_by_component["embedding"] == 16 * IN * 2
    assert inv.bytes_by_component["norms"] == IN * 2
    assert inv.bytes_by_component["other"] == 0
    assert inv.total_bytes == attention_bytes + 16 * IN * 2 + IN * 2
    by_dtype: dict[str, int] = {}
    for dtype, shape in tensors.values():
        by_dtype[dtype] = by_dtype.get(dtype, 0) + _nbytes(dtype, shape)
    assert inv.bytes_by_dtype == dict(sorted(by_dtype.items()))


def test_config_quant_method_wins(tmp_path: Path) -> None:
    write_st(tmp_path / "model.safetensors", GPTQ)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "quantization_config": {"quant_method": "AWQ"}}))
    assert inventory_from_safetensors(tmp_path).quantization == "awq"
    cfg.write_text(
        json.dumps({"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}})
    )
    assert inventory_from_safetensors(tmp_path / "model.safetensors").quantization == "bitsandbytes-8bit"
    cfg.write_text(json.dumps({"quantization_config": {"quant_method": "compressed-tensors"}}))
    assert inventory_from_safetensors(tmp_path).quantization == "compressed-tensors"
    cfg.write_text(json.dumps({"model_type": "llama"}))
    assert inventory_from_safetensors(tmp_path).quantization == "gptq"
    cfg.write_text("{broken")
    with pytest.raises(GpumemInputError, match=r"config\.json"):
        inventory_from_safetensors(tmp_path)


def test_bnb_method_without_flags_uses_tensors(tmp_path: Path) -> None:
    write_st(tmp_path / "model.safetensors", BNB4)
    (tmp_path / "config.json").write_text(
        json.dumps({"quantization_config": {"quant_method": "bitsandbytes"}})
    )
    assert inventory_from_safetensors(tmp_path).quantization == "bitsandbytes-4bit"


def test_more_detections(tmp_path: Path) -> None:
    ct: Spec = {
        "model.layers.0.mlp.down_proj.weight_packed": ("I32", [8, 4]),
        "model.layers.0.mlp.down_proj.weight_scale": ("BF16", [8, 1]),
        "model.layers.0.mlp.down_proj.weight_shape": ("I64", [2]),
    }
    assert (
        inventory_from_safetensors(write_st(tmp_path / "ct.safetensors", ct)).quantization
        == "compressed-tensors"
    )
    mx: Spec = {
        "model.layers.0.mlp.experts.gate_up_proj_blocks": ("U8", [2, 8, 1, 16]),
        "model.layers.0.mlp.experts.gate_up_proj_scales": ("U8", [2, 8, 1]),
    }
    inv = inventory_from_safetensors(write_st(tmp_path / "mx.safetensors", mx))
    assert inv.quantization == "mxfp4"
    assert inv.bytes_by_component["routed_experts"] == 256 + 16


def test_sub_byte_dtype(tmp_path: Path) -> None:
    f = tmp_path / "f4.safetensors"
    f.write_bytes(raw_file({"w": {"dtype": "F4", "shape": [4, 6], "data_offsets": [0, 12]}}, 12))
    inv = inventory_from_safetensors(f)
    assert (inv.total_elements, inv.total_bytes) == (24, 12)
    f.write_bytes(raw_file({"w": {"dtype": "F4", "shape": [3], "data_offsets": [0, 1]}}, 1))
    with pytest.raises(GpumemInputError, match="do not fill whole bytes"):
        read_safetensors_header(f)


def test_every_spec_dtype_is_known() -> None:
    # safetensors/src/tensor.rs Dtype (May 2026)
    assert set(DTYPE_BITS) == {
        "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
        "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64",
    }  # fmt: skip


def test_headers_from_elsewhere() -> None:
    h1, _ = header_json({n: LLAMA[n] for n in list(LLAMA)[:5]})
    h2, _ = header_json({n: LLAMA[n] for n in list(LLAMA)[5:]})
    h1["__metadata__"] = {"format": "pt"}
    inv = inventory_from_safetensor_headers(
        {"model-2.safetensors": h2, "model-1.safetensors": h1}, source="hf://org/m", quant_method=None
    )
    assert inv.source == "hf://org/m"
    assert inv.files == ("model-1.safetensors", "model-2.safetensors")
    assert (inv.tensor_count, inv.total_bytes) == (12, 6080)
    q, _ = header_json(GPTQ)
    assert inventory_from_safetensor_headers({"m.safetensors": q}, source="s").quantization == "gptq"
    assert inventory_from_safetensor_headers(
        {"m.safetensors": q}, source="s", quant_method="GPTQ"
    ).quantization == ("gptq")
    with pytest.raises(GpumemInputError, match="unknown dtype"):
        inventory_from_safetensor_headers(
            {"m.safetensors": {"w": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}}, source="s"
        )
    with pytest.raises(GpumemInputError, match="no safetensors headers"):
        inventory_from_safetensor_headers({}, source="s")


# ---- malformed files: each a GpumemInputError naming the file and the problem ---------------------------

GOOD = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}


def _entry(**over: object) -> dict[str, object]:
    return {"w": {**GOOD["w"], **over}}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "too short for a safetensors header length"),
        (b"\x05\0\0", "too short for a safetensors header length"),
        (struct.pack("<Q", 0) + b"{}", "header length is 0"),
        (
            struct.pack("<Q", 123456) + b"{}" + b" " * 100,
            "header length 123456 is larger than the file (110 bytes)",
        ),
        (struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}", "exceeds the safetensors limit of 100000000 bytes"),
        (struct.pack("<Q", 2**64 - 1), "exceeds the safetensors limit"),
        (struct.pack("<Q", 4) + b"\xff\xfe{}", "not valid UTF-8"),
        (struct.pack("<Q", 5) + b"{abc}", "not valid JSON"),
        (raw_file([1, 2], 0), "must be a JSON object, got list"),
        (raw_file("x", 0), "must be a JSON object, got str"),
        (struct.pack("<Q", 17) + b'{"a": 1, "a": 2} ', "header lists 'a' twice"),
        (raw_file({"w": 3}, 0), "entry must be an object"),
        (raw_file({"w": {"shape": [1], "data_offsets": [0, 4]}}, 4), "entry has no dtype"),
        (raw_file({"w": {"dtype": "F32"}}, 4), "entry has no shape, data_offsets"),
        (raw_file(_entry(dtype="F128"), 16), "unknown dtype 'F128'"),
        (raw_file(_entry(dtype=7), 16), "unknown dtype 7"),
        (raw_file(_entry(shape=[2, -2]), 16), "negative dimension"),
        (raw_file(_entry(shape=[2, 2.0]), 16), "shape must be a list of integers"),
        (raw_file(_entry(shape=[True, 4]), 16), "shape must be a list of integers"),
        (raw_file(_entry(shape="2x2"), 16), "shape must be a list of integers"),
        (raw_file(_entry(data_offsets=[0]), 16), "data_offsets must be [begin, end] integers"),
        (raw_file(_entry(data_offsets=[0, 16.0]), 16), "data_offsets must be [begin, end] integers"),
        (raw_file(_entry(data_offsets={"begin": 0}), 16), "data_offsets must be [begin, end] integers"),
        (raw_file(_entry(data_offsets=[16, 0]), 16), "must satisfy 0 <= begin <= end"),
        (raw_file(_entry(data_offsets=[-4, 12]), 16), "must satisfy 0 <= begin <= end"),
        (raw_file(_entry(data_offsets=[0, 12]), 16), "span 12 bytes but shape [2, 2] of F32 needs 16"),
        (raw_file(GOOD, 8), "beyond the file"),
        (raw_file(_entry(data_offsets=[4, 20]), 20), "leaves a gap of 4 bytes"),
        (raw_file(GOOD, 20), "tensor data covers 16 bytes but the file holds 20 bytes"),
        (
            raw_file({"a": GOOD["w"], "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}}, 16),
            "overlaps the previous tensor",
        ),
        (raw_file({"__metadata__": {"a": 1}, **GOOD}, 16), "'__metadata__' must be an object of strings"),
        (raw_file({"__metadata__": [1], **GOOD}, 16), "'__metadata__' must be an object of strings"),
        (struct.pack("<Q", 4000) + b"[" * 4000 + b"\0" * 16, "not valid JSON"),
    ],
)
def test_malformed(tmp_path: Path, content: bytes, message: str) -> None:
    f = tmp_path / "bad.safetensors"
    f.write_bytes(content)
    with pytest.raises(GpumemInputError) as ei:
        inventory_from_safetensors(f)
    assert message in str(ei.value)
    assert str(f) in str(ei.value)


def test_empty_header_object_is_valid(tmp_path: Path) -> None:
    f = tmp_path / "empty.safetensors"
    f.write_bytes(raw_file({}, 0))
    inv = inventory_from_safetensors(f)
    assert (inv.tensor_count, inv.total_bytes) == (0, 0)


# ---- fuzzing: the only exception allowed out of the reader is GpumemInputError ----------------------------

_FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
_VALID = raw_file(*header_json({**GPTQ, "lm_head.weight": ("BF16", [4, 4])}, metadata={"format": "pt"}))


@pytest.fixture(scope="module")
def fuzz_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("st-fuzz") / "fuzz.safetensors"


def _try(f: Path, content: bytes) -> None:
    f.write_bytes(content)
    try:
        inv = inventory_from_safetensors(f)
    except GpumemInputError as e:
        assert str(f) in str(e)
        return
    assert inv.total_bytes == sum(t.nbytes for t in inv.tensors)


@_FUZZ
@given(st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8))
def test_fuzz_mutated_bytes(fuzz_file: Path, mutations: list[tuple[int, int]]) -> None:
    b = bytearray(_VALID)
    for pos, val in mutations:
        b[pos] = val
    _try(fuzz_file, bytes(b))


@_FUZZ
@given(st.integers(0, len(_VALID)))
def test_fuzz_truncated(fuzz_file: Path, n: int) -> None:
    _try(fuzz_file, _VALID[:n])


@_FUZZ
@given(st.integers(0, 2**64 - 1), st.binary(max_size=64))
def test_fuzz_header_length(fuzz_file: Path, n: int, rest: bytes) -> None:
    _try(fuzz_file, struct.pack("<Q", n) + rest)


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
_entry_strategy = st.fixed_dictionaries(
    {},
    optional={
        "dtype": st.sampled_from([*DTYPE_BITS, "F128", ""]) | _json,
        "shape": st.lists(st.integers(-2, 6), max_size=3) | _json,
        "data_offsets": st.lists(st.integers(-2, 200), min_size=0, max_size=3) | _json,
    },
)


@_FUZZ
@given(
    st.dictionaries(st.text(max_size=10), _entry_strategy | _json, max_size=4),
    st.integers(0, 256),
    st.booleans(),
)
def test_fuzz_random_json_headers(fuzz_file: Path, header: dict[str, Any], data_size: int, pad: bool) -> None:
    _try(fuzz_file, raw_file(header, data_size, pad=pad))
