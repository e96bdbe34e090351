"""The distributed and framework levers of the training fit: offered where they apply, each re-estimated, and
listed only when the core accepts the change and it lowers the most-loaded rank's memory."""

from __future__ import annotations

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.fit import GpuTarget
from gpumem_gui.core.fit.levers import levers
from gpumem_gui.core.fit.training import MIN_SAVING, fit_training
from gpumem_gui.core.readers.catalog import find_gpu
from gpumem_gui.core.readers.hf_config import load_config_file
from gpumem_gui.core.training import TrainingRun, estimate_training, make_training_run
from tests.conftest import reference_dir

SPEC = load_config_file(reference_dir() / "configs" / "meta-llama__Llama-3.2-1B.json")


def target(name: str, count: int = 1) -> GpuTarget:
    g = find_gpu(name)
    return GpuTarget(name=g.id, capacity_bytes=g.memory_bytes, count=count)


def updates(run: TrainingRun) -> dict[str, dict[str, object]]:
    """The levers that apply to ``run``, by what they change (the first field of the update)."""
    out = {}
    for _rank, _kind, _desc, upd in levers(run):
        field, value = next(iter(upd.items()))
        out[f"{field}={value}"] = upd
    return out


def test_each_lever_applies_where_its_setting_can_change() -> None:
    plain = updates(make_training_run())
    assert not {"precision=mp-bf16", "fsdp=full_shard", "sequence_parallel=True", "pp_schedule=1f1b"} & set(
        plain
    )
    assert {"optimizer=paged-adamw-8bit", "loss=chunked", "loss=fused-linear"} <= set(plain)
    assert {"activation_offload=True", "optimizer_in_backward=True", "grad_ckpt=True", "cp=2"} <= set(plain)
    assert plain["grad_ckpt=True"] == {"grad_ckpt": True, "ckpt_every": 2}

    run = make_training_run(dp=4, tp=2, pp=2, fsdp="shard_grad_op", pp_schedule="gpipe", grad_accum=4)
    many = updates(run)
    assert {"precision=mp-bf16", "fsdp=full_shard", "sequence_parallel=True", "pp_schedule=1f1b"} <= set(many)
    assert many["cp=2"] == {"cp": 2, "gpus": None}

    done = make_training_run(
        dp=4, tp=2, pp=2, fsdp="full_shard", precision="mp-bf16", sequence_parallel=True, loss="fused-linear",
        optimizer="paged-adamw-8bit", activation_offload=True, optimizer_in_backward=True, grad_ckpt=True,
    )  # fmt: skip
    left = updates(done)
    assert set(left) == {"cp=2"}  # every other lever is already on
    partial = updates(done.model_copy(update={"ckpt_every": 4, "ckpt_policy": "selective-op"}))
    assert {"ckpt_every=1", "ckpt_policy=full"} <= set(partial)
    assert "cp=4" not in updates(make_training_run(seq=6, cp=2))  # 6 tokens do not split over 4 ranks
    # accumulation without sync (the HF Trainer's default under FSDP): a sync on every micro-batch instead
    trainer = make_training_run(framework="hf-trainer", fsdp="full_shard", dp=4, grad_accum=8)
    assert updates(trainer)["grad_sync=each"] == {"grad_sync": "each"}
    assert "grad_sync=each" not in updates(trainer.model_copy(update={"grad_accum": 1}))
    assert "grad_sync=each" not in updates(make_training_run(fsdp="full_shard", dp=4, grad_accum=8))


def _expected(run: TrainingRun, current: int, t: GpuTarget) -> dict[str, int]:
    """What each applicable lever needs when the core accepts it and it makes the run fit or saves at least
    1 % of the most-loaded rank's memory."""
    out = {}
    for _rank, _kind, desc, upd in levers(run):
        try:
            changed = make_training_run(**{**run.model_dump(), **upd})
            est = estimate_training(SPEC, changed)
        except GpumemInputError:
            continue
        n = max(t.count, changed.dp * changed.tp * changed.pp * changed.cp)
        fits = fit_training(SPEC, changed, t.model_copy(update={"count": n})).fits
        if fits or est.total_bytes <= current * (1 - MIN_SAVING):
            out[desc] = est.total_bytes
    return out


@pytest.mark.parametrize(
    "run",
    [
        make_training_run(
            seq=8192, dp=2, tp=2, pp=2, fsdp="shard_grad_op", pp_schedule="gpipe", grad_accum=4
        ),
        make_training_run(seq=4096, fsdp="full_shard", dp=4, reshard_size=2, loss="standard"),
        make_training_run(seq=4096, grad_ckpt=True, ckpt_every=4, optimizer="adamw-8bit"),
    ],
    ids=["fsdp-tp-pp", "fsdp-reshard", "ckpt-every"],
)
def test_listed_levers_are_re_estimated_and_lower_the_memory(run: TrainingRun) -> None:
    t = target("T4", run.dp * run.tp * run.pp * run.cp)
    rep = fit_training(SPEC, run, t)
    assert not rep.fits
    current = rep.estimate.total_bytes
    expected = _expected(run, current, t)
    listed = {c.description: c for c in rep.changes}
    descs = {desc for *_, desc, _ in levers(run)}
    other_totals = [c.total_bytes for c in rep.changes if c.description not in descs]
    for desc, c in listed.items():
        if desc not in descs:
            continue
        assert expected[desc] == c.total_bytes, desc
        upd = make_training_run(**{**run.model_dump(), **c.update})
        need = max(1, upd.dp * upd.tp * upd.pp * upd.cp)
        assert fit_training(SPEC, upd, target("T4", max(need, t.count))).fits == c.fits, desc
    # every lever that lowers the memory is listed, unless another change needs exactly the same
    for desc, total in expected.items():
        assert desc in listed or total in other_totals or list(expected.values()).count(total) > 1, desc


def test_levers_with_semantics_today_appear_for_a_run_that_does_not_fit() -> None:
    run = make_training_run(
        seq=8192, dp=2, tp=2, pp=2, fsdp="shard_grad_op", pp_schedule="gpipe", grad_accum=4
    )
    rep = fit_training(SPEC, run, target("T4", 8))
    assert not rep.fits
    kinds = {c.kind: c for c in rep.changes}
    # resharding after forward frees the gathered parameters of every unit but the current one
    assert kinds["reshard"].update == {"fsdp": "full_shard"}
    # context parallelism halves the tokens (and activations) per rank
    assert (
        kinds["cp"].update == {"cp": 2, "gpus": None} and kinds["cp"].total_bytes < rep.estimate.total_bytes
    )
    fitting = [c for c in rep.changes if c.fits]
    assert [c.fits for c in rep.changes] == sorted((c.fits for c in rep.changes), reverse=True)
    assert fitting  # something makes it fit, listed first


def test_a_rejected_a_useless_or_a_duplicate_lever_is_not_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpumem_gui.core.fit.training as fit_mod

    fake = [
        (1.0, "bad", "expert parallel 3 (does not divide dp x tp)", {"ep": 3}),
        (1.0, "worse", "a larger CUDA context", {"cuda_context_mib": 900}),
        (1.0, "same", "8-bit AdamW again", {"optimizer": "adamw-8bit"}),  # what the 8-bit lever already needs
        (1.0, "good", "checkpoint every layer", {"grad_ckpt": True}),
        (1.0, "fresh", "SGD (no optimizer states)", {"optimizer": "sgd"}),
        (1.0, "tiny", "a 2,000-token sequence", {"seq": 2000}),  # saves under 1 %: the peak is the step
    ]
    monkeypatch.setattr(fit_mod, "levers", lambda run: fake)
    rep = fit_training(SPEC, make_training_run(), target("T4"))
    kinds = [c.kind for c in rep.changes]
    assert "bad" not in kinds and "worse" not in kinds and "same" not in kinds and "tiny" not in kinds
    tiny = estimate_training(SPEC, make_training_run(seq=2000)).total_bytes
    # saves under MIN_SAVING (the live tensors fall a little; the caching allocator's reserve may even rise:
    # other sizes pack into the cached segments differently, core/allocator)
    assert rep.estimate.total_bytes * (1 - MIN_SAVING) < tiny
    assert "optimizer" in kinds  # the existing 8-bit lever stays
    # the good lever needs what the existing checkpointing change needs: listed once, by the existing lever
    assert "good" not in kinds and "grad_ckpt" in kinds
    fresh = next(c for c in rep.changes if c.kind == "fresh")
    assert fresh.total_bytes == estimate_training(SPEC, make_training_run(optimizer="sgd")).total_bytes


def test_context_parallel_is_offered_only_where_the_sequence_splits() -> None:
    # context parallel 2 over 4,097 tokens leaves the ranks uneven (the core warns): not offered
    run = make_training_run(seq=4097)
    assert all("cp" not in upd for *_, upd in levers(run))
    rep = fit_training(SPEC, run, target("T4"))
    assert all(c.kind != "cp" for c in rep.changes)


def test_a_run_that_fits_gets_no_new_levers() -> None:
    run = make_training_run(
        seq=512, dp=2, tp=2, pp=2, fsdp="shard_grad_op", pp_schedule="gpipe", grad_accum=4
    )
    rep = fit_training(SPEC, run, target("H100-SXM-80GB", 8))
    assert rep.fits
    descs = {desc for *_, desc, _ in levers(run)}
    assert descs and not descs & {c.description for c in rep.changes}
