"""Llama 3.2 Vision's cross-attention layers in a text-only forward (transformers 5.24,
``models/mllama/modeling_mllama.py``).

``MllamaTextModel.forward`` skips a cross-attention layer (``MllamaCrossAttentionDecoderLayer``) when it gets
no ``cross_attention_states`` and the cache holds none for it (``_has_cached_cross_attention_states``): the
layer runs no op, leaves no activation, writes no cache, and its parameters get no gradient, so torch's
optimizers keep no state for them (``torch/optim/adamw.py`` ``_init_group`` skips ``p.grad is None``). The
inference plan leaves them out (config.last_of_each_kind; their cache is empty, spec/kv.py); a training step
runs :func:`run`'s layers. What a forward with images holds in those layers (the projected vision keys and
values) is :func:`gpumem_gui.core.spec.cross_attention.cross_cache_bytes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpumem_gui.core.replay.registry import TEXT_LAYERS
from gpumem_gui.core.spec.kinds_of import model_kinds

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def run(m: CausalLM, layers: Sequence[int]) -> Sequence[int]:
    """The layers of ``layers`` a text-only forward runs; the parameters (and LoRA adapters) of the skipped
    cross-attention layers are marked unused."""
    cross = set(model_kinds(m.spec).layers_of("cross_attention"))
    skipped = tuple(f"layers.{i}." for i in layers if i in cross)
    if not skipped:
        return layers
    m.unused.update(name for name in m.p if name.startswith(skipped))
    return [i for i in layers if i not in cross]


TEXT_LAYERS.append(run)
