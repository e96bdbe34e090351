"""transformers' ``StaticCache`` on symbolic tensors (``cache_utils.py`` ``StaticLayer``, transformers 5.24).

``generate(cache_implementation="static")`` (also what a ``torch.compile``d generation uses) builds a
``StaticCache`` of ``max_cache_len = max_length - 1`` tokens (``generation/utils.py``
``_prepare_cache_for_generation``: prompt + ``max_new_tokens`` - 1). Each ``StaticLayer`` allocates its keys
and values ``[batch, kv_heads, max_cache_len, head_dim]`` with ``torch.zeros`` at its first ``update``
(``lazy_initialization``: during the prefill, layer by layer), then writes the new tokens in place
(``index_copy_``) and returns the whole static tensors, so the attention reads ``max_cache_len`` keys at every
step (``get_mask_sizes``); no concatenation is ever made. (torchtune's ``setup_caches`` pre-allocates too,
but in its own model code and to other sizes: 2024's ``torchtune/modules/kv_cache.py`` ``KVCache`` holds
``[batch, num_heads, max_seq_len, head_dim]`` buffers, the keys expanded to every query head, for the model's
whole ``max_seq_len``; that is not modelled here.)

Modelled for decoders whose layers all attend fully with a per-token cache: sliding-window and chunked layers
(``StaticSlidingWindowLayer``: min(window, max_cache_len) and a roll once full), linear-attention states and
DSA indexer caches are refused by the runtime (``runtimes/transformers.py`` ``check``).
"""

from __future__ import annotations

from gpumem_gui.core.replay.autograd import Sim
from gpumem_gui.core.replay.cache import KVCache, indexer_elems_per_layer
from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.spec.cross_attention import cross_attention_layers
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.state import has_state

INT64_BYTES = 8  # a layer's cumulative_length: torch.tensor(0, dtype=int) (definition)


class StaticKVCache(KVCache):
    """The cache of one forward with static layers of ``length`` tokens: allocated as a whole by a layer's
    first update (the prefill, ``past == 0``) or all there already (a decode step)."""

    def __init__(
        self,
        sim: Sim,
        spec: ModelSpec,
        batch: int,
        past: int,
        kv_bytes: float,
        dt: str,
        replayed: frozenset[int],
        length: int,
    ) -> None:
        super().__init__(sim, spec, batch, 0, kv_bytes, dt, replayed)  # nothing stored before the prefill
        self.past = past
        self.length = length
        self.allocated: set[int] = set()
        if past:  # a decode step: the prefill initialised every layer
            for i in range(spec.num_layers):
                self._allocate(i)

    def _allocate(self, layer: int) -> None:
        """``lazy_initialization``: ``torch.zeros`` keys and values of ``length`` tokens, and the layer's
        ``cumulative_length`` (an int64 scalar made on the CPU in ``__init__``) moved to the device."""
        if layer in self.allocated or not self._cached(layer):
            return
        self.allocated.add(layer)
        others = self._store(layer, self.length)
        if others is not None:  # a layer not replayed: the aggregate grows by its keys and values
            self.other.grow(others)
        self.other.grow(INT64_BYTES)

    def update(self, layer: int, k: T, v: T, q: int) -> tuple[T, T]:
        """``StaticLayer.update``: the new keys and values copied in place; the static tensors returned."""
        self._allocate(layer)
        return self.layers[layer]

    def skip(self, first: int, stop: int, q: int) -> None:
        """Layers run without being replayed initialise their static tensors (a prefill); nothing grows
        after."""
        self.state.skip(first, stop)
        for i in range(first, stop):
            self._allocate(i)

    def update_indexer(self, layer: int, q: int) -> T:
        raise RuntimeError(
            "a static cache with a DSA indexer is not modelled (runtimes/transformers.py check)"
        )


def static_cache_refusal(spec: ModelSpec) -> str | None:
    """Why a static cache of ``spec`` is not modelled (None: it is): the layers whose static form differs
    from ``StaticLayer``, or a model generate() does not give a plain decoder cache."""
    kinds = model_kinds(spec)
    if kinds.model in ("encoder", "encoder-decoder"):
        return f"an {kinds.model} model's cache is not"
    if any(kinds.bounds().values()):
        return "sliding-window or chunked layers (StaticSlidingWindowLayer) are not"
    if has_state(spec):
        return "linear-attention or state layers are not"
    if any(indexer_elems_per_layer(spec)):
        return "DSA indexer caches (StaticIndexedLayer) are not"
    if cross_attention_layers(spec):
        return "cross-attention layers' image caches are not"
    return None
