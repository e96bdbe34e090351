"""FSDP2 units of their own for the embedding and the head (``fsdp_units``; torchtune's
``custom_sharded_layers: ['tok_embeddings', 'output']``, torchtune/training/_distributed.py shard_model):
each gathered only around its own forward calls and backward, the root keeping the rest. Hand-computed live
bytes on a scaled-down untied model; the traced points are in tests/reference/distributed/fsdp.json."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core import GpumemInputError
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay.step import StepResult, simulate_step
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training import estimate_training, make_training_run
from gpumem_gui.core.training.fsdp2 import OWN_UNITS, ROOT, Fsdp2Hooks
from gpumem_gui.core.training.profiles import fsdp2_units, resolve
from gpumem_gui.core.training.rank import sharding_hooks, step_config, step_options
from tests.conftest import REPO

CONFIG = json.loads((REPO / "tests/reference/extra/configs/synthetic__smollm3-tiny.json").read_text())
TIED = spec_from_config(CONFIG, name="smollm3-tiny")
UNTIED = spec_from_config({**CONFIG, "tie_word_embeddings": False}, name="smollm3-tiny-untied")
FIELDS = {"fsdp": "full_shard", "fsdp_version": 2, "dp": 4, "batch": 2, "seq": 64, "loss": "standard"}
EMB, HEAD = OWN_UNITS["embedding"], OWN_UNITS["head"]


def _step(spec: ModelSpec, framework: str, **kw: object) -> tuple[StepResult, Fsdp2Hooks]:
    run = make_training_run(framework=framework, **{**FIELDS, **kw})
    cfg, rspec = step_config(spec, run)
    hooks = sharding_hooks(run)
    assert isinstance(hooks, Fsdp2Hooks)
    return simulate_step(rspec, cfg, run.optimizer, step_options(run), hooks), hooks


def test_the_embedding_and_the_head_are_units_of_their_own() -> None:
    """Each unit is world x its padded shards in the compute dtype (fp32 under amp-bf16): vocab x hidden x
    4 B; the root keeps the final norm alone."""
    _, hooks = _step(UNTIED, "torchtune", fsdp_units="embedding+head")
    v, h = UNTIED.vocab_size, UNTIED.hidden_size
    assert hooks.units[EMB].full == hooks.units[HEAD].full == v * h * 4
    assert hooks.units[ROOT].full == h * 4
    _, emb_only = _step(UNTIED, "torchtune", fsdp_units="embedding")
    assert HEAD not in emb_only.units and emb_only.units[ROOT].full == v * h * 4 + h * 4


def test_torchtune_no_longer_holds_them_from_forward_to_backward() -> None:
    """torchtune keeps the root gathered after forward; with both sharded apart (and resharded after their
    own forward, as the layers are) the rank holds exactly the two units less when backward starts."""
    root, _ = _step(UNTIED, "torchtune", fsdp_units="layers")
    apart, hooks = _step(UNTIED, "torchtune", fsdp_units="embedding+head")  # the Llama 3.x full configs'
    assert hooks.pol.own_modules == {"embedding", "head"}
    assert root.after_forward - apart.after_forward == hooks.units[EMB].full + hooks.units[HEAD].full
    # the step's end is the same: every unit is resharded by its post-backward either way
    assert apart.phases["optimizer"].total == root.phases["optimizer"].total
    for phase in ("forward", "backward"):
        assert apart.phases[phase].total < root.phases[phase].total


@pytest.mark.parametrize("loss", ["chunked", "chunked-output"])
def test_the_head_is_gathered_per_call_of_the_chunked_losses(loss: str) -> None:
    """torchtune's chunked losses call the head once per chunk: it is gathered for each call and resharded
    after it, so after forward nothing of it is held (the root's norm is)."""
    res, hooks = _step(UNTIED, "torchtune", loss=loss, fsdp_units="embedding+head")
    assert hooks.order.count(HEAD) == 8 and HEAD not in hooks.unsharded
    base, _ = _step(UNTIED, "torchtune", loss=loss, fsdp_units="layers")
    assert base.after_forward - res.after_forward == hooks.units[EMB].full + hooks.units[HEAD].full


def test_a_tied_head_keeps_both_in_the_root() -> None:
    """A head tied to the embedding reads its weight (torchtune's TiedLinear is no module): the default keeps
    both in the root, byte for byte as before; asking for them apart is refused."""
    auto, hooks = _step(TIED, "torchtune")
    assert fsdp2_units(make_training_run(framework="torchtune", **FIELDS)) == "layers"
    assert EMB not in hooks.units and HEAD not in hooks.units
    layers, _ = _step(TIED, "torchtune", fsdp_units="layers")
    assert auto.phases == layers.phases
    with pytest.raises(GpumemInputError) as e:
        estimate_training(TIED, make_training_run(framework="torchtune", **FIELDS, fsdp_units="embedding"))
    assert e.value.field == "fsdp_units"


@pytest.mark.parametrize(
    ("fields", "units"),
    [
        ({"framework": "torchtune"}, "layers"),  # the recipe's default: custom_sharded_layers None
        ({"framework": "torchtune", "method": "lora"}, "layers"),
        ({"framework": "pytorch"}, "layers"),
        ({"framework": "torchtitan", "precision": "mp-bf16"}, "layers"),
        ({"framework": "torchtune", "fsdp_version": 1}, "layers"),
        ({"framework": "pytorch", "fsdp_units": "embedding"}, "embedding"),
    ],
)
def test_the_default_is_the_framework_s_for_the_recipe(fields: dict[str, object], units: str) -> None:
    run = make_training_run(**{**FIELDS, **fields})
    assert fsdp2_units(run) == units
    applied = [a for a in resolve(run).applied if "FSDP2 units" in a]
    assert bool(applied) == (run.fsdp_units == "auto" and units != "layers")
    assert all("custom_sharded_layers" in a and "70B_full.yaml" in a for a in applied)


@pytest.mark.parametrize("fields", [{"fsdp": "none", "dp": 1}, {"fsdp_version": 1}])
def test_units_apart_need_fsdp2(fields: dict[str, object]) -> None:
    run = make_training_run(**{**FIELDS, **fields, "fsdp_units": "embedding+head"})
    with pytest.raises(GpumemInputError) as e:
        estimate_training(UNTIED, run)
    assert e.value.field == "fsdp_units"


def test_the_trace_request_names_the_resolved_units() -> None:
    from gpumem_gui.core import load_model
    from gpumem_gui.trace.request import make_request
    from tests.conftest import reference_dir

    model = load_model(str(reference_dir() / "configs" / "TinyLlama__TinyLlama-1.1B-Chat-v1.0.json"))
    run = make_training_run(**{**FIELDS, "fsdp_units": "embedding"})
    assert make_request(model, run).run["fsdp_units"] == "embedding"
    assert make_request(model, make_training_run(**FIELDS)).run["fsdp_units"] == "layers"
