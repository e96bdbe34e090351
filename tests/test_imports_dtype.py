"""A PyTorch server's ``--dtype`` (vLLM, SGLang) on an already quantized checkpoint: the activations' dtype
and that of the tensors the checkpoint leaves unquantized; the quantized weights keep the checkpoint's format
(vllm/config/model.py ModelConfig.quantization: without a quantization option the checkpoint's
quantization_config decides, and only when it has none does dtype set the weights). On an unquantized
checkpoint --dtype is the weights' dtype too. Issue 33 item 10: gpt-oss-20b was 18.3 -> 44.5 GiB per GPU."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.cli import main
from gpumem_gui.core import import_command, load_model


def _estimate(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    rc = main(["estimate", "--json", "--gpu", "H100-SXM-80GB", *argv])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


def _weights(doc: dict) -> int:
    return next(c["bytes"] for c in doc["components"] if c["key"] == "weights")


@pytest.mark.parametrize(
    "command",
    [
        "vllm serve openai/gpt-oss-20b --dtype bfloat16 --max-model-len 8192",
        "python -m sglang.launch_server --model-path openai/gpt-oss-20b --dtype bfloat16 "
        "--context-length 8192",
    ],
)
def test_dtype_keeps_a_quantized_checkpoints_format(capsys: pytest.CaptureFixture[str], command: str) -> None:
    doc = _estimate(capsys, "--from", command)
    assert doc["run"]["weights"] == "mxfp4-moe" and doc["run"]["compute_dtype"] == "bf16"
    engine = doc["run"]["engine"]
    flags = _estimate(capsys, "openai/gpt-oss-20b", "--engine", engine, "--compute-dtype", "bf16")
    assert flags["run"]["weights"] == "mxfp4-moe"
    assert _weights(doc) == _weights(flags)  # the command and the same run given as flags agree
    said = [r["read_as"] for r in doc["imported"]["read_as"] if r["written"] == "--dtype bfloat16"]
    assert any("checkpoint's quantized format (mxfp4-moe)" in s for s in said)


def test_dtype_casts_an_unquantized_checkpoint(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _estimate(capsys, "--from", "vllm serve Qwen/Qwen3-8B --dtype float32 --max-model-len 4096")
    assert doc["run"]["weights"] == "fp32" and doc["run"]["compute_dtype"] == "fp32"
    bf16 = _estimate(capsys, "--from", "vllm serve Qwen/Qwen3-8B --max-model-len 4096")
    assert _weights(doc) == 2 * _weights(bf16)


def test_a_quantization_option_names_the_weights_itself() -> None:
    imp = import_command("vllm serve Qwen/Qwen3-8B --dtype float16 --quantization fp8")
    assert imp.dtype_weights is None and imp.run.weights == "fp8"
    m = load_model("Qwen/Qwen3-8B")
    assert imp.with_model(m.spec, m.checkpoint_quantization).run.weights == "fp8"


def test_the_decision_waits_for_the_model() -> None:
    imp = import_command("vllm serve openai/gpt-oss-20b --dtype half")
    assert imp.dtype_weights == ("fp16", "--dtype half") and "weights" not in imp.run.model_fields_set
    gpt = load_model("openai/gpt-oss-20b")
    assert gpt.checkpoint_quantization == "mxfp4-moe"
    assert "weights" not in imp.with_model(gpt.spec, gpt.checkpoint_quantization).run.model_fields_set
    qwen = load_model("Qwen/Qwen3-8B")
    assert qwen.checkpoint_quantization is None
    assert imp.with_model(qwen.spec, None).run.weights == "fp16"


def test_a_quantization_no_format_sizes_still_counts_as_quantized() -> None:
    from gpumem_gui.core.readers.checkpoint_quant import checkpoint_quantization

    config = {"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized"}}
    assert checkpoint_quantization(config) == "compressed-tensors"
    assert checkpoint_quantization({"quantization_config": {"bits": 4}}) is None
    assert checkpoint_quantization({}) is None and checkpoint_quantization(None) is None
