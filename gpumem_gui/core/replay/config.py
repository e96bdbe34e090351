"""What one replayed forward is: its shapes, dtypes and options (:class:`ReplayConfig`), and which decoder
layers an inference replay runs (:class:`LayerPlan`: the last layer of each kind stands for its kind)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from gpumem_gui.core.spec.model import ModelSpec


@dataclass(frozen=True)
class ReplayConfig:
    """One forward (and, in training, its backward): shapes, dtypes and the model's options."""

    batch: int
    q: int  # new tokens per sequence in this forward
    param_dt: str  # dtype of the model's float weights
    autocast: str | None = None  # lower-precision dtype of torch.autocast, None without autocast
    past: int = 0  # tokens already cached (inference decode)
    attn: str = "sdpa"
    logits_to_keep: int = 0  # 0: logits for every position; 1: the last one (generate)
    kv_bytes: float = 2  # bytes per cached element
    grad_ckpt: bool = False
    method: str = "full"  # full | lora | qlora
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ()
    lora_dropout: float = 0.0
    adapter_dt: str = "f32"
    quant_bytes: int = 0  # qlora: bytes of the 4-bit linears (packed weights + quantization state)
    frozen_layers: int = 0
    lm_head: bool = True  # this rank holds the head (and the loss)
    embedding: bool = True  # this rank holds the token embedding
    weights_counted: bool = True  # False: the weights are accounted elsewhere (inference's load phase)
    dropout: float = (
        0.0  # hidden-state dropout (residual and embedding dropouts where the architecture has them)
    )
    attn_dropout: float = 0.0  # attention-probability dropout (kept by eager attention only)
    cpu_dropout: bool = False  # replay the CPU dropout kernel (a full-dtype noise tensor) instead of CUDA's

    @property
    def kv_len(self) -> int:
        return self.past + self.q

    @property
    def tokens(self) -> int:
        return self.batch * self.q


@dataclass(frozen=True)
class LayerPlan:
    """The layers a forward replays op by op: ``segments`` holds one ``(first, layer)`` per replayed layer in
    order, layers ``first`` to ``layer - 1`` run without a replay before it (inference only: a skipped layer's
    transient peak is dominated by the last layer of its kind, which has more cache below it)."""

    segments: tuple[tuple[int, int], ...]

    @property
    def replayed(self) -> frozenset[int]:
        return frozenset(layer for _, layer in self.segments)


def layer_kind(spec: ModelSpec, i: int) -> tuple[str, bool]:
    return spec.resolved_layer_types[i], spec.is_moe_layer(i)


@lru_cache(maxsize=256)
def last_of_each_kind(spec: ModelSpec) -> LayerPlan:
    """Replay the last layer of each kind (attention type x dense/MoE); skip the rest."""
    last = {layer_kind(spec, i): i for i in range(spec.num_layers)}
    first, segments = 0, []
    for layer in sorted(last.values()):
        segments.append((first, layer))
        first = layer + 1
    return LayerPlan(tuple(segments))


def every_layer(layers: Sequence[int]) -> LayerPlan:
    return LayerPlan(tuple((i, i) for i in layers))
