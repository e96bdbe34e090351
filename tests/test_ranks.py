"""The per-rank table of a training estimate: rank classes in the core, the CLI, the JSON and the window."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.cli import main
from gpumem_gui.core.readers.hf_config import load_config_file
from gpumem_gui.core.results.estimate import Phase
from gpumem_gui.core.results.nontorch import NonTorch
from gpumem_gui.core.results.overheads import stage_share
from gpumem_gui.core.training import estimate_training, make_training_run
from gpumem_gui.core.training.rank import simulate_rank
from gpumem_gui.core.training.ranks import RankReplay, rank_classes
from tests.conftest import reference_dir

SPEC = load_config_file(reference_dir() / "configs" / "meta-llama__Llama-3.2-1B.json")


def test_one_class_per_pipeline_stage_naming_every_position() -> None:
    run = make_training_run(seq=1024, dp=8, tp=2, pp=2, cp=2, grad_accum=4)
    est = estimate_training(SPEC, run)
    assert [r.key for r in est.ranks] == ["pp0", "pp1"]
    for stage, r in enumerate(est.ranks):
        assert r.stage == stage and r.tp_ranks == 2 and r.cp_ranks == 2 and r.dp_ranks == tuple(range(8))
        assert r.gpus == 2 * 2 * 8  # TP x CP positions x DP ranks of one stage
        assert f"PP stage {stage} of 2" in r.role and "TP ranks 0-1" in r.role and "CP ranks 0-1" in r.role
        assert "DP ranks 0-7" in r.role
        share = next(g for g in est.per_gpu if g.index == r.first_gpu)
        assert (r.peak_bytes, r.total_bytes, r.components) == (
            share.peak_bytes,
            share.total_bytes,
            share.components,
        )
    assert sum(r.gpus for r in est.ranks) == run.world


def test_each_class_has_its_own_peak_phase_and_components() -> None:
    # GPipe-like in-flight micro-batches on stage 0, the head and the loss on the last stage
    est = estimate_training(SPEC, make_training_run(seq=2048, pp=2, grad_accum=8))
    first, last = est.ranks
    keys0 = {c.key for c in first.components}
    keys1 = {c.key for c in last.components}
    assert "pipeline_inflight" in keys0 and "pipeline_inflight" not in keys1
    assert first.peak_bytes != last.peak_bytes
    overheads = {"cuda_context", "workspace", "nccl_buffers", "allocator_reserve"}
    for r in est.ranks:
        assert r.peak_bytes == sum(c.bytes for c in r.components if c.key not in overheads)
        assert r.total_bytes == sum(c.bytes for c in r.components)
        assert r.top_components(2) == sorted(r.components, key=lambda c: -c.bytes)[:2]
    deciding = est.deciding_rank()
    assert deciding is not None and deciding.peak_phase == est.peak_phase


def test_the_largest_class_decides_and_matches_the_estimate() -> None:
    for kw in ({}, {"pp": 2, "grad_accum": 4}, {"pp": 4, "grad_accum": 8, "tp": 2}):
        est = estimate_training(SPEC, make_training_run(seq=1024, **kw))  # type: ignore[arg-type]
        deciding = est.deciding_rank()
        assert deciding is not None and [r.decides for r in est.ranks].count(True) == 1
        assert deciding.total_bytes == max(r.total_bytes for r in est.ranks) == est.total_bytes
        assert deciding.peak_bytes == est.peak_bytes


def test_offload_goes_to_host_ram_or_nvme() -> None:
    cpu = estimate_training(SPEC, make_training_run(seq=512, zero=3, dp=4, offload="optimizer+params"))
    nvme = estimate_training(
        SPEC, make_training_run(seq=512, zero=3, dp=4, offload="optimizer+params", offload_device="nvme")
    )
    none = estimate_training(SPEC, make_training_run(seq=512, zero=3, dp=4))
    (c,), (n,), (z,) = cpu.ranks, nvme.ranks, none.ranks
    assert c.host_bytes == cpu.facts["cpu_bytes"] > 0 and c.nvme_bytes == 0
    # ZeRO-Infinity: master weights, states and parameters on NVMe; gradients and swap buffers in host RAM
    assert n.nvme_bytes == nvme.facts["nvme_bytes"] > 0 and n.host_bytes == nvme.facts["cpu_bytes"] > 0
    assert z.host_bytes == z.nvme_bytes == 0


def test_offload_per_stage_adds_up_to_the_run_fact() -> None:
    est = estimate_training(SPEC, make_training_run(seq=512, zero=2, dp=4, pp=2, offload="optimizer"))
    assert all(r.host_bytes > 0 for r in est.ranks)
    assert sum(r.host_bytes for r in est.ranks) == est.facts["cpu_bytes"]


def test_a_data_parallel_class_names_its_rank() -> None:
    """A framework whose DP ranks differ (torch ZeRO-1) hands one replay per DP class."""
    phase = Phase(name="backward", peak_bytes=100 << 20, components=())
    share = stage_share(0, 1, phase, 0, NonTorch(context_mib=500))
    run = make_training_run(dp=8, zero=1)
    (big,) = rank_classes(run, [RankReplay(0, share, {"backward": phase}, dp_ranks=(3,))])
    assert big.key == "pp0-dp3" and big.dp_ranks == (3,) and big.gpus == 1 and big.decides
    assert "DP rank 3 of 8" in big.role and big.peak_phase == "backward"


def test_torch_zero1_lists_every_data_parallel_class() -> None:
    """ZeroRedundancyOptimizer: every DP rank class with its own peak (ranks holding the same bytes
    grouped), the most-loaded deciding; each class's numbers are those of a full replay of its ranks."""
    run = make_training_run(seq=512, zero=1, zero_impl="torch", dp=4)
    est = estimate_training(SPEC, run)
    assert len(est.ranks) >= 2
    assert sum(r.gpus for r in est.ranks) == run.world
    assert sorted(d for r in est.ranks for d in r.dp_ranks) == [0, 1, 2, 3]
    (big,) = [r for r in est.ranks if r.decides]
    assert est.facts["zero_state_rank"] in big.dp_ranks and big.total_bytes == est.total_bytes
    assert big.total_bytes == max(r.total_bytes for r in est.ranks)
    assert len({r.peak_bytes for r in est.ranks}) == len(est.ranks)  # classes differ in their bytes
    for r in est.ranks:
        assert r.key == f"pp0-dp{r.dp_ranks[0]}" and r.gpus == len(r.dp_ranks)
        assert f"DP rank{'s' if len(r.dp_ranks) > 1 else ''} {r.dp_ranks[0]}" in r.role
        for d in r.dp_ranks:  # a full replay of each rank: the class's peak, byte for byte
            res = simulate_rank(SPEC, run, 0, dp_rank=d)[0]
            assert res.state_owner is not None and res.state_owner[0] == d
            assert max(p.total for p in res.phases.values()) == r.peak_bytes
    # two ranks differ by exactly their parameters' AdamW states (2 fp32 states, 8 B per parameter)
    a, b = (simulate_rank(SPEC, run, 0, dp_rank=d)[0] for d in (big.dp_ranks[0], est.ranks[-1].dp_ranks[0]))
    assert a.state_owner is not None and b.state_owner is not None
    assert a.state_bytes - b.state_bytes == 8 * (a.state_owner[1] - b.state_owner[1]) > 0


def test_paged_optimizer_states_are_shown_apart() -> None:
    est = estimate_training(SPEC, make_training_run(seq=512, optimizer="paged-adamw-8bit"))
    (r,) = est.ranks
    assert r.unified_bytes == est.facts["paged_optimizer_state_bytes"] > 0
    plain = estimate_training(SPEC, make_training_run(seq=512, optimizer="adamw-8bit"))
    assert plain.ranks[0].unified_bytes == 0


def test_inference_estimates_have_no_rank_table() -> None:
    from gpumem_gui.core.runtimes.inference import estimate_inference, make_run

    est = estimate_inference(SPEC, make_run(tp=2))
    assert est.ranks == () and est.deciding_rank() is None


# ---- CLI and JSON ------------------------------------------------------------------------------------------


def test_cli_prints_the_table_when_the_ranks_differ(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "Llama-3.2-1B", "--mode", "train", "--seq", "512"]
    assert main([*args, "--pp", "2", "--tp", "2", "--dp", "2", "--grad-accum", "4"]) == 0
    out = capsys.readouterr().out
    assert "rank class" in out and "PP stage 0 of 2, TP ranks 0-1, DP ranks 0-1" in out
    assert out.count(" *") == 1 and "decides the fit" in out
    assert main(args) == 0
    assert "rank class" not in capsys.readouterr().out  # one class: the estimate says it all


def test_json_has_the_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "Llama-3.2-1B", "--mode", "train", "--seq", "512", "--pp", "2", "--json"]
    assert main([*args, "--zero", "2", "--dp", "2", "--offload", "optimizer"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ranks = doc["ranks"]
    assert [r["key"] for r in ranks] == ["pp0", "pp1"] and sum(r["decides"] for r in ranks) == 1
    for r in ranks:
        assert {"role", "gpus", "peak_bytes", "total_bytes", "peak_phase", "host_bytes", "nvme_bytes"} <= set(
            r
        )
        assert r["host_bytes"] > 0 and sum(c["bytes"] for c in r["components"]) == r["total_bytes"]
    assert max(r["total_bytes"] for r in ranks) == doc["total_bytes"]


def test_fit_says_which_rank_decides(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["fit", "Llama-3.2-1B", "--mode", "train", "--seq", "512", "--pp", "2", "--grad-accum", "4"]
    assert main([*args, "--gpu", "H100-SXM-80GB:2"]) == 0
    out = capsys.readouterr().out
    est = estimate_training(SPEC, make_training_run(seq=512, pp=2, grad_accum=4))
    deciding = est.deciding_rank()
    assert deciding is not None and f"decided by: {deciding.role}" in out


# ---- the window --------------------------------------------------------------------------------------------


@pytest.mark.no_qt_log
def test_window_shows_the_rank_table_under_the_bars(main_window) -> None:
    from gpumem_gui.core.training import TrainingRun
    from gpumem_gui.ui.target_form import GpuChoice

    w = main_window
    w.train_form.set_value(TrainingRun(seq=1024, dp=2, tp=2, pp=2, grad_accum=4))
    w.target_form.set_value(GpuChoice(gpu_id="H100-SXM-80GB", count=8))
    w.set_mode("train")
    w.recompute_now()
    est = w.estimate
    table = w.results.ranks
    assert est is not None and len(est.ranks) == 2 and table.isVisible()
    rows = table.row_texts()
    assert [r[0].removeprefix("\u25b6 ") for r in rows] == ["stage 0", "stage 1"]
    assert [r[1] for r in rows] == ["4", "4"]
    deciding = est.deciding_rank()
    assert deciding is not None and table.deciding_row() == deciding.stage
    assert rows[deciding.stage][0].startswith("\u25b6")
    assert deciding.role in table.item(0, 0).toolTip() or deciding.role in table.item(1, 0).toolTip()
    assert deciding.role in w.results.banner.detail.text()
    w.train_form.set_value(TrainingRun(seq=1024))
    w.recompute_now()
    assert not table.isVisible() and table.deciding_row() is None
    w.flush_background()
