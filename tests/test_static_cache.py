"""generate(cache_implementation="static") (replay/static_cache.py, runtimes/transformers.py): the KV
cache allocated whole for max_cache_len = prompt + new tokens - 1 at the prefill and read whole at every
step, at the byte against transformers 5.24's StaticLayer arithmetic and a trace of the real StaticCache."""

from __future__ import annotations

import os

import pytest

from gpumem_gui.core import GpumemInputError, load_model
from gpumem_gui.core.readers.catalog import find_model
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run
from gpumem_gui.core.spec.model import ModelSpec


def _spec(name: str) -> ModelSpec:
    entry = find_model(name)
    assert entry is not None, name
    return entry.spec


def _kv(est, phase: str) -> int:  # type: ignore[no-untyped-def]
    return next(c.bytes for c in est.phases[phase].components if c.key == "kv_cache")


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_static_cache_is_full_size_from_the_prefill(attn: str) -> None:
    """Llama-3-8B, batch 2, 1024 + 256: 32 layers x K,V x 8 KV heads x 128 x bf16 = 256 KiB per token for
    1024 + 256 - 1 = 1279 tokens (generation/utils.py max_cache_length = max_length - 1), and each layer's
    cumulative_length moved to the device (8 B): the same in the prefill and in the last step."""
    spec = _spec("meta-llama/Meta-Llama-3-8B")
    run = make_run(seq=1024, new_tokens=256, batch=2, cache_implementation="static", attn=attn)
    est = estimate_inference(spec, run)
    per_token = 2 * 32 * 2 * 8 * 128 * 2
    full = 1279 * per_token + 32 * 8
    assert _kv(est, "prefill") == full and _kv(est, "decode") == full
    assert est.kv_cache_bytes == 1279 * per_token  # the cache as transformers reports it
    kv = next(c for c in est.phases["decode"].components if c.key == "kv_cache")
    assert kv.explain.inputs["max_cache_len"] == 1279 and "StaticLayer" in kv.explain.source
    dyn = estimate_inference(spec, run.model_copy(update={"cache_implementation": "dynamic"}))
    assert _kv(dyn, "prefill") == 1024 * per_token  # DynamicCache holds the prompt alone after the prefill
    # eager attention reads all 1279 static keys: the scores of the prefill grow by 1279 / 1024
    if attn == "eager":
        grow = [
            next(c.bytes for c in e.phases["prefill"].components if c.key == "act_attention")
            for e in (dyn, est)
        ]
        assert grow[1] > grow[0]


def test_one_new_token_has_no_decode_step_and_a_prompt_sized_cache() -> None:
    spec = _spec("meta-llama/Meta-Llama-3-8B")
    est = estimate_inference(spec, make_run(seq=512, new_tokens=1, cache_implementation="static"))
    assert "decode" not in est.phases
    assert est.kv_cache_bytes == 512 * 32 * 2 * 8 * 128 * 2


@pytest.mark.parametrize(
    ("model", "why"),
    [
        ("google/gemma-2-9b", "sliding-window"),
        ("mistralai/Mistral-7B-v0.1", "sliding-window"),
    ],
)
def test_layers_whose_static_form_differs_are_refused(model: str, why: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        estimate_inference(_spec(model), make_run(seq=256, new_tokens=8, cache_implementation="static"))
    assert e.value.field == "cache_implementation" and why in str(e.value) and "\n" not in str(e.value)


if os.environ.get("GPUMEM_REQUIRE_TRACE") != "1":
    pytest.importorskip("torch", reason="trace mode needs torch (make test installs the trace extra)")
    pytest.importorskip("transformers")


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_static_cache_equals_a_trace_of_staticcache(attn: str) -> None:
    """The trace worker runs transformers' StaticCache on fake tensors: prefill and last step to the byte,
    but for one mask. In the SDPA prefill transformers skips the mask when the cache is empty
    (masking_utils._ignore_causal_mask_sdpa, q_offset == 0), which a GPU evaluates; under fake tensors
    q_offset counts as tracing, so the trace builds the [b, 1, q, max_cache_len] boolean mask the GPU
    does not (b x q x L bytes)."""
    from gpumem_gui.trace import trace

    rep = trace(
        load_model("Llama-3.2-1B"),
        make_run(seq=64, new_tokens=16, batch=2, cache_implementation="static", attn=attn),
        use_cache=False,
    )
    est, got = rep.estimate, rep.result
    assert est is not None
    assert got.kv_cache_bytes == est.kv_cache_bytes == 79 * 16 * 2 * 8 * 64 * 2 * 2
    assert got.phases["decode"]["Total"] == est.phases["decode"].peak_bytes
    fake_mask = 2 * 64 * 79 if attn == "sdpa" else 0
    assert got.phases["prefill"]["Total"] == est.phases["prefill"].peak_bytes + fake_mask
