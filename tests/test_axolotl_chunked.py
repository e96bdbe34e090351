"""Axolotl's chunked cross-entropy (``chunked_cross_entropy``, issue 33 item 8) and the Axolotl keys gpumem
does not model named in a warning (plugins); ``quantize_moe_experts`` read as the run field qlora_experts."""

from __future__ import annotations

import pytest

from gpumem_gui.core import GpumemInputError, load_model
from gpumem_gui.core.imports.registry import import_file
from gpumem_gui.core.training import estimate_training, make_training_run


@pytest.fixture(scope="module")
def qwen():
    return load_model("Qwen3-0.6B").spec


def _logits(est) -> int:
    return next(c.bytes for c in est.components if c.key == "logits")


def test_axolotl_offers_its_chunked_loss_and_the_bare_trainer_does_not(qwen) -> None:
    est = estimate_training(qwen, make_training_run(framework="axolotl", loss="chunked", method="lora"))
    assert any("Axolotl chunked_cross_entropy" in c.explain.source for c in est.components)
    with pytest.raises(GpumemInputError) as e:
        estimate_training(qwen, make_training_run(framework="hf-trainer", loss="chunked", method="lora"))
    assert e.value.field == "loss"


@pytest.mark.parametrize("batch", [1, 2])
def test_chunked_loss_keeps_16_bit_logits_and_no_fp32_copy(qwen, batch: int) -> None:
    seq, vocab = 2048, qwen.vocab_size
    bf16_logits = batch * seq * vocab * 2
    run = {"framework": "axolotl", "method": "lora", "batch": batch, "seq": seq}
    std = estimate_training(qwen, make_training_run(**run, loss="standard"))
    chk = estimate_training(qwen, make_training_run(**run, loss="chunked"))
    assert chk.peak_bytes < std.peak_bytes
    # standard (ForCausalLMLoss): the fp32 log-probabilities stay saved; chunked: the 16-bit logits only,
    # plus, for more than one sequence, the copies reshape makes of the non-contiguous chunks (forward)
    assert _logits(std) >= 2 * bf16_logits
    forward = chk.phases["forward"]
    fwd_logits = next(c.bytes for c in forward.components if c.key == "logits")
    assert bf16_logits <= fwd_logits < bf16_logits * (2 if batch > 1 else 1) + bf16_logits // 8
    if batch > 1:
        assert fwd_logits >= 2 * bf16_logits


def test_more_chunks_change_nothing_but_the_row_statistics(qwen) -> None:
    run = {"framework": "axolotl", "method": "lora", "seq": 1024, "loss": "chunked"}
    a = estimate_training(qwen, make_training_run(**run, loss_chunks=2)).peak_bytes
    b = estimate_training(qwen, make_training_run(**run, loss_chunks=16)).peak_bytes
    assert abs(a - b) < 1 << 20


def _axolotl(tmp_path, text: str):
    path = tmp_path / "axolotl.yml"
    path.write_text("base_model: Qwen/Qwen3-0.6B\nadapter: lora\nsequence_len: 512\n" + text)
    return import_file(str(path))


def test_chunked_cross_entropy_is_read_as_the_chunked_loss(tmp_path) -> None:
    imp = _axolotl(tmp_path, "chunked_cross_entropy: true\nchunked_cross_entropy_num_chunks: 4\n")
    assert imp.run.loss == "chunked" and imp.run.loss_chunks == 4
    assert not [w for w in imp.warnings if "chunked" in w]
    imp = _axolotl(tmp_path, "chunked_cross_entropy: true\n")
    assert imp.run.loss == "chunked" and imp.run.loss_chunks == 8  # patch_chunked_ce_loss_fn's default
    imp = _axolotl(tmp_path, "chunked_cross_entropy_num_chunks: 4\n")
    assert imp.run.loss == "auto" and any("chunked_cross_entropy_num_chunks" in w for w in imp.warnings)
    imp = _axolotl(tmp_path, "chunked_cross_entropy: true\nliger_fused_linear_cross_entropy: true\n")
    assert imp.run.loss == "fused-linear"
    assert any(w.startswith("chunked_cross_entropy") and "ignored" in w for w in imp.warnings)


def test_keys_and_plugins_gpumem_does_not_model_are_warned(tmp_path) -> None:
    imp = _axolotl(
        tmp_path,
        "tokens: ['<tool>']\nplugins:\n  - axolotl.integrations.kd.KDPlugin\n"
        "  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n",
    )
    text = " | ".join(imp.warnings)
    assert "tokens" in text
    assert "KDPlugin" in text and "CutCrossEntropyPlugin" not in text
    assert imp.run.loss == "fused-linear"
    assert not [n for _, n in imp.read_as if "plugins" in n and "no effect" in n]


@pytest.mark.parametrize(("value", "storage"), [("true", "4bit"), ("false", "bf16")])
def test_quantize_moe_experts_is_read_as_the_experts_storage(tmp_path, value: str, storage: str) -> None:
    """Axolotl's quantize_moe_experts (bitsandbytes parametrize on the fused expert stacks) is the run field
    qlora_experts, read and shown, no longer a warning."""
    imp = _axolotl(tmp_path, f"load_in_4bit: true\nadapter: qlora\nquantize_moe_experts: {value}\n")
    assert imp.run.method == "qlora" and imp.run.qlora_experts == storage
    assert imp.run.qlora_base == "nf4-dq"  # Axolotl's loader: adapter qlora -> bnb_4bit_use_double_quant
    assert not [w for w in imp.warnings if "quantize_moe_experts" in w]
    assert any("quantize_moe_experts" in key for key, _ in imp.read_as)
