"""torchtune as 2024 recipes ran it (issue 31 item 4): v0.1 / v0.2's fp32 logits and shifted fp32 copy
(``--loss fp32-shift``, replay/loss_torchtune.py), v0.3 to v0.5's CEWithChunkedOutputLoss over the chunked
output (``--loss chunked-output``) and the FSDP1 wrapping of the distributed recipes up to v0.2
(``--fsdp-version 1``), each against the source's arithmetic."""

from __future__ import annotations

import pytest

from gpumem_gui.core import GpumemInputError, estimate_training, make_training_run
from gpumem_gui.core.readers.catalog import find_model


def _forward_logits(loss: str, framework: str = "torchtune") -> tuple[int, str]:
    spec = find_model("Llama-3.2-1B").spec
    run = make_training_run(
        framework=framework, precision="bf16", method="lora", batch=1, seq=1024, grad_ckpt=True, loss=loss
    )
    fwd = estimate_training(spec, run).phases["forward"]
    return next(c.bytes for c in fwd.components if c.key == "logits"), fwd.note


def test_fp32_shift_holds_the_fp32_logits_and_their_shifted_copy() -> None:
    """kinggongzilla/torchtune 4c19547 (April 2024): TransformerDecoder.forward returns
    self.output(h).float(); the recipe's logits[..., :-1, :].contiguous() copies q - 1 positions while the
    full fp32 logits are referenced: 4 b q V + 4 b (q - 1) V at the forward's peak (the bf16 head output
    died with the cast). transformers' loss instead holds the bf16 logits, their fp32 upcast and the fp32
    log-probabilities: 2 b q V + 4 b q V + 4 b q V."""
    v = find_model("Llama-3.2-1B").spec.vocab_size
    logits, where = _forward_logits("fp32-shift")
    assert logits == 4 * 1024 * v + 4 * 1023 * v and "loss" in where
    assert _forward_logits("standard")[0] == (2 + 4 + 4) * 1024 * v


def test_chunked_output_is_the_replays_ce_with_chunked_output_loss() -> None:
    """torchtune's chunked-output is CEWithChunkedOutputLoss (8 chunks, each upcast alone), the replay's
    'chunked' that a plain PyTorch run selects with --loss chunked."""
    assert _forward_logits("chunked-output") == _forward_logits("chunked", framework="pytorch")
    assert _forward_logits("chunked-output")[0] < _forward_logits("standard")[0]


def test_fsdp1_is_a_torchtune_setup_and_fp32_shift_is_torchtunes_only() -> None:
    spec = find_model("Llama-3.2-1B").spec
    one = make_training_run(framework="torchtune", fsdp="full_shard", fsdp_version=1, dp=4, seq=512)
    two = one.model_copy(update={"fsdp_version": 2})
    assert estimate_training(spec, one).peak_bytes != estimate_training(spec, two).peak_bytes
    with pytest.raises(GpumemInputError) as e:
        estimate_training(spec, make_training_run(framework="hf-trainer", loss="fp32-shift", seq=512))
    assert e.value.field == "loss" and "\n" not in str(e.value)
