"""The model's buffers (not parameters): what ``model.buffers()`` holds once the model is built."""

from __future__ import annotations

from gpumem_gui.core.replay import gptj, rope_partial
from gpumem_gui.core.spec.encoder_params import encoder_buffers_bytes
from gpumem_gui.core.spec.model import ModelSpec


def buffers_bytes(spec: ModelSpec) -> int:
    """Rotary ``inv_freq`` and ``original_inv_freq`` buffers (fp32, head_dim/2 each; one rotary module per
    attention type with :attr:`ArchTraits.rotary_per_layer_type`): ``LlamaRotaryEmbedding.__init__``."""
    if spec.encoder is not None:  # an encoder's own buffers (spec/encoder_params.py)
        return encoder_buffers_bytes(spec)
    if spec.traits.causal_mask_buffer:  # GPTBigCodeModel.bias: tril(ones(max_positions, max_positions), bool)
        return spec.max_position_embeddings**2
    if spec.position_embedding != "rope":
        return 0
    d = rope_partial.rotary_width(spec)  # Glm4RotaryEmbedding: inv_freq over the rotary channels only
    modules = 2 if spec.traits.rotary_per_layer_type else 1
    return gptj.table_bytes(spec) if spec.traits.attention_code == "gptj" else modules * 2 * (d // 2) * 4
