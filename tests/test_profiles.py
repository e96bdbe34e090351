"""Framework profiles (core/training/profiles.py): defaults with sources, what each framework refuses, and
what the tricks change in the replay (the measured numbers are in tests/test_truth_tricks.py)."""

from __future__ import annotations

from typing import get_args

import pytest

from gpumem_gui.core import GpumemInputError, load_model
from gpumem_gui.core.replay.loss import liger_chunk_rows
from gpumem_gui.core.training import estimate_training, make_training_run, step_config
from gpumem_gui.core.training.profiles import PROFILES, resolve
from gpumem_gui.core.training.rank import simulate_rank
from gpumem_gui.core.training.run_options import FrameworkName
from tests.conftest import reference_dir


@pytest.fixture(scope="module")
def qwen():
    return load_model(str(reference_dir() / "configs" / "Qwen__Qwen2.5-0.5B.json")).spec


def test_every_framework_has_a_profile_with_a_sourced_loss() -> None:
    assert set(PROFILES) == set(get_args(FrameworkName))
    for p in PROFILES.values():
        assert p.loss in p.losses and len(p.loss_source) > 20


@pytest.mark.parametrize(
    ("framework", "loss", "applied"),
    [
        ("pytorch", "standard", True),
        ("hf-trainer", "standard", True),
        ("torchtune", "chunked-linear", True),
        ("unsloth", "fused-linear", True),
        ("torchtitan", "standard", True),
    ],
)
def test_auto_loss_resolves_to_the_framework_default(framework: str, loss: str, applied: bool) -> None:
    r = resolve(make_training_run(framework=framework))
    assert r.loss == loss
    assert any(f"loss = {PROFILES[framework].loss}" in line for line in r.applied)


def test_a_chosen_loss_is_not_a_default_and_megatron_has_its_own() -> None:
    assert resolve(make_training_run(loss="standard")).applied == ()
    r = resolve(make_training_run(framework="megatron", precision="megatron-bf16", loss="standard"))
    assert r.loss == "vocab-parallel" and r.applied == ()
    assert resolve(make_training_run(framework="trl", loss="fused-linear")).loss == "fused-linear"


def test_unsloth_offloads_checkpointed_inputs_by_default() -> None:
    assert not resolve(make_training_run(framework="unsloth")).ckpt_offload
    r = resolve(make_training_run(framework="unsloth", grad_ckpt=True))
    assert r.ckpt_offload and any("Unsloth_Offloaded_Gradient_Checkpointer" in line for line in r.applied)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"optimizer_in_backward": True, "grad_accum": 2}, "optimizer_in_backward"),
        ({"framework": "torchtitan", "zero": 1, "dp": 2}, "zero"),
        ({"framework": "torchtitan", "activation_offload": True}, "activation_offload"),
        ({"framework": "hf-trainer", "loss": "chunked"}, "loss"),
        ({"framework": "hf-trainer", "optimizer_in_backward": True}, "optimizer_in_backward"),
        ({"framework": "megatron", "precision": "amp-bf16"}, "precision"),  # a precision given stays given
        ({"framework": "megatron", "precision": "megatron-bf16", "fsdp": "full_shard", "dp": 2}, "fsdp"),
        # torchtune ran FSDP1 up to v0.2 (tests/test_torchtune_2024.py); torchtitan never did
        ({"framework": "torchtitan", "fsdp": "full_shard", "dp": 2, "fsdp_version": 1}, "fsdp_version"),
        ({"ckpt_every": 2}, "ckpt_every"),
        ({"ckpt_policy": "selective-op"}, "ckpt_policy"),
        ({"optimizer_in_backward": True, "zero": 1, "dp": 2}, "optimizer_in_backward"),
    ],
)
def test_unsupported_combinations_name_the_field(qwen, fields: dict, field: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        estimate_training(qwen, make_training_run(**fields))
    assert e.value.field == field
    assert "\n" not in str(e.value)


def test_the_default_run_replays_as_before(qwen) -> None:
    """framework pytorch, loss auto, every trick off: the replay's config carries the neutral values."""
    cfg, _ = step_config(qwen, make_training_run())
    assert (cfg.loss, cfg.ckpt_every, cfg.ckpt_policy) == ("standard", 1, "full")
    assert not (cfg.activation_offload or cfg.offload_ckpt_inputs or cfg.float8 or cfg.compile)
    plain = estimate_training(qwen, make_training_run(batch=2, seq=256))
    explicit = estimate_training(
        qwen, make_training_run(batch=2, seq=256, framework="pytorch", loss="standard")
    )
    assert plain.peak_bytes == explicit.peak_bytes
    assert "framework" not in plain.facts  # the estimates before framework profiles, unchanged
    tt = estimate_training(qwen, make_training_run(batch=2, seq=256, framework="torchtune"))
    assert "LinearCrossEntropyLoss" in tt.facts["framework_defaults"]


def _peaks(spec, **fields) -> dict[str, int]:
    res, _, _ = simulate_rank(spec, make_training_run(method="lora", batch=2, seq=512, **fields))
    return {k: v.total for k, v in res.phases.items()}


def test_losses_order_as_their_sources_say(qwen) -> None:
    """Full logits > chunked output (all chunks' logits at once) > linear CE (one chunk's) > fused (none)."""
    fwd = {loss: _peaks(qwen, loss=loss)["forward"] for loss in ("standard", "chunked", "fused-linear")}
    tt = _peaks(qwen, framework="torchtune")["forward"]
    assert fwd["standard"] > fwd["chunked"] > tt > fwd["fused-linear"]


def test_liger_chunk_size_follows_its_formula() -> None:
    # fused_linear_cross_entropy.py: BT = 4096*4, V = 32000, H = 4096 -> inc_factor 8, chunk_size 2048
    assert liger_chunk_rows(4096 * 4, 32000, 4096) == 2048
    assert liger_chunk_rows(1000, 151936, 896) == 8  # cdiv(1000, 170) = 6 -> next power of two


def test_optimizer_in_backward_frees_every_gradient(qwen) -> None:
    run = make_training_run(batch=1, seq=256, optimizer_in_backward=True)
    res, _, _ = simulate_rank(qwen, run)
    base, _, _ = simulate_rank(qwen, make_training_run(batch=1, seq=256))
    assert res.grad_bytes == 0 and base.grad_bytes > 0
    assert res.phases["optimizer"].total == base.phases["optimizer"].total - base.grad_bytes - base.grad_bytes


def test_offload_reports_host_ram_and_lowers_the_forward(qwen) -> None:
    off = estimate_training(qwen, make_training_run(method="lora", batch=2, seq=512, activation_offload=True))
    on = estimate_training(qwen, make_training_run(method="lora", batch=2, seq=512))
    assert off.facts["activation_offload_host_bytes"] > 0
    assert off.facts["cpu_bytes"] >= off.facts["activation_offload_host_bytes"]
    assert off.phases["forward"].peak_bytes < on.phases["forward"].peak_bytes


def test_modelled_tricks_change_what_they_claim(qwen) -> None:
    base = _peaks(qwen)
    assert _peaks(qwen, compile=True)["forward"] < base["forward"]  # fused RMSNorm saves no fp32 copies
    f8 = _peaks(qwen, float8=True)
    assert f8["forward"] >= base["forward"] - 1  # same saved tensors, transient fp8 copies on top
    ck = _peaks(qwen, grad_ckpt=True)
    sel = _peaks(qwen, grad_ckpt=True, ckpt_policy="selective-op")
    every2 = _peaks(qwen, grad_ckpt=True, ckpt_every=2)
    assert ck["forward"] < sel["forward"] < base["forward"]
    assert ck["forward"] < every2["forward"] < base["forward"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"loss": "fused-linear"}, "loss"),
        ({"framework": "megatron", "precision": "megatron-bf16"}, "precision"),
        ({"float8": True}, "float8"),
        ({"compile": True}, "compile"),
        ({"framework": "unsloth", "loss": "standard", "grad_ckpt": True}, "grad_ckpt"),
        ({"activation_offload": True, "dp": 2}, "dp"),
    ],
)
def test_trace_refuses_what_torch_cannot_run_here(fields: dict, field: str) -> None:
    from gpumem_gui.trace.request import make_request

    model = load_model(str(reference_dir() / "configs" / "Qwen__Qwen2.5-0.5B.json"))
    with pytest.raises(GpumemInputError) as e:
        make_request(model, make_training_run(**fields))
    assert e.value.field == field


def test_trace_request_names_the_framework_loss() -> None:
    from gpumem_gui.trace.request import make_request

    model = load_model(str(reference_dir() / "configs" / "Qwen__Qwen2.5-0.5B.json"))
    assert make_request(model, make_training_run(framework="torchtune")).run["loss"] == "chunked-linear"
    assert make_request(model, make_training_run()).run["loss"] == "auto"


def test_selective_op_checkpointing_saves_float8_matmuls_like_mm() -> None:
    """torchtitan's op-level SAC sees a float8 linear as the ``aten.mm`` torchao dispatches on its float8
    subclass: on a bias-free Llama every second output is saved, as without float8 (only transient fp8
    copies on top)."""
    llama = load_model(str(reference_dir() / "configs" / "TinyLlama__TinyLlama-1.1B-Chat-v1.0.json")).spec
    fields = {"method": "full", "grad_ckpt": True, "ckpt_policy": "selective-op", "compile": True}
    bf16, _, _ = simulate_rank(llama, make_training_run(batch=2, seq=512, **fields))
    f8, _, _ = simulate_rank(llama, make_training_run(batch=2, seq=512, float8=True, **fields))
    assert f8.phases["forward"].total >= bf16.phases["forward"].total
    assert f8.phases["forward"].total - bf16.phases["forward"].total < 2**27  # the fp8 copies, not more


def test_torchtune_qlora_base_is_sharded_whole_under_fsdp2() -> None:
    """torchtune's NF4 base is torchao's NF4Tensor, whose FSDP2 all-gather inputs are its scalers, scale
    factors and packed data (nf4tensor.py fsdp_pre_all_gather): 4 ranks store a quarter each; bitsandbytes'
    quantization state stays whole on every rank."""
    llama = load_model(str(reference_dir() / "configs" / "meta-llama__Llama-3.2-1B.json")).spec
    stored = {}
    for fw in ("torchtune", "pytorch"):
        for dp in (1, 4):
            run = make_training_run(
                framework=fw, method="qlora", qlora_base="nf4-dq", precision="bf16", loss="standard",
                fsdp="full_shard", dp=dp, batch=1, seq=256,
            )  # fmt: skip
            stored[fw, dp] = simulate_rank(llama, run)[0].param_bytes
    # the adapters (rank 16 on every linear, unsharded here) are torchtune's bf16 against PEFT's fp32
    h, inter, kv = llama.hidden_size, llama.intermediate_size, llama.num_kv_heads * llama.head_dim
    per_layer = 16 * (2 * (h + h) + 2 * (h + kv) + 3 * (h + inter))
    adapters_bf16 = 2 * per_layer * llama.num_layers
    assert stored["torchtune", 1] + adapters_bf16 == stored["pytorch", 1]
    assert stored["torchtune", 1] == 4 * stored["torchtune", 4]
    assert stored["pytorch", 4] > stored["torchtune", 4]
