"""Inference estimates: accuracy against PyTorch-measured peaks, structure, monotonicity, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import load_config_file
from gpumem_gui.core.reference_points import inference_run_for_point
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run
from gpumem_gui.core.spec.model import ModelSpec
from tests.conftest import REPO, reference_dir

EXTRA = REPO / "tests" / "reference" / "extra"


def _config(name: str) -> Path:
    for d in (reference_dir() / "configs", EXTRA / "configs"):
        if (d / f"{name}.json").is_file():
            return d / f"{name}.json"
    raise FileNotFoundError(name)


def _points() -> list[dict]:
    pts = json.loads((reference_dir() / "groundtruth.json").read_text())["grid"]
    pts += json.loads((EXTRA / "grid_infer.json").read_text())["grid"]
    return [p for p in pts if p["mode"].startswith("infer") and "peak_bytes" in p]


POINTS = _points()


@pytest.mark.parametrize(
    "point",
    POINTS,
    ids=[f"{p['model']}-{p['mode']}-b{p['batch']}s{p['seq']}-{p['attn_implementation']}" for p in POINTS],
)
def test_peak_within_3_percent_and_kv_exact(point: dict) -> None:
    spec = load_config_file(_config(point["model"]))
    est = estimate_inference(spec, inference_run_for_point(point))
    err = (est.peak_bytes - point["peak_bytes"]) / point["peak_bytes"]
    assert abs(err) < 0.03, f"peak {est.peak_bytes} vs measured {point['peak_bytes']} ({err:+.2%})"
    assert est.kv_cache_bytes == point["kv_cache_bytes"]


def _spec(name: str = "meta-llama__Llama-3.2-1B") -> ModelSpec:
    return load_config_file(_config(name))


def test_components_add_up() -> None:
    est = estimate_inference(_spec(), make_run(batch=2, seq=1024, new_tokens=128))
    assert sum(c.bytes for c in est.components) == est.total_bytes
    for ph in est.phases.values():
        assert sum(c.bytes for c in ph.components) == ph.peak_bytes
    assert est.peak_bytes == max(ph.peak_bytes for ph in est.phases.values())
    assert set(est.phases) == {"load", "prefill", "decode"}
    assert all(c.explain.formula for c in est.components)


def test_tensor_parallel_splits_weights_and_kv() -> None:
    spec = _spec("meta-llama__Llama-3.1-8B")
    one = estimate_inference(spec, make_run(seq=4096))
    two = estimate_inference(spec, make_run(seq=4096, tp=2))
    assert len(two.per_gpu) == 2
    w1 = one.component("weights").bytes
    w2 = two.component("weights").bytes
    assert 0.49 * w1 < w2 < 0.52 * w1
    assert two.peak_bytes < one.peak_bytes


def test_pipeline_puts_embeddings_first_and_head_last() -> None:
    spec = _spec("meta-llama__Llama-3.1-8B")
    est = estimate_inference(spec, make_run(seq=1024, pp=4))
    assert len(est.per_gpu) == 4
    w = [next(c for c in g.components if c.key == "weights").bytes for g in est.per_gpu]
    assert w[0] > w[1] and w[3] > w[1]  # embedding table / lm_head on the ends


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"batch": 0}, "batch"),
        ({"seq": -1}, "seq"),
        ({"tp": 0}, "tp"),
        ({"attn": "magic"}, "attn"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ],
)
def test_bad_run_values_name_the_field(fields: dict, field: str) -> None:
    with pytest.raises(GpumemInputError, match=field):
        make_run(**fields)


def test_degree_that_does_not_divide_heads() -> None:
    with pytest.raises(GpumemInputError, match="tp"):
        estimate_inference(_spec(), make_run(tp=3))


def test_kv_dtype_the_engine_lacks() -> None:
    with pytest.raises(GpumemInputError, match="kv_dtype"):
        estimate_inference(_spec(), make_run(kv_dtype="q4_0", engine="vllm"))


def test_context_beyond_limit_is_a_warning() -> None:
    spec = _spec("openai-community__gpt2")
    est = estimate_inference(spec, make_run(seq=4096))
    assert any("max_position_embeddings" in w for w in est.warnings)


SPECS = [
    _spec(n)
    for n in (
        "meta-llama__Llama-3.2-1B",
        "google__gemma-2-2b",
        "Qwen__Qwen3-30B-A3B",
        "mistralai__Mistral-7B-v0.1",
        "openai-community__gpt2",
    )
]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(SPECS),
    st.integers(1, 8),
    st.integers(1, 6000),
    st.integers(0, 512),
    st.sampled_from(["sdpa", "eager"]),
    st.sampled_from(["last", "all"]),
)
def test_memory_never_falls_as_batch_or_context_grows(
    spec: ModelSpec, batch: int, seq: int, new: int, attn: str, logits: str
) -> None:
    run = make_run(batch=batch, seq=seq, new_tokens=new, attn=attn, logits=logits)
    base = estimate_inference(spec, run)
    assert base.peak_bytes > 0 and all(c.bytes >= 0 for c in base.components)
    assert sum(c.bytes for c in base.components) == base.total_bytes
    # (not fp32 compute: eager attention's fp32 softmax then needs no upcast copy of the 16-bit scores, which
    # can outweigh the wider hidden states on long sequences, as torch itself does)
    for upd in ({"batch": batch + 1}, {"seq": seq + 1}, {"new_tokens": new + 1}):
        bigger = estimate_inference(spec, run.model_copy(update=upd))
        assert bigger.peak_bytes >= base.peak_bytes, upd
    if attn == "sdpa":
        wider = estimate_inference(spec, run.model_copy(update={"compute_dtype": "fp32"}))
        assert wider.peak_bytes >= base.peak_bytes
    # more bits per weight or per KV element never needs less memory
    chain = [
        estimate_inference(spec, run.model_copy(update={"weights": w})).peak_bytes
        for w in ("nf4-dq", "nf4", "int8", "bf16", "fp32")
    ]
    assert chain == sorted(chain)
    kv = [
        estimate_inference(spec, run.model_copy(update={"kv_dtype": k})).peak_bytes
        for k in ("int4", "int8", "bf16", "fp32")
    ]
    assert kv == sorted(kv)
