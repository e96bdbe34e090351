"""The multimodal rotary embedding of Qwen3.5's text model over text positions (``models/qwen3_5/
modeling_qwen3_5.py`` ``Qwen3_5TextRotaryEmbedding.forward``, transformers 5.24).

``position_ids`` are expanded to ``[3, b, q]`` (temporal, height, width); ``position_ids[..., None].float()``
(a new fp32 ``[3, b, q, 1]``) times ``inv_freq`` gives the fp32 frequencies ``[3, b, q, d/2]``, whose cos and
sin are scaled into new tensors, recomposed in place into the first section and concatenated to ``[b, q, d]``
(fp32), then cast to the activation dtype. Unlike Llama's ``[1, q, d]`` the tables have a row per sequence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import rope_partial
from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def _scaled(m: CausalLM, freqs: T) -> T:
    """``freqs.cos() * attention_scaling`` (or sin): two new fp32 [3, b, q, d/2] tensors, the first freed."""
    raw = m.s.new(freqs.n, "f32")
    out = m.s.new(freqs.n, "f32")
    del raw
    return out


def rotary(m: CausalLM, x: T) -> tuple[T, T]:
    """(cos, sin) ``[b, q, rotary_dim]`` in the activation dtype."""
    s, cfg = m.s, m.cfg
    half = cfg.batch * cfg.q * (rope_partial.rotary_width(m.spec) // 2)
    pos = s.new(3 * cfg.batch * cfg.q, "f32")  # position_ids[..., None].float()
    freqs = s.new(3 * half, "f32")
    del pos
    cos = _scaled(m, freqs)
    sin = _scaled(m, freqs)
    sin = s.new(2 * half, "f32")  # recomposition_frequencies: torch.cat((freqs_thw, freqs_thw), dim=-1)
    cos = s.new(2 * half, "f32")
    return s.cast(cos, x.dt), s.cast(sin, x.dt)
