"""vLLM's hybrid KV allocator (runtimes/vllm_kv.py): the groups vLLM forms for sliding-window models,
the blocks one request takes, and what the estimate reports and admits (published logs: test_vllm_logs.py)."""

from __future__ import annotations

import shlex

from hypothesis import given, settings
from hypothesis import strategies as st

from gpumem_gui.core import GpumemInputError, import_command
from gpumem_gui.core.readers.catalog import find_model
from gpumem_gui.core.runtimes import vllm_kv as vk
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run
from gpumem_gui.core.runtimes.vllm import VLLM
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.units import GiB


def _spec(name: str) -> ModelSpec:
    entry = find_model(name)
    assert entry is not None, name
    return entry.spec


def test_gemma3_27b_groups_as_vllm_logs_them() -> None:
    """52 sliding + 10 full layers: groups of 10, 6 sliding groups with 8 padding layers ("Add 8 padding
    layers, may waste at most 15.38%"), 7 groups in all."""
    lay = vk.layout(_spec("google/gemma-3-27b-it"), 1, 16 * 8192)
    assert lay.group_size == 10 and len(lay.windows) == 7
    assert lay.windows.count(None) == 1 and lay.windows.count(("sliding", 1024)) == 6
    assert 6 * 10 - 52 == 8
    # 89,994 blocks (the log's num_gpu_blocks): 205,696 tokens and 50.05x for 4,096-token requests
    assert lay.reported_tokens(89994, 16) == 205696
    assert round(89994 / lay.blocks_per_request(4096, 16, 8192), 2) == 50.05


def test_equal_kinds_make_two_groups_and_uniform_sliding_one() -> None:
    gemma2 = vk.layout(_spec("google/gemma-2-9b"), 1, 1)
    assert (gemma2.windows, gemma2.group_size) == ((("sliding", 4096), None), 21)  # layer 0 slides
    mistral = vk.layout(_spec("mistralai/Mistral-7B-v0.1"), 1, 1)
    assert (mistral.windows, mistral.group_size) == ((("sliding", 4096),), 32)
    assert mistral.reported_tokens(100, 16) == 1600  # one group: every block is a token page


def test_pipeline_stages_project_the_whole_models_groups() -> None:
    """Groups are dealt ``layers[i::n]`` over the whole model, so each of 2 stages holds about half of
    every group: the fuller stage's share sizes the blocks."""
    spec = _spec("google/gemma-3-4b-it")  # 29 sliding + 5 full, groups of 5
    one, two = vk.layout(spec, 1, 1), vk.layout(spec, 2, 1)
    assert one.windows == two.windows and one.group_size == 5 and two.group_size == 3


def test_sliding_request_takes_window_plus_chunk_blocks() -> None:
    lay = vk.KvLayout(windows=(None, ("sliding", 1024)), group_size=1, layer_page_bytes=1)
    # full: 32768 / 16; sliding: ceil((1023 + 8192) / 16) + 1 (the window may start inside a block)
    assert lay.blocks_per_request(32768, 16, 8192) == 2048 + 577
    # a request shorter than the window holds only its own pages (vLLM still admits against 577 + 1)
    assert lay.blocks_per_request(100, 16, 8192) == 7 + 8
    assert lay.blocks_per_request(100, 16, 8192, held=True) == 7 + 7


@settings(max_examples=200, deadline=None)
@given(
    kinds=st.lists(st.booleans(), min_size=1, max_size=96),
    window=st.integers(1, 1 << 16),
    pp=st.integers(1, 4),
)
def test_groups_cover_every_layer_once(kinds: list[bool], window: int, pp: int) -> None:
    n = len(kinds)
    types = tuple("sliding_attention" if k else "full_attention" for k in kinds)
    spec = _spec("google/gemma-2-2b").model_copy(
        update={"num_layers": n, "layer_types": types, "sliding_window": window}
    )
    groups = vk._groups(spec)
    assert sorted(i for _, g in groups for i in g) == list(range(n))  # every layer in exactly one group
    assert all(
        w in (None, ("sliding", window)) and all(kinds[i] == (w is not None) for i in g) for w, g in groups
    )
    size = max(len(g) for _, g in groups)
    for w in {w for w, _ in groups}:  # one kind's groups differ by at most one (padding) layer
        lens = [len(g) for v, g in groups if v == w]
        assert max(lens) - min(lens) <= 1
    lay = vk.layout(spec, min(pp, n), 1)
    assert -(-size // min(pp, n)) <= lay.group_size <= size


def test_estimate_sizes_sliding_layers_by_their_window() -> None:
    """A 128k-token gemma-3 request on an 80 GiB GPU: the sliding layers need their window, not the
    context, so many more requests fit than full-context sizing of every layer allows; no upper-bound
    warning any more."""
    spec = _spec("google/gemma-3-4b-it")
    run = make_run(engine="vllm", seq=131072, max_model_len=131072)
    est = estimate_inference(spec, run, capacity=80 * GiB)
    f = est.facts
    assert f["kv_groups"] == 7 and f["kv_group_layers"] == 5
    per_request = int(f["kv_blocks_per_request"])  # type: ignore[call-overload]
    assert per_request == 8192 + 6 * (576 + 1)
    assert f["max_concurrency"] == round(int(f["gpu_blocks"]) / per_request, 2)  # type: ignore[call-overload]
    full_context_tokens = int(f["kv_pool_bytes"]) // int(f["kv_bytes_per_token"])  # type: ignore[call-overload]
    assert float(f["max_concurrency"]) > 2.5 * full_context_tokens / 131072  # type: ignore[arg-type]
    assert not any("upper bound" in w for w in est.warnings)


def test_refuses_when_one_request_does_not_fit_the_groups() -> None:
    spec = _spec("google/gemma-3-27b-it")
    run = make_run(engine="vllm", seq=131072, max_model_len=131072, gpu_memory_utilization=0.7)
    est = estimate_inference(spec, run, capacity=80 * GiB)
    blocks, need = int(est.facts["gpu_blocks"]), int(est.facts["kv_blocks_per_request"])  # type: ignore[call-overload]
    assert (blocks < need) == any("refuse to start" in w for w in est.warnings)
    assert blocks < need
    roomy = estimate_inference(spec, make_run(engine="vllm", seq=4096, max_model_len=4096), capacity=80 * GiB)
    assert not any("refuse to start" in w for w in roomy.warnings)


def test_command_round_trip_of_the_new_knobs() -> None:
    """The copied command writes --disable-hybrid-kv-cache-manager and --limit-mm-per-prompt, and the
    import reads them back."""
    spec = _spec("google/gemma-3-4b-it")
    run = make_run(engine="vllm", seq=4096, max_model_len=4096, hybrid_kv_cache=False, images_per_prompt=0)
    est = estimate_inference(spec, run, capacity=80 * GiB)
    text = VLLM.command("google/gemma-3-4b-it", run, est)
    assert "--disable-hybrid-kv-cache-manager" in text and "--limit-mm-per-prompt" in text
    back = import_command(text).run
    assert back.hybrid_kv_cache is False and back.images_per_prompt == 0
    # hybrid off: one group of every layer, sized for the whole context
    assert "kv_groups" not in est.facts
    assert not est.warnings  # no images: the encoder is not profiled, nothing left unmodelled


def test_encoder_cache_in_the_profiled_peak() -> None:
    """gemma-3-27b at vLLM's defaults on an MI300X: 8192 // 256 = 32 images of 256 tokens x 5376 x 2 B, and
    their fp32 pixels (3 x 896 x 896 x 4 B each), are held through the profiling run, whose peak is the
    sampler run (the SigLIP tower's own peak on 32 images is lower); text-only serving (image=0) drops
    them."""
    spec = _spec("google/gemma-3-27b-it")
    with_images = estimate_inference(spec, make_run(engine="vllm", seq=4096, max_model_len=4096), 192 * GiB)
    text_only = estimate_inference(
        spec, make_run(engine="vllm", seq=4096, max_model_len=4096, images_per_prompt=0), 192 * GiB
    )
    act = {
        e: next(c for c in est.components if c.key == "activations")
        for e, est in (("img", with_images), ("txt", text_only))
    }
    assert act["img"].explain.inputs["images"] == 32
    assert act["img"].bytes - act["txt"].bytes == 32 * (256 * 5376 * 2 + 3 * 896 * 896 * 4)
    assert act["img"].explain.inputs["tower_peak_bytes"] < act["img"].bytes
    assert not with_images.warnings  # the SigLIP tower is replayed: nothing left unmodelled at TP 1


@settings(max_examples=200, deadline=None)
@given(
    value=st.one_of(st.text(max_size=40), st.sampled_from(['{"image": 3}', "image=2,video=1", "{", "image="]))
)
def test_limit_mm_per_prompt_is_read_or_refused_in_one_line(value: str) -> None:
    text = f"vllm serve google/gemma-3-4b-it --limit-mm-per-prompt {shlex.quote(value)}"
    try:
        run = import_command(text).run
    except GpumemInputError as e:
        assert "\n" not in str(e)
    else:
        assert run.images_per_prompt is None or 0 <= run.images_per_prompt <= 1 << 16
