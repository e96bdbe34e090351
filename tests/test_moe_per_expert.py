"""QLoRA on transformers 4's per-expert Linear4bit experts (qlora_experts 4bit-linear,
gpumem_gui/core/replay/moe_per_expert.py). bitsandbytes needs CUDA: the 4-bit path is not traced here; the
trainable parameters are checked against PEFT on the transformers 4.57 module layout built on the meta
device, the bytes against the arithmetic of the sources."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core import GpumemInputError, load_model
from gpumem_gui.core.training import estimate_training, make_training_run
from tests.conftest import REPO, reference_dir

EXTRA = REPO / "tests" / "reference" / "extra" / "configs"
QWEN3_MOE = EXTRA / "synthetic__qwen3_moe-sparse-step2.json"
# two MoE layers (1 and 5) of 8 experts: per expert gate_proj / up_proj [128, 256], down_proj [256, 128]
STACK_NUMEL = 2 * 8 * (256 * 256 + 256 * 128)
RANK = 8


def _v4_qwen3_moe(config: dict):
    """Qwen3MoeForCausalLM's linear modules as transformers v4.57 builds them
    (``src/transformers/models/qwen3_moe/modeling_qwen3_moe.py``: ``Qwen3MoeAttention`` q/k/v/o_proj;
    ``Qwen3MoeSparseMoeBlock``: ``gate = nn.Linear(hidden, num_experts)`` and ``experts = nn.ModuleList(
    Qwen3MoeMLP(config, intermediate_size=moe_intermediate_size))``; ``Qwen3MoeDecoderLayer``: a sparse
    block where ``layer_idx not in mlp_only_layers and (layer_idx + 1) % decoder_sparse_step == 0``), on the
    meta device: transformers 5 fuses the experts, so the v4 class cannot be built from the installed one."""
    torch = pytest.importorskip("torch")
    nn = torch.nn
    h, heads, kv, hd = (
        config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    )

    def mlp(inter: int) -> nn.Module:
        m = nn.Module()
        m.gate_proj, m.up_proj, m.down_proj = (
            nn.Linear(h, inter, False),
            nn.Linear(h, inter, False),
            nn.Linear(inter, h, False),
        )
        return m

    layers = nn.ModuleList()
    with torch.device("meta"):
        for i in range(config["num_hidden_layers"]):
            layer = nn.Module()
            attn = nn.Module()
            attn.q_proj, attn.k_proj = nn.Linear(h, heads * hd, False), nn.Linear(h, kv * hd, False)
            attn.v_proj, attn.o_proj = nn.Linear(h, kv * hd, False), nn.Linear(heads * hd, h, False)
            layer.self_attn = attn
            if i not in config["mlp_only_layers"] and (i + 1) % config["decoder_sparse_step"] == 0:
                block = nn.Module()
                block.gate = nn.Linear(h, config["num_experts"], False)
                block.experts = nn.ModuleList(
                    mlp(config["moe_intermediate_size"]) for _ in range(config["num_experts"])
                )
                layer.mlp = block
            else:
                layer.mlp = mlp(config["intermediate_size"])
            layers.append(layer)
        model = nn.Module()
        model.model = nn.Module()
        model.model.layers = layers
        model.lm_head = nn.Linear(h, config["vocab_size"], False)
    return model


def _peft_v4(targets: list[str]) -> int:
    peft = pytest.importorskip("peft")
    model = _v4_qwen3_moe(json.loads(QWEN3_MOE.read_text()))
    wrapped = peft.inject_adapter_in_model(peft.LoraConfig(r=RANK, target_modules=targets), model)
    return sum(p.numel() for n, p in wrapped.named_parameters() if "lora_" in n)


def _qlora(**run: object):
    spec = load_model(str(QWEN3_MOE)).spec
    base = {
        "method": "qlora",
        "precision": "bf16",
        "seq": 64,
        "lora_rank": RANK,
        "qlora_experts": "4bit-linear",
    }
    return estimate_training(spec, make_training_run(**{**base, **run}))


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(
    ("ours", "peft_targets"),
    [
        ("gate_proj,up_proj,down_proj", ["gate_proj", "up_proj", "down_proj"]),
        (
            "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
            ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        ),
        # all-linear: every nn.Linear but the output layer, the v4 router (an nn.Linear) among them
        ("all-linear", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "gate"]),
    ],
)
def test_per_expert_adapters_equal_peft_on_the_v4_layout(ours: str, peft_targets: list[str]) -> None:
    """PEFT on transformers 4 converts nothing: each expert's gate/up/down_proj gets lora_A [r, in] and
    lora_B [out, r], and the dense MLP of layers 0, 2, 3, 4 keeps its adapters (transformers 5's conversion
    takes them off: 4bit and bf16 count the fused stacks instead)."""
    est = _qlora(lora_targets=ours)
    assert int(est.facts["trainable_params"]) == _peft_v4(peft_targets)
    fused = _qlora(lora_targets=ours, qlora_experts="4bit")
    assert int(fused.facts["trainable_params"]) != int(est.facts["trainable_params"])


def test_expert_projection_adapters_at_the_byte() -> None:
    """Worked example: experts only, r 8: per MoE layer 8 experts x (gate, up: r (256 + 128); down: r (128 +
    256)) = 8 x 3 x 8 x 384 = 73,728; two MoE layers; the dense layers' MLPs (256 -> 512) add 4 x 3 x 8 x
    (256 + 512)."""
    experts = 2 * 8 * 3 * RANK * (256 + 128)
    dense = 4 * 3 * RANK * (256 + 512)
    assert (
        int(_qlora(lora_targets="gate_proj,up_proj,down_proj").facts["trainable_params"]) == experts + dense
    )


def _component(est, key: str) -> int:
    return sum(c.bytes for c in est.phases["forward"].components if c.key == key)


def test_no_dequantized_expert_copy_is_kept_for_backward() -> None:
    """MatMul4Bit (bitsandbytes ``autograd/_functions.py``) saves the packed weight and dequantizes it again
    in backward: after the forward no dequantized copy is alive (Axolotl's 4-bit stacks keep each MoE layer's
    whole bf16 stacks: 2 B x STACK_NUMEL exactly); the packed weights are the same bytes either way."""
    per_expert, stacks = (
        _qlora(lora_targets="q_proj,v_proj"),
        _qlora(lora_targets="q_proj,v_proj", qlora_experts="4bit"),
    )
    assert _component(stacks, "dequantized_weights") == 2 * STACK_NUMEL
    assert _component(per_expert, "dequantized_weights") == 0
    assert _component(per_expert, "parameters") == _component(stacks, "parameters")
    assert per_expert.peak_bytes < stacks.peak_bytes
    assert any("one Linear4bit per expert projection" in w for w in per_expert.warnings)


def test_the_per_expert_loop_is_refused_where_the_v4_names_are_unknown() -> None:
    qwen2 = load_model(str(EXTRA / "synthetic__qwen2_moe-sparse-step2.json")).spec
    with pytest.raises(GpumemInputError) as e:
        estimate_training(qwen2, make_training_run(method="qlora", qlora_experts="4bit-linear", seq=64))
    assert e.value.field == "qlora_experts"


def test_half_a_v4_gate_up_pair_is_refused_not_guessed() -> None:
    with pytest.raises(GpumemInputError, match="per-expert") as e:
        _qlora(lora_targets="q_proj,gate_proj")
    assert e.value.field == "lora_targets"


def test_a_dense_model_ignores_the_field() -> None:
    dense = load_model(str(reference_dir() / "configs" / "Qwen__Qwen3-0.6B.json")).spec
    est = estimate_training(dense, make_training_run(method="qlora", qlora_experts="4bit-linear"))
    assert not any("qlora_experts" in w for w in est.warnings)


def test_with_checkpointing_the_fused_4_bit_stacks_cost_about_one_layers_copy_more() -> None:
    """Checkpointing recomputes each layer in backward: Axolotl's 4-bit stacks then hold one MoE layer's
    dequantized bf16 stacks at the peak (Mixtral-8x7B: 8 experts x 3 x 4096 x 14336 x 2 B = 2.625 GiB),
    the per-expert Linear4bit path one expert's matrix at a time (README's former 'about one layer's copy
    high' for 4bit standing in for transformers < 5)."""
    spec = load_model(str(reference_dir() / "configs" / "mistralai__Mixtral-8x7B-v0.1.json")).spec
    run = {
        "method": "qlora",
        "precision": "bf16",
        "seq": 2048,
        "grad_ckpt": True,
        "lora_targets": "q_proj,k_proj,v_proj,o_proj",
    }
    fused = estimate_training(spec, make_training_run(**run, qlora_experts="4bit")).peak_bytes
    per_expert = estimate_training(spec, make_training_run(**run, qlora_experts="4bit-linear")).peak_bytes
    layer = 8 * 3 * 4096 * 14336 * 2
    assert layer <= fused - per_expert <= layer * 1.05
