"""What torchtune's recipes do differently from a plain PyTorch / PEFT run (issue 31, the torchtune
README's rows): FSDP2's root unit (embeddings, final norm, head) stays unsharded after forward
(``training.shard_model`` gives the root ``reshard_after_forward=False``; torch up to 2.7 kept every root
unsharded after forward),
where a plain ``fully_shard(model, reshard_after_forward=True)`` reshards it and regathers it at the loss
(torch >= 2.8); and LoRA adapters are built in the model's dtype, not PEFT's fp32."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay.step import StepResult, simulate_step
from gpumem_gui.core.training import estimate_training, make_training_run
from gpumem_gui.core.training.fsdp2 import ROOT, Fsdp2Hooks
from gpumem_gui.core.training.profiles import profile
from gpumem_gui.core.training.rank import sharding_hooks, step_config, step_options
from tests.conftest import REPO

SPEC = spec_from_config(
    json.loads((REPO / "tests/reference/extra/configs/synthetic__smollm3-tiny.json").read_text()),
    name="smollm3-tiny",
)
FIELDS = {"fsdp": "full_shard", "fsdp_version": 2, "dp": 4, "batch": 2, "seq": 64, "loss": "standard"}


def _step(framework: str, **kw: object) -> tuple[StepResult, Fsdp2Hooks]:
    run = make_training_run(framework=framework, **{**FIELDS, **kw})
    cfg, rspec = step_config(SPEC, run)
    hooks = sharding_hooks(run)
    assert isinstance(hooks, Fsdp2Hooks)
    return simulate_step(rspec, cfg, run.optimizer, step_options(run), hooks), hooks


def test_torchtune_keeps_the_root_unsharded_between_forward_and_backward() -> None:
    """After forward the torchtune rank holds the root's unsharded parameters (world x its shards, in the
    compute dtype) on top of what the plain fully_shard rank holds; the layers reshard alike."""
    plain, plain_hooks = _step("pytorch")
    tune, tune_hooks = _step("torchtune")
    assert plain_hooks.pol.root_reshard and not tune_hooks.pol.root_reshard
    root = tune_hooks.units[ROOT].full
    assert root == plain_hooks.units[ROOT].full > 0
    assert tune.after_forward - plain.after_forward == root
    # the step ends the same: the root is resharded at its post-backward either way
    assert tune.phases["optimizer"].total == plain.phases["optimizer"].total


@pytest.mark.parametrize("fw", ["pytorch", "torchtune"])
def test_shard_grad_op_keeps_every_unit_whatever_the_framework(fw: str) -> None:
    """reshard_after_forward=False everywhere: nothing is resharded after forward, the root included."""
    res, hooks = _step(fw, fsdp="shard_grad_op")
    assert hooks.pol.reshard == 0
    base, _ = _step("pytorch", fsdp="shard_grad_op")
    assert res.after_forward == base.after_forward


def test_the_profile_names_its_sources() -> None:
    from gpumem_gui.core.training.run import TrainingRun

    p = profile(TrainingRun(framework="torchtune"))
    assert not p.fsdp2_root_reshard and p.lora_model_dtype
    assert "_distributed.py" in p.fsdp2_root_reshard_source and "154704" in p.fsdp2_root_reshard_source
    assert "set_default_dtype" in p.lora_model_dtype_source
    plain = profile(TrainingRun())
    assert plain.fsdp2_root_reshard and not plain.lora_model_dtype


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_torchtune_builds_lora_adapters_in_the_model_dtype(method: str) -> None:
    """bf16 adapters: their AdamW states (two per parameter) take half the bytes of PEFT's fp32 ones, and the
    replay casts no input to fp32 for them."""
    run = {"method": method, "precision": "bf16", "batch": 1, "seq": 64, "loss": "standard"}
    peft = make_training_run(framework="pytorch", **run)
    tune = make_training_run(framework="torchtune", **run)
    assert step_config(SPEC, peft)[0].adapter_dt == "f32"
    assert step_config(SPEC, tune)[0].adapter_dt == "bf16"
    states = [estimate_training(SPEC, r).component("optimizer_states") for r in (peft, tune)]
    assert states[0] is not None and states[1] is not None
    assert states[1].bytes * 2 == states[0].bytes > 0


def test_fsdp_mixed_precision_keeps_adapters_like_the_base_for_every_framework() -> None:
    for fw in ("pytorch", "torchtune"):
        run = make_training_run(framework=fw, method="lora", precision="mp-bf16", fsdp="full_shard", dp=2)
        assert step_config(SPEC, run)[0].adapter_dt == "bf16", fw


def test_the_trace_request_asks_for_adapters_in_the_model_dtype() -> None:
    """The trace worker builds PEFT's adapters; for torchtune the request says to keep the base's dtype."""
    from gpumem_gui.core import load_model
    from gpumem_gui.trace.request import make_request
    from tests.conftest import reference_dir

    model = load_model(str(reference_dir() / "configs" / "Qwen__Qwen2.5-0.5B.json"))
    run = {"method": "lora", "batch": 1, "seq": 64}
    tune = make_request(model, make_training_run(framework="torchtune", **run)).run
    assert tune["lora_model_dtype"] is True
    assert "lora_model_dtype" not in make_request(model, make_training_run(**run)).run
    full = make_request(model, make_training_run(framework="torchtune", batch=1, seq=64)).run
    assert "lora_model_dtype" not in full
