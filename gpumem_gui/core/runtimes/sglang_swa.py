"""The KV geometry of one SGLang rank: bytes per token of its full-attention layers and of its
sliding-window layers, and how SGLang's pool configurators turn a memory budget into pool tokens.

SGLang keeps one pool (``MHATokenToKVPool`` / ``MLATokenToKVPool``) for every layer unless the model is
hybrid-SWA (:attr:`~gpumem_gui.core.spec.model.ArchTraits.sglang_hybrid_swa`): then ``SWAKVPool`` holds a
full pool for the full-attention layers and a smaller pool for the sliding layers, the latter
``swa_full_tokens_ratio`` times the former (``model_executor/pool_configurator.py``
``HybridSWAPoolConfigurator``):

* bytes per token of budget = full_cell + ratio x swa_cell, where full_cell / swa_cell are the per-token
  bytes of all full / all sliding layers of the rank;
* full tokens = budget // that, in whole pages; SWA tokens = int(full tokens x ratio), in whole pages;
* a model with sliding layers only (``full_layers == 0``): tokens = budget // swa_cell, no ratio.

Gemma-2, Gemma-3 and Mistral are not hybrid-SWA in SGLang (``is_hybrid_swa_model`` lists Llama4, GPT-OSS,
MiMo-V2, Step-3.5, Gemma-4, Laguna, DeepSeek-V4): their sliding layers keep the KV of every token.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec


@dataclass(frozen=True)
class Cells:
    """Per-token KV bytes of one rank: ``full`` over its full-attention layers (every layer when the pool is
    not hybrid), ``swa`` over its sliding layers kept in SGLang's separate SWA pool (0: no such pool)."""

    full: int
    swa: int = 0
    full_layers: int = 0
    swa_layers: int = 0

    @property
    def total(self) -> int:
        return self.full + self.swa

    def budget(self, ratio: float) -> float | int:
        """Bytes of budget one max_total_num_tokens token costs (HybridSWAPoolConfigurator's cell_size)."""
        if not self.swa:
            return self.full
        if not self.full_layers:
            return self.swa
        return self.full + ratio * self.swa


def per_layer_bytes(spec: ModelSpec, kv_elem: float, attn_tp: int) -> float:
    """KV bytes of one token in one layer of one rank: KV heads per attention-TP rank (at least one) x
    (head_dim + v_head_dim) x element bytes; MLA: the latent kv_lora_rank + qk_rope_head_dim, replicated
    (pool_configurator.py DefaultPoolConfigurator._compute_cell_size)."""
    latent = model_kinds(spec).latent
    if latent is not None:  # DSA: the indexer's bytes on every layer (get_cell_size_per_token)
        return latent.sglang_cell_bytes(kv_elem)
    return max(1, spec.num_kv_heads // attn_tp) * 2 * spec.head_dim * kv_elem


def swa_layers(spec: ModelSpec) -> frozenset[int]:
    """The layers SGLang keeps in its SWA pool: the sliding ones and the chunked-local ones (Llama 4:
    ``model_config.get_hybrid_layer_ids`` puts every layer but each fourth there, the layers transformers
    types ``chunked_attention``). Gemma 3n's KV-shared layers are counted with their layer type, as before
    (whether SGLang's pools skip them, as vLLM's and llama.cpp's do, is not checked)."""
    mk = model_kinds(spec)
    return frozenset(mk.layers_of("sliding_attention") + mk.layers_of("chunked_attention"))


def swa_window(spec: ModelSpec) -> int:
    """Tokens one sequence keeps in an SWA layer: the sliding window, else the attention chunk
    (``model_runner``: ``sliding_window_size`` falls back to ``attention_chunk_size``); 0 without either."""
    return model_kinds(spec).widest_bound


def stage_cells(spec: ModelSpec, kv_elem: float, attn_tp: int, layers: range) -> Cells:
    """The rank's :class:`Cells` for the decoder layers ``layers`` of its pipeline stage."""
    one = per_layer_bytes(spec, kv_elem, attn_tp)
    if not spec.traits.sglang_hybrid_swa or model_kinds(spec).latent is not None:
        return Cells(full=round(len(layers) * one), full_layers=len(layers))
    swa = swa_layers(spec)
    n_swa = sum(i in swa for i in layers)
    n_full = len(layers) - n_swa
    return Cells(full=round(n_full * one), swa=round(n_swa * one), full_layers=n_full, swa_layers=n_swa)


def split_tokens(full_profiled: int, cells: Cells, ratio: float, page: int) -> tuple[int, int]:
    """(max_total_num_tokens, SWA pool tokens) from the tokens the budget gives (or a cap): whole pages,
    the SWA pool ``int(full x ratio)`` in whole pages (HybridSWAPoolConfigurator._solve_pool_sizes); a
    pool without SWA layers has no SWA tokens."""
    full = max(0, full_profiled) // page * page
    if not cells.swa:
        return full, 0
    if not cells.full_layers:
        return full, full
    return full, int(full * ratio) // page * page
