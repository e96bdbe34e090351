"""SGLang's KV pool shapes beyond one full-attention pool (gpumem_gui/core/runtimes/sglang_swa.py,
sglang_pool.py): the hybrid sliding-window split by swa_full_tokens_ratio against the published split lines
(validation/data/engine_logs/sglang.json key swa_pools), Gemma-2/3 kept as full attention as SGLang does,
--page-size rounding, the --max-total-tokens cap and how the launch command carries them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpumem_gui.core.imports import import_command
from gpumem_gui.core.readers.catalog import load_gpu_catalog
from gpumem_gui.core.readers.traits import traits_for
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run, runtime
from gpumem_gui.core.runtimes.sglang_swa import Cells, split_tokens, stage_cells
from tests.fuzz_strategies import fuzz_settings
from validation.validate_report.common import spec_for
from validation.validate_report.engine_logs import document

GPUS = {g.id: g.memory_bytes for g in load_gpu_catalog()}
H100 = GPUS["H100-SXM-80GB"]
GEMMA2 = spec_for("google/gemma-2-9b")
GEMMA3 = spec_for("google/gemma-3-27b-it")
LLAMA8 = spec_for("meta-llama/Llama-3.1-8B")
# Gemma-2's layers as a model SGLang runs with a hybrid SWA pool (a config with is_hybrid_swa: true)
HYBRID = GEMMA2.model_copy(update={"traits": GEMMA2.traits.model_copy(update={"sglang_hybrid_swa": True})})
SWA = document("SGLang")["swa_pools"]


def _est(spec, capacity=H100, **fields):
    return estimate_inference(spec, make_run(engine="sglang", **fields), capacity=capacity)


def _kv(est):
    return next(c for c in est.components if c.key == "kv_cache")


@pytest.mark.parametrize("r", SWA["cells"], ids=lambda r: r["quote"].split()[1])
def test_budget_cell_is_the_published_cell_size(r) -> None:
    cells = Cells(
        full=r["full_layers"] * r["full_per_token_layer"],
        swa=r["swa_layers"] * r["swa_per_token_layer"],
        full_layers=r["full_layers"],
        swa_layers=r["swa_layers"],
    )
    assert cells.budget(r["ratio"]) == r["cell_size"]


@pytest.mark.parametrize(
    "r", [r for r in SWA["tokens"] if r["full_tokens"] > 0], ids=lambda r: str(r["full_tokens"])
)
def test_swa_pool_is_the_published_share_of_the_full_pool(r) -> None:
    cells = Cells(full=1, swa=1, full_layers=1, swa_layers=1)
    assert split_tokens(r["full_tokens"], cells, r["ratio"], r["page_size"]) == (
        r["full_tokens"],
        r["swa_tokens"],
    )


def test_a_negative_published_split_truncates_toward_zero_and_cannot_start() -> None:
    r = next(r for r in SWA["tokens"] if r["full_tokens"] < 0)
    assert int(r["full_tokens"] * r["ratio"]) == r["swa_tokens"]  # SGLang's int(), before it refuses
    assert split_tokens(r["full_tokens"], Cells(1, 1, 1, 1), r["ratio"], 1) == (0, 0)


def test_gemma_2_and_3_keep_every_layer_as_full_attention_in_sglang() -> None:
    for spec in (GEMMA2, GEMMA3):
        est = _est(spec, mem_fraction_static=0.88)
        assert "swa_max_total_num_tokens" not in est.facts
        assert est.facts["swa_pool"].startswith("none")
        assert est.facts["kv_bytes_per_token"] == spec.num_layers * spec.num_kv_heads * 2 * spec.head_dim * 2
        assert not any("sliding" in w for w in est.warnings)


def test_hybrid_pool_splits_the_budget_by_the_ratio() -> None:
    est = _est(HYBRID, mem_fraction_static=0.88)
    one = HYBRID.num_kv_heads * 2 * HYBRID.head_dim * 2  # bytes per token and layer, bf16
    n_swa = HYBRID.layer_types.count("sliding_attention")
    full_cell, swa_cell = (HYBRID.num_layers - n_swa) * one, n_swa * one
    free, weights = (
        est.facts["pre_load_free_bytes"],
        next(c.bytes for c in est.components if c.key == "weights"),
    )
    full = int((free * 0.88 - weights) // (full_cell + 0.8 * swa_cell))
    swa = int(full * 0.8)
    assert (est.facts["max_total_num_tokens"], est.facts["swa_max_total_num_tokens"]) == (full, swa)
    assert _kv(est).bytes == (full + 1) * full_cell + (swa + 1) * swa_cell
    plain = _est(GEMMA2, mem_fraction_static=0.88)
    assert full > plain.facts["max_total_num_tokens"]  # the same memory holds more full-attention tokens
    assert abs(_kv(est).bytes - _kv(plain).bytes) < 0.001 * _kv(plain).bytes  # within the same budget
    smaller = _est(HYBRID, mem_fraction_static=0.88, swa_full_tokens_ratio=0.2)
    assert smaller.facts["max_total_num_tokens"] > full
    assert smaller.facts["swa_full_tokens_ratio"] == 0.2


def test_an_swa_pool_below_one_window_is_named() -> None:
    est = _est(HYBRID, mem_fraction_static=0.88, swa_full_tokens_ratio=0.001, max_total_tokens=2_000_000)
    assert est.facts["swa_max_total_num_tokens"] <= HYBRID.sliding_window
    assert any(w.startswith("swa_full_tokens_ratio: SGLang refuses to start") for w in est.warnings)


def test_stage_cells_count_the_layers_of_the_stage() -> None:
    first, second = range(0, 21), range(21, 42)
    a, b = (stage_cells(HYBRID, 2, 1, r) for r in (first, second))
    assert a.full_layers + b.full_layers == 21 and a.swa_layers + b.swa_layers == 21
    assert stage_cells(GEMMA2, 2, 1, first) == Cells(full=21 * 8 * 2 * 256 * 2, full_layers=21)


def test_config_opt_in_sets_the_trait() -> None:
    assert traits_for("gemma2", {"is_hybrid_swa": True}).sglang_hybrid_swa
    assert not traits_for("gemma2", {}).sglang_hybrid_swa


# ------------------------------------------------------------------------------------------------ pages, cap


def test_page_size_rounds_the_pool_to_whole_pages_plus_one() -> None:
    est = _est(LLAMA8, mem_fraction_static=0.88, page_size=64)
    tokens, cell = est.facts["max_total_num_tokens"], est.facts["kv_bytes_per_token"]
    one = _est(LLAMA8, mem_fraction_static=0.88)
    assert tokens % 64 == 0 and one.facts["max_total_num_tokens"] - tokens < 64
    assert _kv(est).bytes == (tokens + 64) * cell and est.facts["page_size"] == 64


def test_max_total_tokens_caps_the_pool_and_a_larger_cap_only_warns() -> None:
    est = _est(LLAMA8, mem_fraction_static=0.88, max_total_tokens=100_000, page_size=64)
    assert est.facts["max_total_num_tokens"] == 100_000 // 64 * 64
    assert est.facts["tokens_before_max_total_tokens"] > 100_000
    big = _est(LLAMA8, mem_fraction_static=0.88, max_total_tokens=10**9)
    assert (
        big.facts["max_total_num_tokens"]
        == _est(LLAMA8, mem_fraction_static=0.88).facts["max_total_num_tokens"]
    )
    assert any(w.startswith("max_total_tokens:") for w in big.warnings)
    nogpu = estimate_inference(LLAMA8, make_run(engine="sglang", max_total_tokens=50_000), capacity=None)
    assert nogpu.facts["max_total_num_tokens"] == 50_000


def test_the_command_carries_the_new_options_both_ways() -> None:
    run = make_run(engine="sglang", page_size=16, max_total_tokens=200_000, swa_full_tokens_ratio=0.5)
    est = estimate_inference(LLAMA8, run, capacity=H100)
    command = runtime("sglang").command("meta-llama/Llama-3.1-8B", run, est)
    assert "--page-size 16" in command and "--max-total-tokens 200000" in command
    assert "--swa-full-tokens-ratio 0.5" in command
    back = import_command(command)
    assert not back.warnings
    assert (back.run.page_size, back.run.max_total_tokens, back.run.swa_full_tokens_ratio) == (
        16,
        200_000,
        0.5,
    )
    plain = runtime("sglang").command("m", make_run(engine="sglang"), est)
    assert "--swa-full-tokens-ratio" not in plain and "--page-size" not in plain


@fuzz_settings(150)
@given(
    full=st.integers(-(10**7), 10**8),
    ratio=st.floats(0.001, 1.0),
    page=st.sampled_from([1, 16, 32, 64, 128]),
    n_full=st.integers(0, 64),
    n_swa=st.integers(0, 64),
)
def test_fuzz_split_is_whole_pages_and_never_more_swa_than_full(full, ratio, page, n_full, n_swa) -> None:
    cells = Cells(full=n_full * 512, swa=n_swa * 512, full_layers=n_full, swa_layers=n_swa)
    tokens, swa = split_tokens(full, cells, ratio, page)
    assert tokens % page == 0 and swa % page == 0 and 0 <= swa <= tokens <= max(0, full)
    if n_swa and n_full:
        assert swa == int(tokens * ratio) // page * page
    assert cells.budget(ratio) <= cells.total


@fuzz_settings(80)
@given(
    page=st.sampled_from([None, 1, 16, 64, 128]),
    ratio=st.floats(0.01, 1.0),
    cap=st.one_of(st.none(), st.integers(1, 2_000_000)),
    fraction=st.floats(0.3, 0.95),
    pp=st.sampled_from([1, 2]),
    gpu=st.sampled_from(["H100-SXM-80GB", "L4", None]),
)
def test_fuzz_hybrid_estimates_keep_whole_pages_and_the_split(page, ratio, cap, fraction, pp, gpu) -> None:
    fields = {"page_size": page, "swa_full_tokens_ratio": ratio, "max_total_tokens": cap}
    est = _est(HYBRID, GPUS.get(gpu), mem_fraction_static=fraction, pp=pp, **fields)
    f, p = est.facts, page or 1
    tokens, swa = f["max_total_num_tokens"], f["swa_max_total_num_tokens"]
    assert tokens % p == 0 and swa % p == 0 and swa == int(tokens * ratio) // p * p
    if cap is not None and gpu is not None:
        assert tokens <= cap
    inputs = _kv(est).explain.inputs
    assert _kv(est).bytes == (tokens + p) * inputs["full_cell_bytes"] + (swa + p) * inputs["swa_cell_bytes"]
