"""The weight-format registry, float formats, speed of weight_bytes, and KV-cache dtypes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats import (
    KV_DTYPES,
    check_kv_dtype,
    engine_kv_dtypes,
    get_weight_format,
    kv_bytes_per_element,
    list_weight_formats,
    weight_bytes,
)
from gpumem_gui.core.readers.hf_config import load_config_file
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import count_params, text_tensors
from tests.format_specs import ALL_CONFIGS, FORMAT_IDS, LLAMA31, config_spec


@pytest.fixture(scope="module")
def llama31() -> ModelSpec:
    return config_spec(LLAMA31)


# ---- registry -------------------------------------------------------------------------------------------


def test_registry_has_the_required_ids() -> None:
    required = {
        "fp32", "fp16", "bf16", "fp8", "fp8-block", "int8", "nf4", "fp4", "nf4-dq", "fp4-dq", "gptq-2",
        "gptq-3", "gptq-4", "gptq-8", "awq-4", "mxfp4", "nvfp4", "gguf-Q4_K", "gguf-Q8_0", "gguf-IQ4_XS",
        "gguf-Q4_K_M", "gguf-Q4_K_S", "gguf-Q5_K_M", "gguf-Q5_K_S", "gguf-Q6_K", "gguf-Q3_K_M", "gguf-Q3_K_S",
        "gguf-Q3_K_L", "gguf-Q2_K", "gguf-Q4_0", "gguf-F16", "gguf-BF16",
    }  # fmt: skip
    assert required <= set(FORMAT_IDS)
    assert len(FORMAT_IDS) == len(set(FORMAT_IDS))
    for f in list_weight_formats():
        assert f.source and f.label and f.description and f.bits > 0


def test_every_weight_carrying_ggml_type_is_a_format() -> None:
    from gguf import GGML_QUANT_SIZES

    skipped = {"F32", "F16", "BF16", "Q8_1", "Q8_K", "I8", "I16", "I32", "I64", "F64"}
    for t, (block, size) in GGML_QUANT_SIZES.items():
        if t.name in skipped:
            continue
        ids = (f"gguf-{t.name}", f"gguf-{t.name}-pure")
        fmt = next(f for f in list_weight_formats() if f.id in ids and f.family == "gguf")
        assert fmt.bits == size * 8 / block


def test_format_bits_follow_block_layouts() -> None:
    assert get_weight_format("nf4").bits == 4.5  # 4 + 32/64
    assert get_weight_format("nf4-dq").bits == pytest.approx(4.127, abs=5e-4)  # 4 + 8/64 + 32/(64*256)
    assert get_weight_format("gptq-4").bits == 4 + 16 / 128 + 4 / 128
    assert get_weight_format("mxfp4").bits == 4.25
    assert get_weight_format("nvfp4").bits == 4.5
    assert get_weight_format("gguf-Q4_K").bits == 4.5  # 144 B per 256
    assert get_weight_format("gguf-Q6_K").bits == 6.5625  # 210 B per 256
    assert get_weight_format("gguf-Q8_0").bits == 8.5  # 34 B per 32


def test_unknown_format_is_a_clear_error(llama31: ModelSpec) -> None:
    with pytest.raises(GpumemInputError) as e:
        get_weight_format("nf5")
    assert e.value.field == "weights"
    assert "nf4" in str(e.value) and "nf5" in str(e.value)
    with pytest.raises(GpumemInputError) as e:
        weight_bytes(llama31, "gguf-Q4_K_X")
    assert e.value.field == "weights" and "gguf-Q4_K_M" in str(e.value)
    with pytest.raises(GpumemInputError):
        weight_bytes(llama31, "bf16", compute_dtype_bytes=3)


def test_format_ids_are_case_insensitive(llama31: ModelSpec) -> None:
    assert get_weight_format("GGUF-q4_k_m").id == "gguf-Q4_K_M"
    assert weight_bytes(llama31, "BF16").format == "bf16"


# ---- float formats --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=lambda p: p.stem)
def test_float_formats_are_exact(path: Path) -> None:
    """Every parameter at the format's width, but the tensors the model keeps in fp32 whatever its dtype
    (DeepSeek-V4: Tensor.fp32) at 4 B."""
    spec = load_config_file(path)
    pc = count_params(spec)
    kept = [t for t in text_tensors(spec) if t.fp32]
    for fid, width in (("bf16", 2), ("fp16", 2), ("fp32", 4)):
        wb = weight_bytes(spec, fid)
        extra = {k: 0 for k in pc.by_component}
        layers = [0] * len(pc.per_layer)
        for t in kept:
            extra[t.component] += (4 - width) * t.numel
            if t.layer is not None:
                layers[t.layer] += (4 - width) * t.numel
        assert wb.total_bytes == width * pc.total + sum(extra.values())
        assert wb.by_component == {k: width * v + extra[k] for k, v in pc.by_component.items()}
        assert wb.per_layer == tuple(width * n + x for n, x in zip(pc.per_layer, layers, strict=True))
        assert wb.bits_per_param == 8 * wb.total_bytes / pc.total
        assert wb.quantized_params == 0


# ---- speed ----------------------------------------------------------------------------------------------


def test_weight_bytes_is_fast(llama31: ModelSpec) -> None:
    weight_bytes(llama31, "gguf-Q4_K_M")
    start = time.perf_counter()
    for _ in range(1000):
        weight_bytes(llama31, "gguf-Q4_K_M")
    assert time.perf_counter() - start < 1.0  # cached: microseconds per call


# ---- KV-cache dtypes ------------------------------------------------------------------------------------


def test_kv_bytes_per_element() -> None:
    assert kv_bytes_per_element("fp32") == 4
    assert kv_bytes_per_element("fp16") == kv_bytes_per_element("bf16") == 2
    for k in ("fp8", "fp8_e4m3", "fp8_e5m2", "int8"):
        assert kv_bytes_per_element(k) == 1
    assert kv_bytes_per_element("q8_0") == 34 / 32
    assert kv_bytes_per_element("q4_0") == 18 / 32
    assert kv_bytes_per_element("q4_1") == 20 / 32
    assert kv_bytes_per_element("q5_0") == 22 / 32
    assert kv_bytes_per_element("q5_1") == 24 / 32
    assert kv_bytes_per_element("iq4_nl") == 18 / 32
    assert kv_bytes_per_element("f16") == 2  # llama.cpp spelling
    assert KV_DTYPES["q8_0"] == 34 / 32
    with pytest.raises(GpumemInputError) as e:
        kv_bytes_per_element("q3_k")
    assert e.value.field == "kv_dtype"


def test_engine_kv_dtypes() -> None:
    assert set(engine_kv_dtypes("llama.cpp")) == {
        "fp32", "fp16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1",
    }  # fmt: skip
    # each engine's own choices, nothing wider (issue 33: vLLM rejects --kv-cache-dtype fp16 / float32)
    assert set(engine_kv_dtypes("vllm")) == {"bf16", "fp8", "fp8_e4m3", "fp8_e5m2"}  # cache.py CacheDType
    assert set(engine_kv_dtypes("sglang")) == {"bf16", "fp8_e4m3", "fp8_e5m2"}  # server_args.py
    assert set(engine_kv_dtypes("ollama")) == {"fp16", "q8_0", "q4_0"}  # ggml.go SupportsKVCacheType
    assert {"fp16", "bf16", "fp32"} <= set(engine_kv_dtypes("transformers"))
    assert all(k in KV_DTYPES for e in ("transformers", "vllm", "llama.cpp") for k in engine_kv_dtypes(e))


def test_check_kv_dtype() -> None:
    check_kv_dtype("vllm", "fp8")
    check_kv_dtype("vllm", "auto")
    check_kv_dtype("llama.cpp", "q8_0")
    check_kv_dtype("llama.cpp", "f16")
    check_kv_dtype("transformers", "bf16")
    with pytest.raises(GpumemInputError) as e:
        check_kv_dtype("vllm", "q8_0")
    assert e.value.field == "kv_dtype"
    msg = str(e.value)
    assert "vllm" in msg and "fp8_e5m2" in msg and "q8_0" in msg
    with pytest.raises(GpumemInputError) as e:
        check_kv_dtype("llama.cpp", "fp8")
    assert "q4_0" in str(e.value)
    for engine, kv in (("vllm", "fp16"), ("vllm", "fp32"), ("sglang", "fp16"), ("ollama", "bf16")):
        with pytest.raises(GpumemInputError, match="allowed: auto, "):
            check_kv_dtype(engine, kv)
    check_kv_dtype("sglang", "auto")  # every engine has its default
    check_kv_dtype("ollama", "auto")
    with pytest.raises(GpumemInputError) as e:
        check_kv_dtype("tensorrt", "fp8")
    assert e.value.field == "engine"
