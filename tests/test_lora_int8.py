"""LoRA on an 8-bit (LLM.int8, bitsandbytes load_in_8bit) base (issue 33 item 8): ``--method qlora
--qlora-base int8``. bitsandbytes needs CUDA, so the trace cannot run it here: the replay's Linear8bitLt is
checked against the allocations of bitsandbytes' own source (autograd/_functions.py MatMul8bitLt,
backends/cuda/ops.py int8_vectorwise_quant / int8_mm_dequant, backends/default/ops.py int8_mixed_scaled_mm
and int8_scaled_mm; bitsandbytes 95f9af3)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpumem_gui.core import GpumemInputError, load_model
from gpumem_gui.core.formats import weight_bytes
from gpumem_gui.core.replay import adapters
from gpumem_gui.core.replay.autograd import Sim
from gpumem_gui.core.replay.engine import backward
from gpumem_gui.core.training import estimate_training, make_training_run
from gpumem_gui.core.training.rank import simulate_rank


@pytest.fixture(scope="module")
def qwen():
    return load_model("Qwen3-0.6B").spec


def test_matmul8bitlt_allocates_what_its_source_does() -> None:
    rows, n_in, n_out = 64, 256, 1024
    sim = Sim()
    x = sim.param("x", rows * n_in, "bf16", True, rows * n_in * 2, None, sharded=False).tensor
    base = sim.tr.cur
    sim.tr.start_phase("forward")
    out = adapters.linear8bit(SimpleNamespace(s=sim), x, None, n_out, n_in)
    a, o = rows * n_in, rows * n_out
    # int8_vectorwise_quant: fp16 copy of A + int8 CA + fp32 row stats + A.abs() (fp16) + the bool mask
    quant = 2 * a + a + 4 * rows + 2 * a + a
    # int8_scaled_mm: int32 product + int8_mm_dequant's fp16 output + .to(bf16), beside CA and the row stats
    dequant = a + 4 * rows + 4 * o + 2 * o + 2 * o
    # output.addmm(subA, subB): a second bf16 output
    mixed = a + 4 * rows + 2 * o + 2 * o
    assert sim.tr.peaks["forward"][0] - base == max(quant, dequant, mixed)
    # kept after the forward: the output; A itself is saved (no copy)
    assert sim.tr.cur - base == 2 * o
    assert out.dt == "bf16" and out.n == o
    sim.tr.start_phase("backward")
    before = sim.tr.cur
    backward(sim, out)
    # CB.to(bf16, copy=True) (out x in) + grad_output @ CB (rows x in), beside the root's 4-byte gradient
    assert sim.tr.peaks["backward"][0] - before == 4 + 2 * n_out * n_in + 2 * a


def test_the_int8_base_holds_int8_weights_and_row_scales(qwen) -> None:
    run8 = make_training_run(method="qlora", qlora_base="int8", seq=256)
    run4 = make_training_run(method="qlora", qlora_base="nf4", seq=256)
    p8 = simulate_rank(qwen, run8)[0].param_bytes
    p4 = simulate_rank(qwen, run4)[0].param_bytes
    q8 = weight_bytes(qwen, "int8", compute_dtype_bytes=2, quantize_experts=False).quantized_bytes
    q4 = weight_bytes(qwen, "nf4", compute_dtype_bytes=2, quantize_experts=False).quantized_bytes
    assert p8 - p4 == q8 - q4
    # Linear8bitLt: out x in int8 + 4 bytes of SCB per output row (formats/hf_quant.py)
    assert q8 > q4 > 0


def test_an_int8_base_keeps_each_quantized_linears_input(qwen) -> None:
    e8 = estimate_training(qwen, make_training_run(method="qlora", qlora_base="int8", seq=512))
    e4 = estimate_training(qwen, make_training_run(method="qlora", qlora_base="nf4", seq=512))
    assert e8.peak_bytes > e4.peak_bytes
    params = next(c for c in e8.components if c.key == "parameters")
    assert "Linear8bitLt" in params.explain.formula and "MatMul8bitLt" in params.explain.source


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"fsdp": "full_shard", "dp": 2}, "qlora_base"),
        ({"zero": 3, "dp": 2}, "qlora_base"),
        ({"framework": "torchtune"}, "qlora_base"),
    ],
)
def test_an_int8_base_is_refused_where_it_cannot_run(qwen, fields: dict, field: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        estimate_training(qwen, make_training_run(method="qlora", qlora_base="int8", **fields))
    assert e.value.field == field


def test_the_copied_trainer_config_loads_in_8bit() -> None:
    from gpumem_gui.core.training.command import training_command

    text = training_command("Qwen3-0.6B", make_training_run(method="qlora", qlora_base="int8"))
    assert "load_in_8bit=True" in text and "load_in_4bit" not in text


@pytest.mark.parametrize(
    "text",
    [
        "base_model: Qwen/Qwen3-0.6B\nadapter: lora\nload_in_8bit: true\nsequence_len: 512\n",
        "model_name_or_path: Qwen/Qwen3-0.6B\nuse_peft: true\nload_in_8bit: true\nmax_length: 512\n",
        "model_name_or_path: Qwen/Qwen3-0.6B\nstage: sft\nfinetuning_type: lora\nquantization_bit: 8\n",
    ],
    ids=["axolotl", "trl", "llama-factory"],
)
def test_configs_loading_in_8bit_read_as_an_int8_base(tmp_path, text: str) -> None:
    from gpumem_gui.core.imports.registry import import_file

    path = tmp_path / "run.yaml"
    path.write_text(text)
    imported = import_file(str(path))
    assert imported.run.method == "qlora" and imported.run.qlora_base == "int8"
    assert not [w for w in imported.warnings if "load_in_8bit" in w or "quantization_bit" in w]
