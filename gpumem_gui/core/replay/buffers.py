"""The model's buffers (not parameters): what ``model.buffers()`` holds once the model is built."""

from __future__ import annotations

from gpumem_gui.core.replay import gptj, rope_partial
from gpumem_gui.core.replay.vision import tower_buffer_bytes
from gpumem_gui.core.spec.compressed import deepseek_v4_buffer_bytes
from gpumem_gui.core.spec.encoder_params import encoder_buffers_bytes
from gpumem_gui.core.spec.gemma4 import rotary_buffer_bytes
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.seq2seq_params import seq2seq_buffer_bytes


def buffers_bytes(spec: ModelSpec, param_bytes: float = 2) -> int:
    """Rotary ``inv_freq`` and ``original_inv_freq`` buffers (fp32, head_dim/2 each; one rotary module per
    attention type with :attr:`ArchTraits.rotary_per_layer_type`): ``LlamaRotaryEmbedding.__init__``; and
    lightning attention's decay buffers in the weights' dtype (``param_bytes``); a replayed vision tower's own
    (:func:`~.vision.tower_buffer_bytes`)."""
    if (
        spec.deepseek_v4 is not None
    ):  # its routers' and every compressor's rotary buffers (spec/compressed.py)
        return deepseek_v4_buffer_bytes(spec)
    # BART's final_logits_bias (spec/seq2seq_params.py)
    extra = seq2seq_buffer_bytes(spec, param_bytes) + tower_buffer_bytes(spec)
    return _rotary_bytes(spec) + _lightning_bytes(spec, param_bytes) + _mup_bytes(spec, param_bytes) + extra


def _mup_bytes(spec: ModelSpec, param_bytes: float) -> int:
    """FalconH1Model.__init__: one non-persistent ``mup_vector`` [1, 1, in_proj width] per layer's mixer
    (compute_mup_vector: torch.ones in the default dtype, the weights')."""
    mb = spec.mamba
    if mb is None or mb.kind != "mamba2" or not mb.mup:
        return 0
    n = len(model_kinds(spec).layers_of("mamba2"))  # Falcon-H1: every layer
    return round(n * mb.projection * param_bytes)


def _lightning_bytes(spec: ModelSpec, param_bytes: float) -> int:
    """MiniMaxLightningAttention.__init__: slope_rate [h, 1, 1], query_decay and key_decay [h, block, 1],
    diagonal_decay [1, h, block, block] per lightning layer, built in the default dtype (the weights')."""
    la = spec.linear_attention
    if la is None or la.kind != "lightning":
        return 0
    n = len(model_kinds(spec).layers_of("lightning"))
    bs = la.chunk_size
    return round(n * la.key_heads * (1 + 2 * bs + bs * bs) * param_bytes)


def _rotary_bytes(spec: ModelSpec) -> int:
    if spec.encoder is not None:  # an encoder's own buffers (spec/encoder_params.py)
        return encoder_buffers_bytes(spec)
    if spec.traits.causal_mask_buffer:  # GPTBigCodeModel.bias: tril(ones(max_positions, max_positions), bool)
        return spec.max_position_embeddings**2
    if spec.position_embedding != "rope":
        return 0
    if spec.gemma4 is not None:  # Gemma4TextRotaryEmbedding: one table per layer type, its own head dim
        return rotary_buffer_bytes(spec)
    d = rope_partial.rotary_width(spec)  # Glm4RotaryEmbedding: inv_freq over the rotary channels only
    modules = 2 if spec.traits.rotary_per_layer_type else 1
    return gptj.table_bytes(spec) if spec.traits.attention_code == "gptj" else modules * 2 * (d // 2) * 4
