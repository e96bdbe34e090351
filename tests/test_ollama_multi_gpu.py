"""Ollama over several GPUs (pp = the GPUs it may use): its layer split (llm/memory.go estimateGPULayers of
v0.12.10), the GPUs it picks (sched: the fewest that hold every layer, or all with OLLAMA_SCHED_SPREAD), the
contiguous layer ranges it hands llama.cpp (createGPULayers) and each GPU's bytes; the published 4-GPU log
is in tests/test_ollama_logs.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.fit import GpuTarget, fit_report
from gpumem_gui.core.imports import import_command
from gpumem_gui.core.readers.loader import load_model
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run
from gpumem_gui.core.runtimes.ollama import OLLAMA
from gpumem_gui.core.runtimes.ollama_predict import MINIMUM_MEMORY, Prediction, place, place_gpus
from gpumem_gui.core.runtimes.ollama_split import gpu_layers
from gpumem_gui.core.units import GiB, MiB

SPEC = load_model("meta-llama/Llama-3.3-70B-Instruct").spec


def _est(free_gib: float | None, **fields: object):
    run = make_run(engine="ollama", ollama_version="0.12.10", weights="gguf-Q4_K_M", num_ctx=8192, **fields)
    return estimate_inference(SPEC, run, None if free_gib is None else round(free_gib * GiB))


def test_fewest_gpus_that_hold_every_layer() -> None:
    """70B in Q4_K_M (about 40 GiB) does not fit one 24 GiB GPU: Ollama takes 2 of the 4, all layers."""
    est = _est(24, pp=4)
    split = [int(k) for k in str(est.facts["ollama_split"]).split(",")]
    assert len(split) == 2 and sum(split) == 81 and est.facts["ollama_gpus"] == 2
    assert est.facts["offloaded"] == "81/81"
    assert len(est.per_gpu) == 2
    # llama.cpp's buffers: every block's weights once, the output layer on the last GPU only
    weights = [g.components[0].bytes for g in est.per_gpu]
    one = estimate_inference(
        SPEC, make_run(engine="ollama", ollama_version="0.12.10", weights="gguf-Q4_K_M", num_ctx=8192), None
    )
    assert sum(weights) == one.component("weights").bytes
    kv = sum(g.components[1].bytes for g in est.per_gpu)
    assert kv == one.component("kv_cache").bytes
    assert (
        "output" in est.per_gpu[1].components[0].label and "output" not in est.per_gpu[0].components[0].label
    )
    # each GPU within what Ollama predicted for it (its allocation holds the spare layer and the minimum)
    allocs = [int(a) for a in str(est.facts["ollama_allocations"]).split(",")]
    assert all(a <= 24 * GiB for a in allocs)


def test_sched_spread_takes_every_gpu() -> None:
    est = _est(80, pp=4, sched_spread=True)
    split = [int(k) for k in str(est.facts["ollama_split"]).split(",")]
    assert len(split) == 4 and sum(split) == 81 and min(split) >= 20
    assert len(est.per_gpu) == 4
    assert _est(80, pp=4).facts["ollama_gpus"] == 1  # without it, one GPU holds everything


def test_partial_offload_over_all_gpus() -> None:
    """No subset holds every layer: all GPUs, the rest on the CPU; the graph is the partial one."""
    est = _est(12, pp=2)
    assert est.facts["ollama_gpus"] == 2
    done, total = map(int, str(est.facts["offloaded"]).split("/"))
    assert 0 < done < total
    assert est.facts["ollama_graph_full"] == est.facts["ollama_graph_partial"]
    assert not OLLAMA.admits(est)


def test_fit_on_n_gpus_of_a_type() -> None:
    run = make_run(engine="ollama", ollama_version="0.12.10", weights="gguf-Q4_K_M", num_ctx=8192, pp=2)
    rep = fit_report(SPEC, run, GpuTarget(name="RTX 4090", capacity_bytes=24 * GiB, count=2), margin=0)
    assert rep.fits and len(rep.verdicts) == 2
    one = fit_report(
        SPEC, run.model_copy(update={"pp": 1}), GpuTarget(name="RTX 4090", capacity_bytes=24 * GiB)
    )
    assert not one.fits


def test_tensor_parallel_still_refused_and_uneven_pp_not_warned() -> None:
    with pytest.raises(GpumemInputError, match="no tensor or expert"):
        _est(24, tp=2)
    est = _est(24, pp=3)  # 80 layers over 3 GPUs: Ollama splits by memory, no "fullest stage" note
    assert not any(w.startswith("pp:") for w in est.warnings)


def test_command_and_import_carry_the_gpus() -> None:
    run = make_run(
        engine="ollama",
        ollama_version="0.12.10",
        weights="gguf-Q4_K_M",
        num_ctx=8192,
        pp=2,
        sched_spread=True,
    )
    est = estimate_inference(SPEC, run, 24 * GiB)
    cmd = OLLAMA.command("meta-llama/Llama-3.3-70B-Instruct", run, est)
    assert "CUDA_VISIBLE_DEVICES=0,1" in cmd and "OLLAMA_SCHED_SPREAD=1" in cmd
    back = import_command(cmd)
    assert (back.run.pp, back.run.sched_spread) == (2, True)


def test_one_gpu_reproduces_the_single_gpu_rules() -> None:
    """The published single-GPU point ollama-5913 (43 layers on 24.0 GiB) through place_gpus."""
    p = Prediction(kv=(8 * MiB,) * 80, graph_full=313 * MiB, graph_partial=1331 * MiB,
                   layer_bytes=(498 * MiB,) * 80, output_bytes=975 * MiB)  # fmt: skip
    assert place(p, 24 * GiB, 0, None) == place_gpus(p, (24 * GiB,), 0, None)


_sizes = st.integers(1, 2 * GiB)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 96),
    layer=_sizes,
    kv=st.integers(0, GiB),
    out=st.integers(0, 2 * GiB),
    graph=st.integers(0, 4 * GiB),
    frees=st.lists(st.integers(0, 96 * GiB), min_size=1, max_size=8),
    num_gpu=st.one_of(st.none(), st.integers(0, 100)),
)
def test_placement_invariants(n, layer, kv, out, graph, frees, num_gpu) -> None:
    """Layers counted once, never more than num_gpu; a GPU with layers keeps its allocation (graph included)
    within its free memory; the allocations add up to memory.required.partial."""
    p = Prediction(
        kv=(kv,) * n, graph_full=graph, graph_partial=graph, layer_bytes=(layer,) * n, output_bytes=out
    )
    plc = place_gpus(p, tuple(frees), 0, num_gpu)
    assert sum(plc.split) == plc.layers <= n + (1 if out else 0)
    if num_gpu is not None:
        assert plc.layers <= max(num_gpu, 0)
    assert sum(plc.allocations) == plc.vram <= plc.total
    for free, k, a in zip(frees, plc.split, plc.allocations, strict=True):
        if k:
            assert a <= free and a >= MINIMUM_MEMORY + k * min(layer + kv, out or layer + kv)


@settings(max_examples=300, deadline=None)
@given(
    split=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    blocks=st.integers(1, 128),
    num_gpu=st.integers(-1, 140),
)
def test_gpu_layers_contiguous_cover(split, blocks, num_gpu) -> None:
    """createGPULayers: contiguous ranges in GPU order that together are exactly the offloaded layers."""
    ranges = gpu_layers(tuple(split), blocks, num_gpu)
    assert len(ranges) == len(split)
    got = [i for r in ranges for i in r]
    if num_gpu <= 0 or sum(split) == 0:
        assert got == []
        return
    start = max(0, blocks - num_gpu)
    assert got == list(range(start, min(start + num_gpu, blocks + 1)))
    for k, r in zip(split, ranges, strict=True):
        if k == 0:
            assert len(r) == 0


@settings(max_examples=200, deadline=None)
@given(value=st.text(alphabet="0123456789,-GPU- ", max_size=40))
def test_visible_devices_fuzz(value: str) -> None:
    """Any CUDA_VISIBLE_DEVICES: pp = the count of ids, a warning without any, never a traceback."""
    try:
        r = import_command("ollama run llama3.1:8b", {"CUDA_VISIBLE_DEVICES": value})
    except GpumemInputError as e:
        assert "\n" not in str(e)
        return
    ids = [d.strip() for d in value.split(",") if d.strip()]
    if ids and "-1" not in ids:
        assert r.run.pp == len(ids)
    else:
        assert r.run.pp == 1 and any("CUDA_VISIBLE_DEVICES" in w for w in r.warnings)
