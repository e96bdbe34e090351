"""What a replayed block sees of the model it runs in: the :class:`CausalLM` protocol.

The blocks (attention, MLP, the recurrent mixers, adapters, losses, ...) take the model as their first
argument and use these attributes of it; they type it with this protocol instead of importing the model
(:class:`gpumem_gui.core.replay.model.CausalLM`), so that the replay's imports run one way, from the model
down to its blocks, and a new block never imports the centre that calls it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gpumem_gui.core.replay.autograd import Param, Sim
    from gpumem_gui.core.replay.config import LayerPlan, ReplayConfig
    from gpumem_gui.core.replay.memory import T
    from gpumem_gui.core.replay.ops import Ops
    from gpumem_gui.core.spec.model import ModelSpec
    from gpumem_gui.core.spec.seq2seq import Seq2SeqSpec


class CausalLM(Protocol):
    """The model of one (rank's) replay as its blocks use it (``replay/model.py`` implements it)."""

    s: Sim  # the symbolic runtime: tracker, grad mode, autocast, checkpointing
    o: Ops  # the ops (linear, add, softmax, dropout, ...)
    spec: ModelSpec
    cfg: ReplayConfig
    # the forward's KVCache (replay/cache.py) or None: not imported (cache.py sits above the blocks)
    cache: Any
    p: dict[str, Param]
    shape: dict[str, tuple[int, ...]]
    quantized: set[str]
    unused: set[str]
    alibi_bias: T | None

    def has(self, name: str) -> bool: ...

    def param(self, name: str) -> T: ...

    def w(self, name: str) -> T | None: ...

    def linear(self, x: T, name: str) -> T: ...

    def norm(self, x: T, name: str) -> T: ...

    def region_norm(self, x: T, name: str) -> T: ...

    def layer(
        self, i: int, hidden_states: T, cos: T | None, sin: T | None, mask: T | None
    ) -> tuple[T, T | None]: ...

    def model(self, ids: T, plan: LayerPlan) -> T: ...

    def head(self, last_hidden_state: T) -> T: ...


class EncoderLike(CausalLM, Protocol):
    """An encoder model (``replay/encoder.py`` EncoderModel) as its DeBERTa and ModernBERT blocks use it."""

    def _first_token(self, last: T) -> T: ...

    def _classifier_dropout(self) -> float: ...


class Seq2SeqLike(CausalLM, Protocol):
    """An encoder-decoder (``replay/seq2seq.py`` Seq2SeqLM) as its attention blocks use it."""

    s2s: Seq2SeqSpec
