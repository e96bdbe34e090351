"""The replay's variants, registered by kind: the forward looks a layer's block up by the architecture's
block kind (``ArchTraits.block``), its token mixer by the layer's kind (the ``RecurrentState.mixer`` of
:mod:`gpumem_gui.core.spec.kinds`, else ``"attention"``), a model's own forward around its layers by
``ArchTraits.model_forward``, a norm of its own by the trait asking for it, and runs every registered hook
at the end of the layer loop and on the layers a text-only forward runs; never by importing the variant that
runs it. Each variant module registers what it runs when it is imported; :mod:`.variants` imports them all,
and is the one place that names them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from gpumem_gui.core.spec.kinds_of import model_kinds

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM
    from gpumem_gui.core.replay.memory import T

# (m, layer, hidden_states, cos, sin, mask) -> (output, attention weights or None)
Layer = Callable[..., "tuple[T, T | None]"]

# a whole decoder layer of its own, by ArchTraits.block ("falcon", "bloom", "minimax", "single",
# "parallel_mamba"); the standard block ("llama") is replay/block.py's decoder_layer
BLOCKS: dict[str, Layer] = {}
# a token mixer by layer kind: "attention", or a RecurrentState.mixer ("gated_deltanet", "kda", "mamba1",
# "mamba2", "short_conv")
MIXERS: dict[str, Layer] = {}
# a model's own forward around its layers, by ArchTraits.model_forward ("altup", "gemma4"); "llama" is
# CausalLM.model itself: (m, input_ids, plan) -> the final norm's output
MODELS: dict[str, Callable[..., T]] = {}
# a norm of its own, by the ArchTraits flag asking for it: "layernorm_ops" (m, x, name) -> out
# (Cohere2LayerNorm), "norm_product_fp32" (m, x, weight, width) -> out (GptOssRMSNorm)
NORMS: dict[str, Callable[..., T]] = {}
# what the model's forward drops when its layer loop ends (GlmMoeDsaModel's carried top-k): each runs once
AFTER_LAYERS: list[Callable[[CausalLM], None]] = []
# the layers of a plan a text-only training forward runs (Llama 3.2 Vision skips its cross-attention layers
# and marks their parameters unused): each narrows the list in turn
TEXT_LAYERS: list[Callable[[CausalLM, Sequence[int]], Sequence[int]]] = []

F = TypeVar("F", bound=Callable[..., object])


def register(table: dict[str, F], key: str) -> Callable[[F], F]:
    """A decorator: ``fn`` runs ``key`` in ``table``."""

    def add(fn: F) -> F:
        table[key] = fn
        return fn

    return add


def _lookup(table: dict[str, F], key: str, what: str) -> F:
    fn = table.get(key)
    if fn is None:  # a bug of the replay's imports (replay/variants.py), never a silent fallback
        raise RuntimeError(f"no replayed {what} is registered for {key!r} (replay/variants.py imports them)")
    return fn


def block(m: CausalLM) -> Layer | None:
    """The architecture's own decoder layer, or None for the standard one."""
    key = m.spec.traits.block
    return None if key == "llama" else _lookup(BLOCKS, key, "block")


def model_forward(m: CausalLM) -> Callable[..., T] | None:
    """The architecture's own forward around its layers, or None for LlamaModel.forward."""
    key = m.spec.traits.model_forward
    return None if key == "llama" else _lookup(MODELS, key, "model forward")


def norm(key: str) -> Callable[..., T]:
    """The norm an ArchTraits flag ``key`` asks for."""
    return _lookup(NORMS, key, "norm")


def mixer(m: CausalLM, i: int) -> Layer:
    """The token mixer of layer ``i``: its recurrent state kind's mixer, else attention."""
    for kind in model_kinds(m.spec).state:
        if i in kind.layers:
            return _lookup(MIXERS, kind.mixer, "token mixer")
    return _lookup(MIXERS, "attention", "token mixer")
