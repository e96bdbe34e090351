"""LoRA on transformers 5's fused MoE experts as PEFT 0.21 resolves and runs it (issue 29 item 3,
``gpumem_gui/core/replay/moe_lora.py``): the adapters PEFT builds, counted against PEFT itself on the real
(meta-device) model; its refusals; the merged expert stacks the forward keeps for backward. The traced peaks
are in tests/test_trace.py (test_lora_on_fused_moe_experts_matches_the_trace) and tests/test_replay.py
(tests/reference/trace/train.json's MoE LoRA points)."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core import GpumemInputError, load_model
from gpumem_gui.core.training import estimate_training, make_training_run
from tests.conftest import REPO, reference_dir

EXTRA = REPO / "tests" / "reference" / "extra" / "configs"
RANK = 8

# (config, gpumem's lora_targets, PEFT's target_modules): Qwen2-MoE pattern (qwen3_moe, deepseek_v3 with
# dense and shared-expert MLPs that lose their adapters), Mixtral pattern (minimax), and qwen2_moe itself,
# which PEFT does not convert (its fused experts stay without adapters)
CASES = [
    (EXTRA / "synthetic__qwen3_moe-sparse-step2.json", "all-linear", "all-linear"),
    (EXTRA / "synthetic__qwen3_moe-sparse-step2.json", "gate_proj,up_proj", ["gate_proj", "up_proj"]),
    (
        EXTRA / "synthetic__qwen3_moe-sparse-step2.json",
        "q_proj,mlp.down_proj,gate",
        ["q_proj", "mlp.down_proj", "gate"],
    ),
    (EXTRA / "synthetic__qwen3_moe-sparse-step2.json", r"re:.*\.(gate|up)_proj", r".*\.(gate|up)_proj"),
    # a regex on a converted type is resolved to the last names it matches: every layer's q_proj
    (
        EXTRA / "synthetic__qwen3_moe-sparse-step2.json",
        r"re:model\.layers\.1\.self_attn\.q_proj",
        r"model\.layers\.1\.self_attn\.q_proj",
    ),
    (EXTRA / "synthetic__deepseek_v3-small.json", "all-linear", "all-linear"),
    (EXTRA / "synthetic__minimax-tiny.json", "all-linear", "all-linear"),
    (EXTRA / "synthetic__minimax-tiny.json", "w1,w3,w2", ["w1", "w3", "w2"]),
    (EXTRA / "synthetic__qwen2_moe-sparse-step2.json", "all-linear", "all-linear"),
    (reference_dir() / "configs" / "mistralai__Mixtral-8x7B-v0.1.json", "all-linear", "all-linear"),
    (reference_dir() / "configs" / "Qwen__Qwen3-30B-A3B.json", "all-linear", "all-linear"),
    (EXTRA / "deepseek-ai__DeepSeek-V2-Lite.json", "all-linear", "all-linear"),
]


def _peft_trainable(config: dict, targets: object, **lora: object) -> int:
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=RANK, target_modules=targets, **lora))
    return sum(p.numel() for p in wrapped.parameters() if p.requires_grad)


def _ours(path, targets: str, **run: object) -> int:
    spec = load_model(str(path)).spec
    est = estimate_training(
        spec, make_training_run(method="lora", lora_rank=RANK, lora_targets=targets, **run)
    )
    return int(est.facts["trainable_params"])


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(("path", "ours", "peft_targets"), CASES, ids=lambda v: getattr(v, "stem", str(v)))
def test_trainable_parameters_equal_peft(path, ours: str, peft_targets: object) -> None:
    assert _ours(path, ours) == _peft_trainable(json.loads(path.read_text()), peft_targets)


def test_expert_stack_adapters_are_rank_times_experts() -> None:
    """ParamWrapper.update_layer: lora_A [r * E, in], lora_B [out, r * E]; gate_up_proj (two v4 names fused)
    at rank 2r (rank_pattern). qwen3_moe-sparse-step2: 8 experts, hidden 256, moe_intermediate 128, MoE
    layers 1 and 5."""
    experts, hidden, inter, moe_layers = 8, 256, 128, 2
    gate_up = (2 * RANK * experts) * (hidden + 2 * inter)
    down = (RANK * experts) * (inter + hidden)
    path = EXTRA / "synthetic__qwen3_moe-sparse-step2.json"
    assert _ours(path, "gate_proj,up_proj,down_proj") == moe_layers * (gate_up + down)


def test_merged_stacks_are_kept_for_backward() -> None:
    """_LoraFactorsProxy: baddbmm makes a full-size copy of each adapted stack, which the grouped matmul
    saves; the forward peak grows by at least every MoE layer's merged stacks (bf16) over the same run without
    expert targets."""
    path = EXTRA / "synthetic__qwen3_moe-sparse-step2.json"
    spec = load_model(str(path)).spec
    run = {"method": "lora", "precision": "bf16", "lora_rank": RANK, "seq": 64}
    attn = estimate_training(spec, make_training_run(**run, lora_targets="q_proj,k_proj,v_proj,o_proj"))
    both = estimate_training(
        spec, make_training_run(**run, lora_targets="q_proj,k_proj,v_proj,o_proj,down_proj")
    )
    merged = 2 * 8 * 256 * 128 * 2  # two MoE layers' down_proj stacks, bf16
    grown = both.phases["forward"].peak_bytes - attn.phases["forward"].peak_bytes
    assert grown >= merged


@pytest.mark.filterwarnings("ignore")
def test_half_a_fused_stack_is_refused_as_peft_refuses_it() -> None:
    path = EXTRA / "synthetic__qwen3_moe-sparse-step2.json"
    with pytest.raises(GpumemInputError, match="gate_proj without up_proj") as e:
        _ours(path, "q_proj,gate_proj")
    assert e.value.field == "lora_targets"
    with pytest.raises(ValueError, match="without also targeting up_proj"):
        _peft_trainable(json.loads(path.read_text()), ["q_proj", "gate_proj"])


@pytest.mark.filterwarnings("ignore")
def test_dropout_on_parameter_targets_is_refused_as_peft_refuses_it() -> None:
    path = EXTRA / "synthetic__qwen3_moe-sparse-step2.json"
    with pytest.raises(GpumemInputError, match="ParamWrapper") as e:
        _ours(path, "all-linear", lora_dropout=0.05)
    assert e.value.field == "lora_dropout"
    with pytest.raises(ValueError, match="lora_dropout"):
        _peft_trainable(json.loads(path.read_text()), "all-linear", lora_dropout=0.05)
    assert _ours(path, "q_proj,v_proj", lora_dropout=0.05) > 0  # linears only: dropout is fine


@pytest.mark.filterwarnings("ignore")
def test_the_router_of_a_model_peft_does_not_convert_is_refused() -> None:
    """qwen2_moe is no key of transformers' conversion patterns: its Qwen2MoeTopKRouter stays a module PEFT
    cannot adapt."""
    path = EXTRA / "synthetic__qwen2_moe-sparse-step2.json"
    with pytest.raises(GpumemInputError, match="'gate'") as e:
        _ours(path, "q_proj,gate")
    assert e.value.field == "lora_targets"
    with pytest.raises(ValueError, match="not supported"):
        _peft_trainable(json.loads(path.read_text()), ["q_proj", "gate"])


def test_the_estimate_says_the_experts_are_adapted() -> None:
    spec = load_model(str(EXTRA / "synthetic__qwen3_moe-sparse-step2.json")).spec
    est = estimate_training(spec, make_training_run(method="lora", seq=64))
    assert any("expert stacks (down_proj, gate_up_proj)" in w for w in est.warnings)
    dense = load_model(str(reference_dir() / "configs" / "Qwen__Qwen3-0.6B.json")).spec
    assert not any(
        "expert stacks" in w for w in estimate_training(dense, make_training_run(method="lora")).warnings
    )


# ---- QLoRA: how a 4-bit base stores the routed experts (run field qlora_experts)
QWEN3_MOE = EXTRA / "synthetic__qwen3_moe-sparse-step2.json"
# two MoE layers of 8 experts: gate_up [8, 256, 256] and down [8, 256, 128]
STACK_NUMEL = 2 * 8 * (256 * 256 + 256 * 128)


def _qlora(**run: object):
    spec = load_model(str(QWEN3_MOE)).spec
    base = {"method": "qlora", "precision": "bf16", "seq": 64, "lora_targets": "q_proj,v_proj"}
    return estimate_training(spec, make_training_run(**{**base, **run}))


def _weights(est) -> int:
    return sum(c.bytes for c in est.phases["forward"].components if c.key == "parameters")


def test_4bit_experts_store_the_stacks_in_4_bit() -> None:
    """bf16 (transformers >= 5 under bitsandbytes): the stacks are bf16 parameters; 4bit: packed nf4 (half
    a byte per weight), a 4-byte absmax per 64 and a quant_map per expert matrix: the weights fall by 1.4
    bytes per expert weight at least."""
    bf16, four = _qlora(qlora_experts="bf16"), _qlora(qlora_experts="4bit")
    assert _weights(bf16) - _weights(four) >= STACK_NUMEL * 1.4
    assert any("routed experts are bf16" in w for w in bf16.warnings)
    assert any("routed experts are 4-bit" in w for w in four.warnings)


def test_4bit_stacks_are_dequantized_and_kept_for_backward() -> None:
    """Bnb4bitParametrization dequantizes a whole stack (no_grad) when the experts read it, and the grouped
    matmul saves that copy: without checkpointing every MoE layer keeps a bf16 copy of its stacks, so the
    forward activations grow by at least the bf16 stacks over the bf16-experts run."""

    def acts(est) -> int:
        keys = ("activations", "dequantized_weights")
        return sum(c.bytes for c in est.phases["forward"].components if c.key in keys)

    assert acts(_qlora(qlora_experts="4bit")) - acts(_qlora(qlora_experts="bf16")) >= STACK_NUMEL * 2
    ckpt = {"grad_ckpt": True}
    assert _qlora(qlora_experts="4bit", **ckpt).peak_bytes < _qlora(qlora_experts="bf16", **ckpt).peak_bytes


def test_4bit_experts_need_a_4_bit_base() -> None:
    with pytest.raises(GpumemInputError) as e:
        _qlora(qlora_base="int8", qlora_experts="4bit")
    assert e.value.field == "qlora_experts"
    assert any("LLM.int8" in w for w in _qlora(qlora_base="int8").warnings)


def test_a_dense_model_says_nothing_about_experts() -> None:
    dense = load_model(str(reference_dir() / "configs" / "Qwen__Qwen3-0.6B.json")).spec
    est = estimate_training(dense, make_training_run(method="qlora", qlora_experts="4bit"))
    assert not any("qlora_experts" in w for w in est.warnings)


@pytest.mark.parametrize("point_id", ["axolotl-glm45-air-qlora-1x80", "axolotl-qwen3-next-80b-qlora"])
def test_published_moe_qlora_runs_are_within_5_percent_with_4_bit_experts(point_id: str) -> None:
    """Axolotl's published MoE QLoRA figures (validation/data/published_training_runs/points.json: source,
    quote and run there): within 5 % with the experts 4-bit as those runs stored them, and three times the
    figure with the bf16 experts transformers 5 loads without quantize_moe_experts."""
    points = json.loads(
        (REPO / "validation" / "data" / "published_training_runs" / "points.json").read_text()
    )
    p = next(p for p in points["points"] if p["id"] == point_id)
    spec = load_model(p["model"]).spec
    measured = p["measured"]["bytes"]
    ours = estimate_training(spec, make_training_run(**p["run"])).peak_bytes
    assert ours == pytest.approx(measured, rel=0.05)
    bf16 = estimate_training(spec, make_training_run(**{**p["run"], "qlora_experts": "bf16"})).peak_bytes
    assert bf16 > 3 * measured
