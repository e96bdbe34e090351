"""transformers inference on bitsandbytes 4-bit weights: each ``Linear4bit`` dequantizes its weight for a
multi-token matmul, and casts it to the compute dtype (``bnb_4bit_compute_dtype``) when that differs from the
dtype the weight had; a single token takes ``gemv_4bit`` on the packed weight (bitsandbytes
``autograd/_functions.py`` ``matmul_4bit`` / ``MatMul4Bit``)."""

from __future__ import annotations

import pytest

from gpumem_gui.core import estimate_inference, find_model, make_run

STARCODER = "bigcode/starcoder"  # OctoCoder's architecture: the largest linear is c_fc, 24576 x 6144


def _dequantized(est) -> int:
    comp = est.phases["prefill"].components
    return next((c.bytes for c in comp if c.key == "dequantized_weights"), 0)


@pytest.fixture(scope="module")
def starcoder():
    return find_model(STARCODER).spec


def test_prefill_holds_the_largest_linear_dequantized_in_its_dtype(starcoder) -> None:
    est = estimate_inference(starcoder, make_run(weights="nf4", compute_dtype="fp16", seq=20), None)
    assert _dequantized(est) == 24576 * 6144 * 2  # fp16, the dtype the weight had


def test_an_fp32_compute_dtype_keeps_the_fp16_and_the_fp32_copy(starcoder) -> None:
    run = make_run(weights="fp4", compute_dtype="fp16", bnb_compute_dtype="fp32", seq=20)
    est = estimate_inference(starcoder, run, None)
    assert _dequantized(est) == 24576 * 6144 * (2 + 4)  # dequantize_4bit(...) then .to(A.dtype)


def test_one_token_takes_gemv_without_a_dequantized_copy(starcoder) -> None:
    run = make_run(weights="nf4", compute_dtype="fp16", seq=1, new_tokens=8)
    est = estimate_inference(starcoder, run, None)
    decode = est.phases["decode"].components
    assert all(c.key != "dequantized_weights" for c in decode)


def test_other_formats_dequantize_nothing(starcoder) -> None:
    for weights in ("bf16", "int8", "gptq-4"):
        est = estimate_inference(starcoder, make_run(weights=weights, seq=20), None)
        assert _dequantized(est) == 0


def test_octocoder_4bit_matches_the_published_peak(starcoder) -> None:
    """transformers' llm_tutorial_optimization.md: OctoCoder (StarCoder's architecture) loaded with
    load_in_4bit=True (FP4, compute dtype fp32 then), a 20-token prompt and 60 new tokens:
    torch.cuda.max_memory_allocated() -> 9.543574333190918 GiB."""
    run = make_run(
        weights="fp4", compute_dtype="fp16", bnb_compute_dtype="fp32", seq=20, new_tokens=60, attn="eager"
    )
    peak = estimate_inference(starcoder, run, None).peak_bytes / 2**30
    assert peak == pytest.approx(9.543574333190918, rel=0.01)
