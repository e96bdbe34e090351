"""vLLM's V0 engine as an engine generation (``--vllm-engine v0``, runtimes/vllm_profile.py): its batch
defaults, its CUDA-graph capture sizes and graphs captured after the KV cache, each against the V0 source's
arithmetic; published V0 logs are compared in test_vllm_logs.py (validation/data/engine_logs/vllm.json)."""

from __future__ import annotations

import pytest

from gpumem_gui.core import import_command
from gpumem_gui.core.readers.catalog import find_model
from gpumem_gui.core.runtimes import vllm_profile as vp
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run
from gpumem_gui.core.runtimes.vllm import VLLM
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.units import GiB


def _spec(name: str) -> ModelSpec:
    entry = find_model(name)
    assert entry is not None, name
    return entry.spec


@pytest.mark.parametrize(
    ("max_len", "windowed", "tokens"),
    [
        (1024, False, 2048),  # SchedulerConfig: max(max_model_len, 2048)
        (8192, False, 8192),
        (32768, False, 32768),  # 32K itself: chunked prefill only above it
        (32769, False, 2048),  # EngineArgs turns chunked prefill on, 2048 tokens (v0.6.6)
        (131072, True, 131072),  # a sliding-window model keeps it off
    ],
)
def test_v0_batch_defaults(max_len: int, windowed: bool, tokens: int) -> None:
    run = make_run(engine="vllm", vllm_engine="v0", seq=max_len)
    # V0 has no GPU-size defaults: the same on an 80 GB and a 24 GB GPU
    for capacity in (80 * GiB, 24 * GiB, None):
        assert vp.batch_defaults(run, capacity, max_len, windowed) == (tokens, 256)
    own = make_run(engine="vllm", vllm_engine="v0", max_num_batched_tokens=512, max_num_seqs=64)
    assert vp.batch_defaults(own, None, max_len, windowed) == (512, 64)


@pytest.mark.parametrize(
    ("seqs", "count", "top"),
    [(256, 35, 256), (1024, 35, 256), (100, 16, 104), (3, 3, 4), (2, 2, 2), (1, 1, 1)],
)
def test_v0_capture_sizes(seqs: int, count: int, top: int) -> None:
    """model_runner.py: [1, 2, 4] + [8 * i for i in range(1, 33)] up to
    _get_graph_batch_size(max_num_seqs)."""
    sizes = vp.capture_sizes(make_run(engine="vllm", vllm_engine="v0"), seqs)
    assert len(sizes) == count and max(sizes) == top
    assert vp.capture_sizes(make_run(engine="vllm", vllm_engine="v0", enforce_eager=True), seqs) == ()


def test_v0_graphs_outside_the_budget_whatever_the_profile_setting() -> None:
    """V0 sizes the KV cache (determine_num_available_blocks) before it captures (initialize_cache ->
    _warm_up_model): the pool is the budget less weights, activations and non-torch memory alone, to the
    block, and the CUDA graphs come on top."""
    spec = _spec("meta-llama/Meta-Llama-3-8B")
    cap = 80 * GiB
    for profile in (True, False):
        run = make_run(engine="vllm", vllm_engine="v0", seq=8192, profile_cudagraphs=profile)
        est = estimate_inference(spec, run, capacity=cap)
        comp = {c.key: c.bytes for c in est.components}
        pool = int(cap * 0.9) - comp["weights"] - comp["activations"] - comp["non_torch"]
        page = 16 * 32 * 2 * 8 * 128 * 2  # 16 tokens x 32 layers x K,V x 8 KV heads x 128 x bf16
        assert est.facts["gpu_blocks"] == pool // page
        assert comp["kv_cache"] == pool // page * page
        assert est.facts["max_num_batched_tokens"] == 8192 and est.facts["max_num_seqs"] == 256
        assert comp["cudagraph"] > 0 and est.total_bytes > int(cap * 0.9)


def test_v0_equals_v1_with_the_v0_settings_spelled_out() -> None:
    """The V0 generation changes only what V0 did differently: the same KV pool as V1 given V0's batch
    limits and graphs outside the budget; only the capture list (35 sizes instead of 51) differs."""
    spec = _spec("meta-llama/Llama-2-7b-hf")
    v0 = make_run(engine="vllm", vllm_engine="v0", seq=4096, compute_dtype="fp16")
    v1 = make_run(
        engine="vllm",
        seq=4096,
        compute_dtype="fp16",
        max_num_batched_tokens=4096,
        max_num_seqs=256,
        profile_cudagraphs=False,
    )
    a, b = (estimate_inference(spec, r, capacity=80 * GiB) for r in (v0, v1))
    assert a.facts["gpu_blocks"] == b.facts["gpu_blocks"]
    ga, gb = (next(c for c in e.components if c.key == "cudagraph") for e in (a, b))
    assert ga.explain.inputs["capture_sizes"] == 35 and gb.explain.inputs["capture_sizes"] == 51
    assert ga.bytes * 51 == gb.bytes * 35


def test_v0_command_and_import_round_trip() -> None:
    spec = _spec("meta-llama/Meta-Llama-3-8B")
    run = make_run(engine="vllm", vllm_engine="v0", seq=8192, max_model_len=8192)
    line = VLLM.command("meta-llama/Meta-Llama-3-8B", run, estimate_inference(spec, run, capacity=80 * GiB))
    serve = line.splitlines()[-1]
    assert serve.startswith("VLLM_USE_V1=0 vllm serve")
    assert import_command(serve).run.vllm_engine == "v0"
    assert import_command("VLLM_USE_V1=1 vllm serve m").run.vllm_engine == "v1"
