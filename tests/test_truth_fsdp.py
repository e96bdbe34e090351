"""The FSDP estimate against the stored FSDP2 ground truth (tests/reference/distributed/fsdp.json, made by
validation/truth_fsdp.py with PyTorch's FSDPMemTracker on rank 0 of a fake process group), and the FSDP
run checks."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from gpumem_gui.core import GpumemInputError, TrainingRun, load_model
from gpumem_gui.core.fit.tracked import CATEGORIES, traced_categories
from gpumem_gui.core.replay.step import simulate_step
from gpumem_gui.core.training import estimate_training
from gpumem_gui.core.training.rank import simulate_rank, step_config, step_options
from gpumem_gui.core.training.sharding import ShardingHooks

REF = Path(__file__).parent / "reference"
POINTS: list[dict[str, Any]] = json.loads((REF / "distributed" / "fsdp.json").read_text())["points"]
TOLERANCE = 0.03  # the issue's goal: every point within 3 % on the peak and on each phase


@cache
def _model(name: str) -> Any:
    return load_model(str(REF / "configs" / f"{name}.json"))


def _estimate(point: dict[str, Any], **change: Any) -> dict[str, dict[str, int]]:
    """The replay's phase peaks by tracker category for the point's run (``change``: fields changed)."""
    spec = _model(point["model"]).spec
    res, _, _ = simulate_rank(spec, TrainingRun(**{**point["run"], **change}))
    out = {}
    for name, pk in res.phases.items():
        kinds = pk.by_kind
        out[name] = {
            "parameters": kinds.get("param", 0) + kinds.get("buffer", 0),
            "gradients": kinds.get("grad", 0),
            "optimizer states": kinds.get("optstate", 0),
            "activations": kinds.get("act", 0) + kinds.get("input", 0),
            "temporaries": kinds.get("temp", 0),
        }
    return out


def _worst(point: dict[str, Any], est: dict[str, dict[str, int]]) -> float:
    """The largest relative error over the peak, each phase's total and each category (relative to the
    phase's total)."""
    traced = point["traced"]
    worst = 0.0
    for phase, snap in traced.items():
        total = snap["Total"]
        ours = est[phase]
        worst = max(worst, abs(sum(ours.values()) - total) / total)
        cats = traced_categories(snap)
        for c in CATEGORIES:
            worst = max(worst, abs(ours[c] - cats[c]) / total)
    t_peak = max(s["Total"] for s in traced.values())
    e_peak = max(sum(v.values()) for v in est.values())
    return max(worst, abs(e_peak - t_peak) / t_peak)


def test_the_grid_covers_what_the_issue_asks() -> None:
    runs = [p["run"] for p in POINTS]
    assert len({p["model"] for p in POINTS}) >= 3
    assert {"mp-bf16", "amp-bf16", "bf16"} <= {r.get("precision") for r in runs}
    assert {"full_shard", "shard_grad_op", "hybrid_shard"} <= {r["fsdp"] for r in runs}
    assert any(r.get("reshard_size") for r in runs)
    assert {True, False} <= {bool(r.get("grad_ckpt")) for r in runs}
    assert {2, 4, 8} <= {r["dp"] for r in runs}
    assert any(r.get("method") == "lora" for r in runs)
    for p in POINTS:
        assert p["versions"]["torch"] and p["seconds"] > 0


@pytest.mark.parametrize("point", POINTS, ids=[p["id"] for p in POINTS])
def test_estimate_matches_the_fsdp2_trace(point: dict[str, Any]) -> None:
    worst = _worst(point, _estimate(point))
    assert worst <= TOLERANCE, f"{point['id']}: off by {worst:.2%}"


def test_the_check_fails_on_a_wrong_model() -> None:
    """The comparison is sharp: the old model (FSDP1 semantics, root gathered all step) and amp-bf16 in
    place of mp-bf16 are each off by more than the tolerance on some stored point."""
    mp = [p for p in POINTS if p["run"].get("precision") == "mp-bf16" and p["run"].get("method") != "lora"]
    assert max(_worst(p, _estimate(p, precision="amp-bf16")) for p in mp) > TOLERANCE
    full = [p for p in POINTS if p["run"].get("precision") != "mp-bf16" and p["run"]["fsdp"] == "full_shard"]
    assert max(_worst(p, _estimate(p, fsdp_version=1)) for p in full) > TOLERANCE


def _run(**kw: Any) -> TrainingRun:
    return TrainingRun(**{"dp": 4, "fsdp": "full_shard", "batch": 1, "seq": 256, **kw})


def test_mp_bf16_needs_fsdp() -> None:
    spec = _model("Qwen__Qwen2.5-0.5B").spec
    with pytest.raises(GpumemInputError) as e:
        estimate_training(spec, TrainingRun(dp=4, precision="mp-bf16"))
    assert e.value.field == "precision" and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"reshard_size": 3}, "reshard_size"),
        ({"reshard_size": 2, "fsdp": "shard_grad_op"}, "reshard_size"),
        ({"reshard_size": 2, "fsdp_version": 1}, "reshard_size"),
    ],
)
def test_fsdp_run_checks(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        estimate_training(_model("Qwen__Qwen2.5-0.5B").spec, _run(**kw))
    assert e.value.field == field


def test_mp_bf16_stores_fp32_shards_and_computes_in_bf16() -> None:
    spec = _model("Qwen__Qwen2.5-0.5B").spec
    mp, _, _ = simulate_rank(spec, _run(precision="mp-bf16"))
    amp, _, _ = simulate_rank(spec, _run(precision="amp-bf16"))
    bf16, _, _ = simulate_rank(spec, _run(precision="bf16"))
    assert mp.param_bytes == amp.param_bytes == 2 * bf16.param_bytes  # fp32 shards
    assert mp.state_bytes == amp.state_bytes and mp.grad_bytes == amp.grad_bytes
    fwd = mp.phases["forward"].by_tag
    assert not fwd.get("weight copies") and amp.phases["forward"].by_tag["weight copies"] > 0
    assert fwd["gathered parameters"] * 2 == amp.phases["forward"].by_tag["gathered parameters"]


def test_cpu_offload_keeps_parameters_gradients_and_states_off_the_gpu() -> None:
    spec = _model("Qwen__Qwen2.5-0.5B").spec
    res, _, _ = simulate_rank(spec, _run(precision="mp-bf16", offload="optimizer+params"))
    assert res.param_bytes == res.grad_bytes == res.state_bytes == 0
    bw = res.phases["backward"].by_tag
    assert bw.get("gathered parameters", 0) + bw.get("all-gather buffers", 0) > 0


def test_qlora_base_is_sharded_under_fsdp() -> None:
    """bnb_4bit_quant_storage=bf16: the packed 4-bit weights are sharded with their layers (FSDP2 and
    FSDP1), the quantization state stays whole; with offload none of the packed weights stay."""
    spec = _model("meta-llama__Llama-3.2-1B").spec
    kw = {"method": "qlora", "precision": "bf16", "grad_ckpt": True}
    one, _, _ = simulate_rank(spec, TrainingRun(batch=1, seq=256, **kw))
    for version in (1, 2):
        eight, _, _ = simulate_rank(spec, _run(dp=8, fsdp_version=version, **kw))
        assert eight.param_bytes < one.param_bytes / 4
        off, _, _ = simulate_rank(spec, _run(dp=8, fsdp_version=version, offload="optimizer+params", **kw))
        assert off.param_bytes < eight.param_bytes


def test_fsdp1_keeps_the_old_model() -> None:
    """fsdp_version 1 replays ShardingHooks exactly as before (root gathered for the whole step)."""
    spec = _model("Qwen__Qwen2.5-0.5B").spec
    run = _run(fsdp_version=1, precision="amp-bf16")
    cfg, rspec = step_config(spec, run)
    sh = ShardingHooks(param_shard=4, grad_shard=4, gather="unit")
    old = simulate_step(rspec, cfg, run.optimizer, step_options(run), sh)
    new, _, _ = simulate_rank(spec, run)
    assert {k: v.total for k, v in old.phases.items()} == {k: v.total for k, v in new.phases.items()}
