"""transformers' ``DynamicCache`` on symbolic tensors (``cache_utils.py``, transformers 5.24).

``DynamicLayer.update`` concatenates the new keys/values onto the stored ones into a new tensor
(``torch.cat``) and frees the old one; ``DynamicSlidingWindowLayer.update`` concatenates too, returns the full
concatenation to the attention and keeps a *view* of its last ``window - 1`` tokens, so the stored tensor's
storage stays as long as that concatenation until the next step replaces it. MLA layers (DeepSeek) cache the
compressed latent and the shared rope key as two single-head tensors; Falcon's new decoder architecture
caches K/V already broadcast to every query head (:attr:`ModelSpec.transformers_expands_kv`).

Only the layers the forward replays op by op keep tensors of their own; the caches of the others are one
aggregate storage that grows by their concatenations as the forward passes them.
"""

from __future__ import annotations

from gpumem_gui.core.replay.autograd import Sim
from gpumem_gui.core.replay.linear_attention import RecurrentStates
from gpumem_gui.core.replay.memory import Storage, T
from gpumem_gui.core.spec.kinds import LatentAttention
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.kv import kv_elements_per_layer, layer_windows
from gpumem_gui.core.spec.model import ModelSpec


def indexer_elems_per_layer(spec: ModelSpec) -> tuple[int, ...]:
    """Elements one token adds to each layer's DSA indexer key cache (``DynamicIndexedLayer.indexer_keys``;
    0 without an indexer, or in a layer sharing another's top-k): the layer kinds' ``indexer_dim``."""
    kinds = model_kinds(spec)
    return kinds.per_layer(lambda k: k.indexer_dim, kinds.of(LatentAttention))


def stored_tokens(spec: ModelSpec, past: int, window: int | None) -> int:
    """Tokens a layer's cache storage holds before a step that follows ``past`` tokens of a generation: a
    full layer all of them; a sliding (or chunked) layer the previous step's concatenation (at most
    ``window``)."""
    if window:
        return min(past, window)
    return past


def tokens_after(spec: ModelSpec, past: int, q: int, window: int | None) -> int:
    """Tokens of a layer's storage after a forward of ``q`` tokens: the kept past (a sliding or chunked layer
    keeps a ``window - 1`` view) concatenated with the new ones."""
    if window:
        past = min(past, window - 1)
    return past + q


class KVCache:
    """The cache of one forward: per-layer tensors of the replayed layers, one aggregate for the rest."""

    def __init__(
        self,
        sim: Sim,
        spec: ModelSpec,
        batch: int,
        past: int,
        kv_bytes: float,
        dt: str,
        replayed: frozenset[int],
    ) -> None:
        self.sim = sim
        self.spec = spec
        self.batch = batch
        self.past = past
        self.kv_bytes = kv_bytes
        self.dt = dt
        # the DSA indexer keys are a third tensor per layer (replay/dsa.py); K is the latent alone
        self.ix = indexer_elems_per_layer(spec)
        self.els = tuple((k - ix, v) for (k, v), ix in zip(kv_elements_per_layer(spec), self.ix, strict=True))
        self.index: dict[int, T] = {}
        # each layer's cache window (sliding_window, attention_chunk_size) or None (spec/kv.py layer_windows)
        self.sliding = layer_windows(spec)
        self.layers: dict[int, tuple[T, T]] = {}
        # linear-attention layers keep no keys or values, a fixed state instead (replay/linear_attention.py)
        self.state = RecurrentStates(sim, spec, batch, past, dt, replayed)
        self.replayed = replayed
        other = 0
        for i in range(spec.num_layers):
            toks = stored_tokens(spec, past, self.sliding[i])
            if toks and self._cached(i):
                other += self._store(i, toks) or 0
        self.other: Storage = sim.storage(other, "kv_cache")
        # what a model's own cache layers keep (DeepSeek-V4's compressed layers: replay/dsv4.py), by layer
        self.own: dict[int, object] = {}

    def _cached(self, layer: int) -> bool:
        """Whether ``layer`` keeps keys and values: not a linear-attention layer (a fixed state instead), nor
        one sharing another layer's cache (Gemma 3n)."""
        return not self.state.linear[layer] and layer not in self.spec.kv_shared_layers

    def _store(self, layer: int, toks: int) -> int | None:
        """Hold ``toks`` tokens of ``layer``'s keys and values (and DSA indexer keys): tensors of its own for
        a replayed layer (None returned), else the bytes the caller adds to the aggregate of the others."""
        k_el, v_el = self._el(layer)
        ix = self.ix[layer]
        if layer in self.replayed:
            self.layers[layer] = (self._tensor(toks * k_el), self._tensor(toks * v_el))
            if ix:
                self.index[layer] = self._tensor(toks * ix)
            return None
        return self._bytes(toks * k_el) + self._bytes(toks * v_el) + (self._bytes(toks * ix) if ix else 0)

    def _el(self, layer: int) -> tuple[int, int]:
        """(K, V) elements per token of ``layer``'s cache (its layer kind's; spec/kinds.py)."""
        return self.els[layer]

    def _bytes(self, elems: int) -> int:
        return round(self.batch * elems * self.kv_bytes)

    def _tensor(self, elems_per_seq: int) -> T:
        n = self.batch * elems_per_seq
        return T(self.sim.storage(self._bytes(elems_per_seq), "kv_cache"), n, self.dt)

    def update(self, layer: int, k: T, v: T, q: int) -> tuple[T, T]:
        """``cache.update(key_states, value_states, layer)``: the concatenations the attention reads."""
        toks = tokens_after(self.spec, self.past, q, self.sliding[layer])
        prev = self.layers.pop(layer, None)
        k_el, v_el = self._el(layer)
        k_full = self._tensor(toks * k_el)
        prev_v = prev[1] if prev is not None else None
        del prev  # the old keys go once the new concatenation replaces them
        v_full = self._tensor(toks * v_el)
        del prev_v
        self.layers[layer] = (k_full, v_full)
        return k_full, v_full

    def skip(self, first: int, stop: int, q: int) -> None:
        """Layers ``first`` to ``stop - 1`` run without being replayed: their caches grow by the concatenation
        each makes (applied at once; a skipped layer's transient peak is below its replayed kind's)."""
        growth = 0
        self.state.skip(first, stop)
        for i in range(first, stop):
            if not self._cached(i):
                continue
            sl = self.sliding[i]
            before = stored_tokens(self.spec, self.past, sl)
            after = tokens_after(self.spec, self.past, q, sl)
            k_el, v_el = self._el(i)
            growth += self._bytes(after * k_el) + self._bytes(after * v_el)
            growth -= self._bytes(before * k_el) + self._bytes(before * v_el) if before else 0
            if self.ix[i]:
                growth += self._bytes(after * self.ix[i])
                growth -= self._bytes(before * self.ix[i]) if before else 0
        if growth:
            self.other.grow(growth)

    def update_indexer(self, layer: int, q: int) -> T:
        """``cache.update_indexer(k, layer)`` (DynamicIndexedLayer): the concatenated indexer keys."""
        toks = tokens_after(self.spec, self.past, q, self.sliding[layer])
        full = self._tensor(toks * self.ix[layer])
        self.index[layer] = full  # the old keys go once the new concatenation replaces them
        return full

    def stored_bytes(self) -> int:
        ix = sum(t.st.nbytes for t in self.index.values())  # type: ignore[union-attr]
        ix += sum(getattr(c, "nbytes", 0) for c in self.own.values())
        return ix + self.other.nbytes + sum(k.st.nbytes + v.st.nbytes for k, v in self.layers.values())  # type: ignore[union-attr]
