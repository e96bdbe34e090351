"""FSDP2's root unit (embeddings, final norm, head) after forward: resharded and regathered at the loss when
``fully_shard(model, reshard_after_forward=True)`` is honoured (torch >= 2.8), kept unsharded by torchtune
(``training.shard_model`` gives the root ``reshard_after_forward=False``; torch up to 2.7 kept every root
unsharded after forward). Issue 31: the torchtune README's 405B QLoRA and 70B LoRA rows."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay.step import StepResult, simulate_step
from gpumem_gui.core.training import make_training_run
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


def test_the_profile_names_its_source() -> None:
    from gpumem_gui.core.training.run import TrainingRun

    p = profile(TrainingRun(framework="torchtune"))
    assert not p.fsdp2_root_reshard
    assert "_distributed.py" in p.fsdp2_root_reshard_source and "154704" in p.fsdp2_root_reshard_source
