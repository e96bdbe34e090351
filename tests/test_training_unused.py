"""Training fields a run does not use are named in a note ending "ignored", never dropped silently
(issue 33 item 10): training/unused.py."""

from __future__ import annotations

import pytest

from gpumem_gui.core import load_model
from gpumem_gui.core.training import check_training, make_training_run
from gpumem_gui.core.training.unused import UNUSED


@pytest.fixture(scope="module")
def qwen():
    return load_model("Qwen3-0.6B").spec


# (the field set away from its default, in a run that does not use it) -> (the same field in a run that does)
CASES = [
    ({"loss_chunks": 4}, {"framework": "torchtune"}),
    ({"loss_chunks": 4, "framework": "torchtune", "loss": "fused-linear"}, {"loss": "chunked"}),
    ({"loss_chunks": 4, "framework": "axolotl", "method": "lora"}, {"loss": "chunked"}),
    ({"pp_schedule": "gpipe"}, {"pp": 2}),
    ({"pp_virtual": 2, "pp": 2}, {"pp_schedule": "interleaved-1f1b", "grad_accum": 2}),
    ({"sequence_parallel": True}, {"tp": 2}),
    ({"reshard_size": 2}, {"fsdp": "full_shard", "dp": 4}),
    ({"fsdp_version": 1}, {"fsdp": "full_shard", "dp": 2}),
    ({"gpus_per_node": 4}, {"fsdp": "hybrid_shard", "dp": 8}),
    ({"zero_impl": "torch"}, {"zero": 1, "dp": 2}),
    ({"bucket_cap_mb": 50.0}, {"dp": 2}),
    ({"bucket_view": True, "dp": 2, "fsdp": "full_shard"}, {"fsdp": "none"}),
    ({"reduce_bucket": 1000}, {"zero": 2, "dp": 2}),
    ({"allgather_bucket": 1000, "zero": 3, "dp": 2}, {"zero": 1}),
    ({"prefetch_bucket": 1000, "zero": 2, "dp": 2}, {"zero": 3}),
    ({"max_live_params": 1000}, {"zero": 3, "dp": 2}),
    ({"persistence_threshold": 10}, {"zero": 3, "dp": 2}),
    ({"offload_device": "nvme", "zero": 3, "dp": 2}, {"offload": "optimizer"}),
]


def _notes(spec, **fields) -> list[str]:
    return [w for w in check_training(spec, make_training_run(**fields)) if w.endswith("; ignored")]


@pytest.mark.parametrize(("unused", "use"), CASES, ids=lambda c: ",".join(c) if isinstance(c, dict) else "")
def test_a_field_the_run_does_not_use_is_named_ignored(qwen, unused: dict, use: dict) -> None:
    field = next(iter(unused))
    notes = _notes(qwen, **unused)
    assert [n for n in notes if n.startswith(f"{field}: ")], notes
    assert "only; ignored" in notes[0]
    # the same value where the run uses it: no note about it
    assert not [n for n in _notes(qwen, **{**unused, **use}) if n.startswith(f"{field}: ")]


def test_defaults_note_nothing_and_every_row_names_run_fields(qwen) -> None:
    assert _notes(qwen) == []
    from gpumem_gui.core.training.run import TrainingRun

    for row in UNUSED:
        assert set(row.fields) <= set(TrainingRun.model_fields), row.fields


def test_the_cli_prints_the_note_and_exits_0(capsys) -> None:
    from gpumem_gui.cli import main

    rc = main(["estimate", "Qwen3-0.6B", "--mode", "train", "--zero-impl", "torch", "--pp-schedule", "gpipe"])
    err = capsys.readouterr()
    assert rc in (0, None)
    text = err.out + err.err
    assert "zero_impl: 'torch' applies to a ZeRO stage" in text and "ignored" in text
    assert "pp_schedule: 'gpipe' applies to pipeline parallelism" in text
