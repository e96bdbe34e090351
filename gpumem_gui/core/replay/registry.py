"""The replay's blocks and token mixers, registered by kind: the forward looks a layer's block up by the
architecture's block kind (``ArchTraits.block``) and its token mixer by the layer's kind (the
``RecurrentState.mixer`` of :mod:`gpumem_gui.core.spec.kinds`, else ``"attention"``), never by importing the
variant that runs it. Each variant module registers what it runs when it is imported; :mod:`.variants`
imports them all, and is the one place that names them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpumem_gui.core.spec.kinds import model_kinds

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


def register(table: dict[str, Layer], key: str) -> Callable[[Layer], Layer]:
    """A decorator: ``fn`` runs ``key`` in ``table``."""

    def add(fn: Layer) -> Layer:
        table[key] = fn
        return fn

    return add


def _lookup(table: dict[str, Layer], key: str, what: str) -> Layer:
    fn = table.get(key)
    if fn is None:  # a bug of the replay's imports (replay/variants.py), never a silent fallback
        raise RuntimeError(f"no replayed {what} is registered for {key!r} (replay/variants.py imports them)")
    return fn


def block(m: CausalLM) -> Layer | None:
    """The architecture's own decoder layer, or None for the standard one."""
    key = m.spec.traits.block
    return None if key == "llama" else _lookup(BLOCKS, key, "block")


def mixer(m: CausalLM, i: int) -> Layer:
    """The token mixer of layer ``i``: its recurrent state kind's mixer, else attention."""
    for kind in model_kinds(m.spec).state:
        if i in kind.layers:
            return _lookup(MIXERS, kind.mixer, "token mixer")
    return _lookup(MIXERS, "attention", "token mixer")
