"""Quantized checkpoints as published (issue 14 item 3): gpt-oss's MXFP4 experts and fp8 block-quantized
checkpoints (DeepSeek-V3/R1, MiniMax-M2, Qwen3-FP8), read from ``quantization_config`` and from the
safetensors headers, sized as the files hold them: the formula of the format the config names equals the
bytes of headers laid out as the publishers' files are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumem_gui.core import GpumemInputError, estimate_inference, load_model, make_run
from gpumem_gui.core.formats import weight_bytes
from gpumem_gui.core.readers.checkpoint_quant import checkpoint_format
from gpumem_gui.core.readers.hf_config import load_config_file, spec_from_config
from gpumem_gui.core.runtimes.base import weights_from_files
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import text_tensors
from tests.conftest import REPO
from tests.safetensors_files import Spec, write_st

CONFIGS = REPO / "tests" / "reference" / "extra" / "configs"
MXFP4 = {"modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"], "quant_method": "mxfp4"}
FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
_CEIL = 128


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _gpt_oss_files(spec: ModelSpec) -> Spec:
    """The tensors of a gpt-oss checkpoint as OpenAI publishes it: experts as ``*_blocks`` uint8
    [E, rows, cols / 32, 16] and ``*_scales`` uint8 [E, rows, cols / 32] (the fused [E, 2F, h] gate_up and
    [E, h, F] down layouts), their biases, the router as ``mlp.router``, the rest bf16."""
    out: Spec = {}
    for t in text_tensors(spec):
        name = f"model.{t.name}" if not t.name.startswith("lm_head") else t.name
        name = name.replace(".mlp.gate.", ".mlp.router.")
        if t.component == "routed_experts" and len(t.shape) == 3:
            e, rows, cols = t.shape
            out[f"{name}_blocks"] = ("U8", [e, rows, cols // 32, 16])
            out[f"{name}_scales"] = ("U8", [e, rows, cols // 32])
        else:
            out[name] = ("BF16", list(t.shape))
    return out


def test_gpt_oss_headers_equal_the_mxfp4_experts_format(tmp_path: Path) -> None:
    cfg = json.loads((CONFIGS / "synthetic__gpt_oss-tiny.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization_config": MXFP4}))
    spec = spec_from_config(cfg, name="tiny", source="config.json")
    write_st(tmp_path / "model.safetensors", _gpt_oss_files(spec))
    m = load_model(tmp_path)
    assert m.weights is not None and m.weights.quantization == "mxfp4"
    assert m.checkpoint_weights == "mxfp4-moe"
    files, formula = weights_from_files(spec, m.weights), weight_bytes(spec, "mxfp4-moe")
    assert files.total_bytes == formula.total_bytes
    for part in ("routed_experts", "attention", "router", "embedding", "lm_head", "norms"):
        assert files.by_component[part] == formula.by_component[part], part
    assert formula.total_bytes < weight_bytes(spec, "bf16").total_bytes * 0.6  # not a dequantized copy


@pytest.mark.parametrize(("name", "gib"), [("openai__gpt-oss-20b", 12.8), ("openai__gpt-oss-120b", 60.8)])
def test_published_checkpoint_sizes(name: str, gib: float) -> None:
    """The model card's checkpoint sizes (arXiv:2508.10925, Table 1: 12.8 GiB and 60.8 GiB), and the
    config.json alone sizes the model as published."""
    m = load_model(str(CONFIGS / f"{name}.json"))
    assert m.checkpoint_weights == "mxfp4-moe" and m.spec is not None
    assert round(weight_bytes(m.spec, "mxfp4-moe").total_bytes / 2**30, 1) == gib
    est = estimate_inference(m.spec, make_run(seq=256, weights=m.checkpoint_weights))
    assert round(est.phases["load"].peak_bytes / 2**30, 1) == gib


def _fp8_files(spec: ModelSpec) -> Spec:
    """An fp8 block-quantized checkpoint as DeepSeek-V3 / Qwen3-FP8 / MiniMax-M2 publish it: every linear of
    the decoder (attention, MLP, each expert's gate/up/down) in e4m3 with an fp32 ``weight_scale_inv``
    [ceil(out / 128), ceil(in / 128)]; router, norms, embedding and head bf16."""
    out: Spec = {}
    for t in text_tensors(spec):
        name = f"model.{t.name}" if not t.name.startswith("lm_head") else t.name
        if t.component == "routed_experts":  # per-expert nn.Linear tensors in the published files
            e, rows, cols = t.shape
            parts = ("gate_proj", "up_proj") if t.name.endswith("gate_up_proj") else ("down_proj",)
            rows //= len(parts)
            for j in range(e):
                for p in parts:
                    base = name.replace(t.name.split(".")[-1], f"{j}.{p}")
                    out[f"{base}.weight"] = ("F8_E4M3", [rows, cols])
                    out[f"{base}.weight_scale_inv"] = ("F32", [_ceil(rows, _CEIL), _ceil(cols, _CEIL)])
        elif len(t.shape) == 2 and t.component in ("attention", "mlp", "shared_experts"):
            out[name] = ("F8_E4M3", list(t.shape))
            scale = name.removesuffix(".weight") + ".weight_scale_inv"
            out[scale] = ("F32", [_ceil(t.shape[0], _CEIL), _ceil(t.shape[1], _CEIL)])
        else:
            out[name] = ("BF16", list(t.shape))
    return out


_QWEN3 = {
    "model_type": "qwen3",
    "hidden_size": 320,
    "intermediate_size": 704,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 96,
    "vocab_size": 1000,
}
_QWEN3_MOE = {**_QWEN3, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2}


@pytest.mark.parametrize("cfg", [_QWEN3, {**_QWEN3_MOE, "moe_intermediate_size": 192}], ids=["dense", "moe"])
def test_fp8_block_headers_equal_the_fp8_block_format(tmp_path: Path, cfg: dict) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization_config": FP8}))
    spec = load_config_file(tmp_path / "config.json")
    write_st(tmp_path / "model.safetensors", _fp8_files(spec))
    m = load_model(tmp_path)
    assert m.weights is not None and m.weights.quantization == "fp8"
    assert m.checkpoint_weights == "fp8-block"
    files, formula = weights_from_files(spec, m.weights), weight_bytes(spec, "fp8-block")
    assert files.total_bytes == formula.total_bytes
    for part, n in formula.by_component.items():
        assert files.by_component[part] == n, part


@pytest.mark.parametrize(
    ("qc", "fmt"),
    [
        (MXFP4, "mxfp4-moe"),
        ({"quant_method": "MXFP4"}, "mxfp4-moe"),
        (FP8, "fp8-block"),
        ({"quant_method": "fp8"}, "fp8-block"),  # FineGrainedFP8Config's default block (128, 128)
        ({"quant_method": "fp8", "weight_block_size": None}, "fp8"),  # one scale per tensor
        ({"quant_method": "fp8", "weight_block_size": [64, 64]}, None),  # no format sizes it
        ({**FP8, "expert_dtype": "fp4"}, None),
        ({"quant_method": "gptq", "bits": 4}, "gptq-4"),  # GPTQConfig's default group size 128
        ({"quant_method": "gptq", "bits": 4, "group_size": 32}, None),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}, "awq-4"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "nf4"),
        (
            {
                "quant_method": "bitsandbytes",
                "load_in_4bit": True,
                "bnb_4bit_quant_type": "nf4",
                "bnb_4bit_use_double_quant": True,
            },
            "nf4-dq",
        ),
        ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "int8"),
        ({"load_in_4bit": True}, None),
    ],
)
def test_the_format_a_quantization_config_names(qc: dict, fmt: str | None) -> None:
    assert checkpoint_format({"model_type": "x", "quantization_config": qc}) == fmt
    assert checkpoint_format({"model_type": "x"}) is None


@pytest.mark.parametrize(
    ("qc", "field"),
    [
        ("mxfp4", "quantization_config"),
        ({"quant_method": 4}, "quantization_config.quant_method"),
        ({"quant_method": "fp8", "weight_block_size": [128]}, "quantization_config.weight_block_size"),
        ({"quant_method": "fp8", "weight_block_size": [0, 128]}, "quantization_config.weight_block_size"),
    ],
)
def test_a_bad_quantization_config_names_the_field(tmp_path: Path, qc: object, field: str) -> None:
    cfg = json.loads((CONFIGS / "synthetic__gpt_oss-tiny.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "quantization_config": qc}))
    with pytest.raises(GpumemInputError) as e:
        load_model(str(path))
    assert field in str(e.value) and "\n" not in str(e.value)
