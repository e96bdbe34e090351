"""Training estimates: accuracy against PyTorch-measured steps, structure, properties, bad input."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import load_config_file
from gpumem_gui.core.reference_points import training_run_for_point
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import count_params
from gpumem_gui.core.training import (
    estimate_training,
    make_training_run,
    simulate_rank,
)
from tests.conftest import REPO, reference_dir

EXTRA = REPO / "tests" / "reference" / "extra"
PHASES = ("forward", "backward", "optimizer")


def _config(name: str) -> Path:
    for d in (reference_dir() / "configs", EXTRA / "configs", REPO / "tests" / "reference" / "configs"):
        if (d / f"{name}.json").is_file():
            return d / f"{name}.json"
    raise FileNotFoundError(name)


@cache
def _spec(name: str) -> ModelSpec:
    return load_config_file(_config(name))


def _points() -> list[dict]:
    pts = json.loads((reference_dir() / "groundtruth.json").read_text())["grid"]
    pts += json.loads((EXTRA / "grid_train.json").read_text())["grid"]
    return [p for p in pts if p["mode"].startswith(("train", "lora")) and "peak_bytes" in p]


POINTS = _points()


def _id(p: dict) -> str:
    extra = f"-r{p['lora_rank']}" if "lora_rank" in p else ""
    extra += "-override" if p.get("config_override") else ""
    return f"{p['model']}-{p['mode']}-b{p['batch']}s{p['seq']}-{p['attn_implementation']}{extra}"


def _estimated(point: dict) -> tuple[int, dict[str, int]]:
    """(peak, phase peaks) for a measured point. Points measured with dropout on the CPU replay the CPU
    dropout
    kernel (a noise tensor of the input's dtype) instead of CUDA's bool mask, the estimator's default."""
    spec, run = _spec(point["model"]), training_run_for_point(point)
    if point.get("dropout_kernel") == "cpu":
        res, _, _ = simulate_rank(spec, run, cpu_dropout=True)
        phases = {ph: res.phases[ph].total for ph in PHASES}
        return max(phases.values()), phases
    est = estimate_training(spec, run)
    return est.peak_bytes, {ph: est.phases[ph].peak_bytes for ph in PHASES}


@pytest.mark.parametrize("point", POINTS, ids=[_id(p) for p in POINTS])
def test_peak_within_3_percent_and_phases_within_5(point: dict) -> None:
    peak, phases = _estimated(point)
    err = (peak - point["peak_bytes"]) / point["peak_bytes"]
    assert abs(err) < 0.03, f"peak {peak} vs measured {point['peak_bytes']} ({err:+.2%})"
    for ph in PHASES:
        meas = point["phase_peaks_bytes"][ph]["Total"]
        ours = phases[ph]
        assert abs(ours - meas) / meas < 0.05, (
            f"{ph}: {ours} vs measured {meas} ({(ours - meas) / meas:+.2%})"
        )


def test_every_reference_mode_is_covered() -> None:
    modes = {p["mode"] for p in POINTS}
    assert {"train_amp_adamw", "train_amp_adamw_gc", "train_bf16_adamw"} <= modes
    assert any(m.startswith("lora") for m in modes)


def test_optimizer_step_peaks_match_each_implementation(groundtruth: dict) -> None:
    """optimizer_step_peaks: foreach / fused / for_loop AdamW step peaks (+ the point's input ids)."""
    impl = {"foreach": "adamw-foreach", "fused": "adamw-fused", "for_loop": "adamw-for-loop"}
    for model, by_dtype in groundtruth["optimizer_step_peaks"].items():
        spec = _spec(model)
        for dtype, res in by_dtype.items():
            precision = "amp-bf16" if dtype == "float32" else "bf16"
            for name, opt in impl.items():
                est = estimate_training(spec, make_training_run(precision=precision, optimizer=opt, seq=16))
                ours = est.phases["optimizer"].peak_bytes - 16 * 8  # minus the input ids (not in that record)
                meas = res[name]["peak_bytes"]
                assert abs(ours - meas) / meas < 0.01, f"{model} {dtype} {name}: {ours} vs {meas}"


# ---- structure -------------------------------------------------------------------------------------------


def _small() -> ModelSpec:
    return _spec("Qwen__Qwen2.5-0.5B")


def test_components_add_up_and_explain() -> None:
    est = estimate_training(_small(), make_training_run(batch=2, seq=512, grad_accum=2))
    assert est.mode == "train"
    assert set(est.phases) == set(PHASES)
    for ph in est.phases.values():
        assert sum(c.bytes for c in ph.components) == ph.peak_bytes
        assert all(c.bytes >= 0 and c.explain.formula and c.explain.source for c in ph.components)
    assert est.peak_bytes == max(ph.peak_bytes for ph in est.phases.values())
    assert est.peak_phase == max(est.phases.values(), key=lambda p: p.peak_bytes).name
    assert sum(c.bytes for c in est.components) == est.total_bytes
    assert est.total_bytes > est.peak_bytes
    keys = {c.key for c in est.phases["optimizer"].components}
    assert {"parameters", "gradients", "optimizer_states", "optimizer_temporaries"} <= keys
    assert {"activations", "logits"} <= {c.key for c in est.phases["forward"].components}


def test_first_step_has_no_states_in_forward() -> None:
    steady = estimate_training(_small(), make_training_run(seq=512))
    first = estimate_training(_small(), make_training_run(seq=512, first_step=True))
    assert first.phases["forward"].component("optimizer_states") is None
    assert first.phases["forward"].peak_bytes < steady.phases["forward"].peak_bytes
    assert first.phases["optimizer"].peak_bytes == steady.phases["optimizer"].peak_bytes


def test_grad_accumulation_keeps_gradients_in_forward() -> None:
    one = estimate_training(_small(), make_training_run(seq=512))
    four = estimate_training(_small(), make_training_run(seq=512, grad_accum=4))
    grads = four.phases["forward"].component("gradients")
    assert grads is not None and grads.bytes == 494032768 * 4
    assert four.phases["forward"].peak_bytes == one.phases["forward"].peak_bytes + grads.bytes


def test_checkpointing_lowers_long_sequences() -> None:
    plain = estimate_training(_small(), make_training_run(batch=4, seq=2048))
    ckpt = estimate_training(_small(), make_training_run(batch=4, seq=2048, grad_ckpt=True))
    assert ckpt.peak_bytes < plain.peak_bytes


def test_optimizers_order_by_state_size() -> None:
    def opt_peak(opt: str) -> int:
        return (
            estimate_training(_small(), make_training_run(seq=128, optimizer=opt))
            .phases["optimizer"]
            .peak_bytes
        )

    assert opt_peak("sgd") < opt_peak("adamw-8bit") < opt_peak("adamw-fused") < opt_peak("adamw")
    assert opt_peak("sgd") < opt_peak("sgd-momentum") <= opt_peak("lion")
    assert opt_peak("adafactor") < opt_peak("adamw-fused")


def test_lora_and_qlora_are_much_smaller_than_full() -> None:
    spec = _spec("meta-llama__Llama-3.2-1B")
    full = estimate_training(spec, make_training_run(seq=1024))
    lora = estimate_training(spec, make_training_run(seq=1024, method="lora"))
    qlora = estimate_training(spec, make_training_run(seq=1024, method="qlora", precision="bf16"))
    qlora_dq = estimate_training(spec, make_training_run(seq=1024, method="qlora", qlora_base="nf4-dq"))
    assert qlora.peak_bytes < lora.peak_bytes < full.peak_bytes
    assert (
        qlora_dq.phases["optimizer"].peak_bytes
        < estimate_training(spec, make_training_run(seq=1024, method="qlora")).phases["optimizer"].peak_bytes
    )
    assert lora.facts["trainable_params"] < full.facts["trainable_params"] // 50


def test_megatron_keeps_fp32_main_grads_and_master() -> None:
    est = estimate_training(_small(), make_training_run(seq=128, precision="megatron-bf16"))
    n = 494032768
    opt = est.phases["optimizer"]
    assert opt.component("gradients").bytes == 4 * n  # type: ignore[union-attr]
    assert opt.component("optimizer_states").bytes == 12 * n  # type: ignore[union-attr]


def test_offload_reports_cpu_memory() -> None:
    est = estimate_training(_small(), make_training_run(seq=256, zero=2, dp=4, offload="optimizer"))
    assert est.facts["cpu_bytes"] and est.facts["cpu_bytes"] > 0
    assert est.phases["optimizer"].component("optimizer_states") is None
    both = estimate_training(_small(), make_training_run(seq=256, zero=3, dp=4, offload="optimizer+params"))
    assert both.facts["cpu_bytes"] > est.facts["cpu_bytes"]  # type: ignore[operator]
    assert both.peak_bytes < est.peak_bytes


def test_parallel_splits_give_per_rank_table() -> None:
    spec = _spec("meta-llama__Llama-3.2-1B")
    one = estimate_training(spec, make_training_run(seq=1024))
    tp = estimate_training(spec, make_training_run(seq=1024, tp=2))
    pp = estimate_training(spec, make_training_run(seq=1024, pp=2, grad_accum=4))
    cp = estimate_training(spec, make_training_run(seq=1024, cp=2))
    assert len(tp.per_gpu) == 2 and len(pp.per_gpu) == 2
    assert (
        tp.peak_bytes < one.peak_bytes and pp.peak_bytes < one.peak_bytes and cp.peak_bytes <= one.peak_bytes
    )
    assert pp.facts["gpus"] == 2 and tp.facts["gpus"] == 2


def test_expert_parallel_splits_experts() -> None:
    spec = _spec("Qwen__Qwen3-30B-A3B")
    one = estimate_training(spec, make_training_run(seq=256, dp=8, zero=1))
    ep = estimate_training(spec, make_training_run(seq=256, dp=8, zero=1, ep=8))
    assert ep.peak_bytes < one.peak_bytes / 3


# ---- properties --------------------------------------------------------------------------------------------

_FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _tiny() -> ModelSpec:
    """Qwen3-0.6B's layer shapes with 3 layers and a 4096-token vocabulary: fast enough for property tests."""
    return _spec("Qwen__Qwen3-0.6B").model_copy(update={"num_layers": 3, "vocab_size": 4096})


@_FAST
@given(
    method=st.sampled_from(["full", "lora", "qlora"]),
    precision=st.sampled_from(["amp-bf16", "bf16", "fp32"]),
    optimizer=st.sampled_from(["adamw", "adamw-fused", "adamw-8bit", "adafactor", "sgd-momentum", "lion"]),
    batch=st.integers(1, 4),
    seq=st.integers(1, 512),
    ckpt=st.booleans(),
    attn=st.sampled_from(["sdpa", "eager"]),
)
def test_components_non_negative_and_add_up(
    method: str, precision: str, optimizer: str, batch: int, seq: int, ckpt: bool, attn: str
) -> None:
    run = make_training_run(
        method=method,
        precision=precision,
        optimizer=optimizer,
        batch=batch,
        seq=seq,
        grad_ckpt=ckpt,
        attn=attn,
    )
    est = estimate_training(_tiny(), run)
    for ph in est.phases.values():
        assert all(c.bytes >= 0 for c in ph.components)
        assert sum(c.bytes for c in ph.components) == ph.peak_bytes
    assert sum(c.bytes for c in est.components) == est.total_bytes
    assert est.peak_bytes == max(ph.peak_bytes for ph in est.phases.values())
    for g in est.per_gpu:
        assert sum(c.bytes for c in g.components) == g.total_bytes


@_FAST
@given(
    method=st.sampled_from(["full", "lora"]),
    batch=st.integers(1, 3),
    seq=st.integers(1, 384),
    ckpt=st.booleans(),
    attn=st.sampled_from(["sdpa", "eager"]),
)
def test_memory_never_falls_as_batch_or_seq_grows(
    method: str, batch: int, seq: int, ckpt: bool, attn: str
) -> None:
    def peak(b: int, s: int) -> int:
        run = make_training_run(method=method, batch=b, seq=s, grad_ckpt=ckpt, attn=attn)
        return estimate_training(_tiny(), run).peak_bytes

    base = peak(batch, seq)
    assert peak(batch + 1, seq) >= base
    assert peak(batch, seq + 17) >= base


@_FAST
@given(rank=st.integers(1, 64), method=st.sampled_from(["lora", "qlora"]), seq=st.integers(1, 256))
def test_memory_never_falls_as_lora_rank_grows(rank: int, method: str, seq: int) -> None:
    def peak(r: int) -> int:
        return estimate_training(_tiny(), make_training_run(method=method, lora_rank=r, seq=seq)).peak_bytes

    assert peak(rank + 1) >= peak(rank)
    assert peak(2 * rank) >= peak(rank)


@_FAST
@given(
    dp=st.sampled_from([2, 4, 8]),
    optimizer=st.sampled_from(["adamw", "adamw-fused", "sgd", "adafactor"]),
    seq=st.integers(1, 256),
    method=st.sampled_from(["full", "lora"]),
)
def test_sharding_never_raises_per_gpu_memory(dp: int, optimizer: str, seq: int, method: str) -> None:
    """Over two or more ranks each ZeRO stage holds at most what the one below it holds, and more ranks never
    hold more per GPU. DeepSpeed's fixed buffers are made small here (its 5e8-element reduce bucket alone
    outweighs a tiny model: deepspeed/runtime/zero/stage_1_and_2.py, ipg buffer); FSDP2 copies every unit
    it gathers, so it is only compared with itself and, for a full fine-tune over 4+ ranks, with DDP. Live
    tensors (the allocator model's reserve follows segments, not shards)."""

    def est(**kw: object) -> int:
        run = make_training_run(
            seq=seq,
            optimizer=optimizer,
            method=method,
            reduce_bucket=1000,
            prefetch_bucket=0,
            persistence_threshold=0,
            allocator_model=False,
            **kw,  # type: ignore[arg-type]
        )
        return estimate_training(_tiny(), run).peak_bytes

    stages = [est(zero=z, dp=dp) for z in (0, 1, 2, 3)]
    # Adafactor factors only >= 2-D tensors (transformers/optimization.py Adafactor._get_options): DeepSpeed
    # hands it one flat 1-D partition (stage_1_and_2.py: param_group['params'] = [single_partition_of_fp32_
    # groups[i]]), whose full fp32 second moment can outweigh unsharded factored states over few ranks
    compared = stages[1:] if optimizer == "adafactor" else stages
    assert compared == sorted(compared, reverse=True), stages
    for z in (1, 2, 3):
        assert est(zero=z, dp=2 * dp) <= est(zero=z, dp=dp)
    fsdp = [est(fsdp="shard_grad_op", dp=dp), est(fsdp="full_shard", dp=dp)]
    assert fsdp[1] <= fsdp[0]
    if method == "full" and dp >= 4:
        assert fsdp[1] <= stages[0]


# ---- bad input ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"lora_rank": 0}, "lora_rank"),
        ({"method": "qlora", "qlora_base": "fp4"}, "qlora_base"),  # bnb fp4 is not a modelled base
        ({"method": "qlora", "qlora_base": "gptq-4bit"}, "qlora_base"),
        ({"dp": 2, "tp": 2, "gpus": 6}, "gpus"),
        ({"precision": "megatron-bf16", "optimizer": "adamw-8bit"}, "optimizer"),
        ({"precision": "megatron-bf16", "optimizer": "lion"}, "optimizer"),
        ({"optimizer": "adam-9bit"}, "optimizer"),
        ({"batch": 0}, "batch"),
        ({"zero": 4}, "zero"),
        ({"zero": 2, "fsdp": "full_shard"}, "fsdp"),
        ({"offload": "optimizer"}, "offload"),
        ({"seq": -3}, "seq"),
        ({"lora_dropout": 1.5}, "lora_dropout"),
        ({"unknown_knob": 1}, "unknown_knob"),
    ],
)
def test_bad_run_names_the_field(fields: dict, field: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        make_training_run(**fields)
    assert e.value.field == field
    assert field in str(e.value)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"method": "lora", "lora_targets": "c_attn,c_fc"}, "lora_targets"),
        ({"method": "lora", "lora_targets": "q_proj,dense"}, "lora_targets"),
        ({"tp": 3}, "tp"),
        ({"pp": 1000}, "pp"),
        ({"ep": 2, "dp": 2}, "ep"),
        ({"frozen_layers": 99}, "frozen_layers"),
        ({"method": "lora", "precision": "megatron-bf16"}, "precision"),
        ({"attn": "flash", "precision": "fp32"}, "attn"),
        ({"offload": "optimizer+params", "zero": 2, "dp": 2}, "offload"),
    ],
)
def test_bad_run_for_model_names_the_field(fields: dict, field: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        estimate_training(_small(), make_training_run(**fields))
    assert e.value.field == field


def test_zero_with_one_gpu_is_allowed_and_explained() -> None:
    """With one rank every stage shards nothing: the same states; DeepSpeed still runs its 16-bit model
    with fp32 master weights (deepspeed/runtime/engine.py, _configure_zero_optimizer), so it is not the plain
    fp32 + autocast step."""
    ests = [estimate_training(_small(), make_training_run(seq=128, zero=z)) for z in (1, 2, 3)]
    assert len({e.facts["optimizer_state_bytes"] for e in ests}) == 1
    for e in ests:
        assert any("nothing to shard" in w for w in e.warnings)


def test_lora_alpha_has_no_memory_effect() -> None:
    a = estimate_training(_small(), make_training_run(method="lora", lora_alpha=8, seq=128))
    b = estimate_training(_small(), make_training_run(method="lora", lora_alpha=256, seq=128))
    assert a.peak_bytes == b.peak_bytes


def test_a_text_step_keeps_no_optimizer_state_for_the_vision_tower() -> None:
    """torch's optimizers skip parameters without a gradient (the vision tower in a text step; traced in
    tests/test_trace.py); DeepSpeed's flat fp32 partitions hold states for every trainable parameter."""
    spec = load_config_file(REPO / "resources" / "configs" / "google__gemma-3-4b-it.json")
    assert spec.vision is not None
    n = spec.vision.params
    plain = estimate_training(spec, make_training_run(seq=256)).facts["optimizer_state_bytes"]
    flat = estimate_training(spec, make_training_run(seq=256, zero=1)).facts["optimizer_state_bytes"]
    total = count_params(spec).total
    text_only = plain // (total - n)  # bytes of state per trained parameter
    assert text_only * (total - n) == plain  # torch: the text model's parameters only
    assert flat % total == 0 and flat // total >= text_only  # DeepSpeed: every parameter (+ fp32 master)
