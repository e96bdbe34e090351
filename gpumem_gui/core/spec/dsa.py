"""DeepSeek Sparse Attention (DSA): the lightning indexer each MLA layer of DeepSeek-V3.2 and GLM-5 carries.

``DeepseekV32Indexer`` (transformers 5.24 ``models/deepseek_v32/modeling_deepseek_v32.py``) holds ``wq_b``
(q_lora_rank -> heads x head_dim), ``wk`` (hidden -> head_dim), ``k_norm`` (a LayerNorm with bias over
head_dim) and ``weights_proj`` (hidden -> heads); it scores every query against its own single-head key cache
(``DynamicIndexedLayer.indexer_keys``: ``[batch, tokens, head_dim]`` in the activation dtype, grown by
concatenation, ``cache_utils.py``) and keeps the top-``topk`` tokens for the MLA attention.
"""

from __future__ import annotations

from pydantic import Field

from gpumem_gui.core.spec.base import Frozen, NonNegInt, PositiveInt


class IndexerSpec(Frozen):
    """The DSA lightning indexer of every attention layer (DeepseekV32Config index_* fields)."""

    n_heads: PositiveInt = Field(description="index_n_heads (DeepseekV32Config: 64)")
    head_dim: PositiveInt = Field(
        description="index_head_dim (DeepseekV32Config: 128); one cached key per token"
    )
    topk: PositiveInt = Field(
        description="index_topk (DeepseekV32Config: 2048): tokens each query attends to"
    )
    shared_layers: tuple[NonNegInt, ...] = Field(
        (),
        description="layers without an indexer of their own that reuse the previous layer's top-k "
        "(GlmMoeDsaConfig indexer_types 'shared'; GlmMoeDsaAttention builds no indexer and caches no "
        "indexer key)",
    )
    carries_topk: bool = Field(
        False,
        description="the model's layer loop holds each layer's top-k indices until the next layer returns "
        "(GlmMoeDsaModel.forward prev_topk_indices)",
    )

    def has_indexer(self, layer: int) -> bool:
        return layer not in self.shared_layers
