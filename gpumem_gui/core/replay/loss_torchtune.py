"""torchtune's loss before its chunked losses (v0.1 / v0.2): see :func:`fp32_shift`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay.logits import head_logits
from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def fp32_shift(m: CausalLM, h: T) -> T:
    """torchtune before its chunked losses (v0.1 / v0.2, 2024; kinggongzilla/torchtune 4c19547):
    ``TransformerDecoder.forward`` returns ``self.output(h).float()`` (fp32 logits, the compute-dtype output
    freed by the cast), the recipe shifts with ``logits = logits[..., :-1, :].contiguous()`` (an fp32 copy of
    ``q - 1`` positions, made while the full fp32 logits are still referenced) and ``labels[..., 1:]
    .contiguous()``, then ``nn.CrossEntropyLoss`` over ``logits.transpose(1, 2)``: the fp32 log-probabilities
    saved (recipes/lora_finetune_single_device.py, full_finetune_distributed.py ``train``)."""
    s, cfg = m.s, m.cfg
    b, q, v = cfg.batch, cfg.q, m.spec.vocab_size
    s.tr.where = "lm_head"
    s.region = "logits"
    full = s.cast(head_logits(m, h), "f32")  # self.output(h).float()
    s.tr.where = "loss"
    shifted = s.new(b * (q - 1) * v, "f32")  # [..., :-1, :].contiguous(): SliceBackward (full-size grad)
    s.node("copy", (full,), (shifted,))
    del full
    s.region = "inputs"
    labels = s.new(b * (q - 1), "i64")  # labels[..., 1:].contiguous()
    s.region = "logits"
    logp = s.new(shifted.n, "f32")  # log_softmax over dim 1 of the transposed view, saved
    s.node("copy", (shifted,), (logp,), (logp,))
    del shifted
    loss = s.new(1, "f32")
    total_weight = s.new(1, "f32")
    s.node("copy", (logp,), (loss,), (labels, total_weight))
    del logp, labels, total_weight
    return loss
