"""Issue 31 item 4: DeepSpeed ZeRO hands the wrapped torch optimizer one flat fp32 tensor per parameter group
(stages 1/2: ``stage_1_and_2.py`` ``param_group['params'] = [single_partition_of_fp32_groups[i]]``) or per
sub-group (stage 3: ``stage3.py`` ``_optimizer_step``), so a torch AdamW step makes its temporaries over the
whole partition, one partition at a time with its own fp32 gradient; fused kernels make none, and torch's
ZeroRedundancyOptimizer keeps the parameters' own tensors.
"""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.step import StepOptions, simulate_step
from gpumem_gui.core.training import make_training_run
from gpumem_gui.core.training.frameworks.deepspeed import SUB_GROUP, FlatPartitions
from gpumem_gui.core.training.rank import simulate_rank
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "reference" / "extra" / "configs"
TEMP = "optimizer temporaries"
FP32_GRAD = "fp32 gradient partition"


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    name = "synthetic__smollm3-tiny"
    return spec_from_config(json.loads((CONFIGS / f"{name}.json").read_text()), name=name)


def _opt_peak(spec, **fields):  # type: ignore[no-untyped-def]
    run = make_training_run(batch=1, seq=64, **fields)
    res = simulate_rank(spec, run)[0]
    return res, res.phases["optimizer"].by_tag


def _partition(n: int, dp: int) -> int:
    """Stages 1/2: the group padded to a multiple of 2 x dp (nccl_start_alignment_factor), then / dp."""
    return -(-n // (2 * dp)) * 2


def test_stage_1_2_partition_is_the_padded_flat_group_over_dp() -> None:
    class P:
        def __init__(self, numel: int) -> None:
            self.numel = numel

    params = [P(10), P(7)]  # 17 elements: padded to 24 over 4 ranks (alignment 2 x 4) -> 6 each
    assert FlatPartitions(4)(params) == [6]  # type: ignore[arg-type]
    assert FlatPartitions(1)(params) == [18]  # type: ignore[arg-type]
    assert FlatPartitions(4)([]) == []


def test_stage_3_sub_groups_cut_once_they_reach_sub_group_size() -> None:
    class P:
        def __init__(self, numel: int) -> None:
            self.numel = numel

    # partitions over 4 ranks: ceil(numel / 4) = 3, 5, 2, 4; cut when the running sum reaches 6
    params = [P(10), P(17), P(8), P(13)]
    assert FlatPartitions(4, 6)(params) == [8, 6]  # type: ignore[arg-type]
    assert FlatPartitions(4, 100)(params) == [14]  # type: ignore[arg-type]  # one sub-group, the last param


@pytest.mark.parametrize("dp", [3, 4])  # 3: the tiny model's 27,660,800 elements need padding to 2 x 3
@pytest.mark.parametrize("zero", [1, 2])
@pytest.mark.parametrize(("optimizer", "copies"), [("adamw-for-loop", 2), ("adamw-foreach", 1), ("lion", 2)])
def test_stage_1_2_temporaries_are_over_the_flat_fp32_partition(tiny, zero, optimizer, copies, dp) -> None:  # type: ignore[no-untyped-def]
    res, tags = _opt_peak(tiny, framework="deepspeed", zero=zero, dp=dp, optimizer=optimizer)
    part = _partition(res.trainable_params, dp)
    assert tags[TEMP] == copies * 4 * part  # fp32: the master partition's dtype
    assert tags[FP32_GRAD] == 4 * part


def test_stage_3_steps_one_sub_group_at_a_time(tiny) -> None:  # type: ignore[no-untyped-def]
    """The replay with sub-groups small enough to cut the tiny model: the optimizer peak holds the largest
    sub-group's fp32 gradient and temporaries, never two sub-groups at once."""
    run = make_training_run(batch=1, seq=64, framework="deepspeed", zero=3, dp=4, optimizer="adamw-for-loop")
    res = simulate_rank(tiny, run)[0]
    one = res.phases["optimizer"].by_tag
    part = sum(-(-n // 4) for n in _numels(tiny, run))
    assert part < SUB_GROUP  # the default: one sub-group holding the whole partition
    assert one[TEMP] == 2 * 4 * part and one[FP32_GRAD] == 4 * part
    cfg = ReplayConfig(batch=1, q=64, param_dt="bf16", autocast=None)
    cut = part // 3
    groups = FlatPartitions(4, cut)
    opts = StepOptions(state_shard=4, master_bytes_per_param=4, flat_grad_bytes=4, states_for_unused=True)
    whole = simulate_step(tiny, cfg, "adamw-for-loop", _with(opts, FlatPartitions(4, SUB_GROUP)))
    split = simulate_step(tiny, cfg, "adamw-for-loop", _with(opts, groups))
    sizes = groups(_params(tiny, cfg))
    assert len(sizes) > 1 and sum(sizes) == part
    tags = split.phases["optimizer"].by_tag
    assert tags[TEMP] == 2 * 4 * max(sizes) and tags[FP32_GRAD] == 4 * max(sizes)
    assert whole.phases["optimizer"].by_tag[TEMP] == 2 * 4 * part
    assert split.phases["optimizer"].total < whole.phases["optimizer"].total


def _with(opts: StepOptions, flat: FlatPartitions) -> StepOptions:
    from dataclasses import replace

    return replace(opts, flat_partitions=flat)


def _params(spec, cfg):  # type: ignore[no-untyped-def]
    """The trainable parameters the replay steps, in order (recorded by a FlatPartitions that keeps them)."""
    seen: list = []

    class Keep(FlatPartitions):
        def __call__(self, params):  # type: ignore[no-untyped-def]
            seen.extend(params)
            return super().__call__(params)

    simulate_step(
        spec,
        cfg,
        "adamw-for-loop",
        StepOptions(
            state_shard=4, master_bytes_per_param=4, states_for_unused=True, flat_partitions=Keep(4, 0)
        ),
    )
    return seen


def _numels(spec, run):  # type: ignore[no-untyped-def]
    cfg = ReplayConfig(batch=1, q=64, param_dt="bf16", autocast=None)
    return [p.numel for p in _params(spec, cfg)]  # the stepped parameters do not depend on dp


def test_fused_optimizers_make_no_temporaries_over_the_partition(tiny) -> None:  # type: ignore[no-untyped-def]
    """FusedAdam-style kernels update in place; the step's peak is then the cast of the flattened 16-bit
    gradient partition (torch.cat of its views) to fp32, both live for the cast (stage_1_and_2.py step:
    flatten(averaged_gradients[i]).to(fp32); stage3.py _prepare_fp32_grad_for_sub_group)."""
    for zero in (1, 2, 3):
        res, tags = _opt_peak(tiny, framework="deepspeed", zero=zero, dp=4, optimizer="adamw-fused")
        assert TEMP not in tags or tags[TEMP] == 0, zero
        part = (
            _partition(res.trainable_params, 4) if zero < 3 else sum(-(-k // 4) for k in _numels(tiny, None))
        )
        assert tags[FP32_GRAD] == (2 + 4) * part, zero  # the bf16 copy and its fp32 cast


def test_an_fp32_model_casts_without_a_copy(tiny) -> None:  # type: ignore[no-untyped-def]
    res, tags = _opt_peak(
        tiny, framework="deepspeed", zero=2, dp=4, optimizer="adamw-fused", precision="fp32"
    )
    assert tags[FP32_GRAD] == 4 * _partition(res.trainable_params, 4)  # flatten's copy is the fp32 tensor


def test_torch_zero_keeps_the_parameters_tensors(tiny) -> None:  # type: ignore[no-untyped-def]
    """ZeroRedundancyOptimizer wraps the parameters this rank owns, whole: the for-loop step's temporaries
    are the largest owned parameter's, twice (torch/distributed/optim/zero_redundancy_optimizer.py
    _partition_parameters; torch/optim/adam.py _single_tensor_adam)."""
    run = make_training_run(batch=1, seq=64, zero=1, dp=4, zero_impl="torch", optimizer="adamw-for-loop")
    res = simulate_rank(tiny, run)[0]
    tags = res.phases["optimizer"].by_tag
    assert FP32_GRAD not in tags
    # the tiny model's largest parameter (its embedding) in the run's fp32 master-less dtype, twice
    assert tags[TEMP] == 2 * 4 * tiny.vocab_size * tiny.hidden_size


@pytest.mark.parametrize("dp", [3, 4])
@pytest.mark.parametrize("zero", [1, 2, 3])
def test_states_are_made_on_the_flat_partition(tiny, zero, dp) -> None:  # type: ignore[no-untyped-def]
    """AdamW: exp_avg + exp_avg_sq + the fp32 master, 12 B per partition element; Adafactor on a 1-D tensor
    keeps a full fp32 second moment (transformers/optimization.py Adafactor._get_options: factored only for
    >= 2 dimensions), 4 + 4 B per element with the master."""
    for optimizer, per_element in (("adamw", 12), ("adafactor", 8)):
        res, _ = _opt_peak(tiny, framework="deepspeed", zero=zero, dp=dp, optimizer=optimizer)
        n = res.trainable_params
        part = _partition(n, dp) if zero < 3 else None
        if part is None:
            part = sum(-(-k // dp) for k in _numels(tiny, None))
        assert res.state_bytes == per_element * part, optimizer


def test_adafactor_keeps_its_factored_states_without_deepspeed(tiny) -> None:  # type: ignore[no-untyped-def]
    flat, _ = _opt_peak(tiny, framework="deepspeed", zero=2, dp=4, optimizer="adafactor")
    torch, _ = _opt_peak(tiny, zero=1, dp=4, zero_impl="torch", optimizer="adafactor")
    assert torch.state_bytes < flat.state_bytes  # row + column factors, not a full second moment


def _ds_config(tmp_path, optimizer: dict) -> object:  # type: ignore[no-untyped-def]
    from gpumem_gui.core import import_file

    p = tmp_path / "ds_config.json"
    p.write_text(json.dumps({"zero_optimization": {"stage": 2}, "optimizer": optimizer}))
    return import_file(str(p))


def test_a_deepspeed_config_optimizer_section_is_deepspeeds_fusedadam(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """DeepSpeed builds the config's Adam/AdamW as FusedAdam (no step temporaries), torch's AdamW with
    params.torch_adam (deepspeed/runtime/engine.py _configure_basic_optimizer); other types are named."""
    imp = _ds_config(tmp_path, {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.0}})
    assert imp.run.optimizer == "adamw-fused"  # type: ignore[attr-defined]
    assert any("FusedAdam" in meaning for _, meaning in imp.read_as)  # type: ignore[attr-defined]
    imp = _ds_config(tmp_path, {"type": "Adam", "params": {"torch_adam": True}})
    assert imp.run.optimizer == "adamw"  # type: ignore[attr-defined]
    imp = _ds_config(tmp_path, {"type": "Lamb", "params": {"lr": 1e-3}})
    assert imp.run.optimizer == "adamw"  # type: ignore[attr-defined]
    assert any("optimizer.type" in w for w in imp.warnings)  # type: ignore[attr-defined]
    imp = _ds_config(tmp_path, {"type": "AdamW", "params": {"amsgrad": True}})
    assert any("amsgrad" in w for w in imp.warnings)  # type: ignore[attr-defined]  # a state gpumem does not add


def test_the_temporaries_explanation_names_the_flat_partition(tiny) -> None:  # type: ignore[no-untyped-def]
    from gpumem_gui.core.training.explain import components

    def explained(**fields):  # type: ignore[no-untyped-def]
        run = make_training_run(batch=1, seq=64, optimizer="adamw-for-loop", **fields)
        res, cfg, rspec = simulate_rank(tiny, run)
        comps = components(res.phases["optimizer"].by_tag, run, res, cfg, rspec, "optimizer step")
        return next(c.explain for c in comps if c.key == "optimizer_temporaries")

    ds = explained(framework="deepspeed", zero=2, dp=4)
    assert "single_partition_of_fp32_groups" in ds.source and "flat fp32 tensor" in ds.formula
    torch = explained(zero=1, dp=4, zero_impl="torch")
    assert "single_partition_of_fp32_groups" not in torch.source
