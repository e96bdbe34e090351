"""Gemma 3n's additions to a decoder (``models/gemma3n/modeling_gemma3n.py``, transformers 5.24): per-layer
input embeddings, AltUp's parallel copies of the hidden state and the Laurel low-rank residual, as data
(:class:`AltUpSpec`), and the parameter tensors they add (:func:`altup_tensors`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pydantic import Field

from gpumem_gui.core.spec.base import Frozen, PositiveInt

if TYPE_CHECKING:  # params.Tensor is built lazily to keep spec.params -> spec.altup one-way at import
    from gpumem_gui.core.spec.model import ModelSpec
    from gpumem_gui.core.spec.params import Tensor


class AltUpSpec(Frozen):
    """Gemma3nTextModel's per-layer inputs and Gemma3nTextDecoderLayer's AltUp / Laurel blocks."""

    per_layer_vocab_size: PositiveInt = Field(
        description="rows of the per-layer embedding table (vocab_size_per_layer_input; "
        "Gemma3nTextModel.embed_tokens_per_layer)"
    )
    per_layer_input_size: PositiveInt = Field(
        description="width each layer's slice of the per-layer embedding has (hidden_size_per_layer_input): "
        "the table holds num_layers x this per token"
    )
    num_inputs: PositiveInt = Field(
        description="parallel copies of the hidden state AltUp carries through every layer "
        "(altup_num_inputs): Gemma3nTextModel stacks them into [num_inputs, batch, seq, hidden]"
    )
    laurel_rank: PositiveInt = Field(
        description="Gemma3nTextLaurelBlock's low rank: linear_left (hidden -> rank), linear_right back"
    )

    @property
    def table_params(self) -> int:
        """Elements of embed_tokens_per_layer per decoder layer (the table has num_layers x this)."""
        return self.per_layer_vocab_size * self.per_layer_input_size

    sparse_layers: tuple[int, ...] = Field(
        (),
        description="layers whose MLP gate runs Gemma3nTextMLP._gaussian_topk "
        "(activation_sparsity_pattern > 0)",
    )


def altup_tensors(spec: ModelSpec, tensor: type[Tensor]) -> Iterator[Tensor]:
    """The tensors Gemma3nTextModel and each Gemma3nTextDecoderLayer add to a Gemma-3-like decoder: the
    model's per-layer table, projection and norm, the altup (un)embed projections; per layer the AltUp module
    (correct_output_scale, correction_coefs, prediction_coefs, modality_router, router_norm), the Laurel block
    and the per-layer input gate, projection and norm."""
    a, h, n = spec.altup, spec.hidden_size, spec.num_layers
    assert a is not None
    p, k = a.per_layer_input_size, a.num_inputs
    yield tensor("embed_tokens_per_layer.weight", (a.per_layer_vocab_size, n * p), "embedding_extra")
    yield tensor("per_layer_model_projection.weight", (n * p, h), "embedding_extra")
    yield tensor("per_layer_projection_norm.weight", (p,), "norms")
    for j in range(1, k):
        yield tensor(f"altup_projections.{j - 1}.weight", (h, h), "embedding_extra")
        yield tensor(f"altup_unembed_projections.{j - 1}.weight", (h, h), "embedding_extra")
    for i in range(n):
        pre = f"layers.{i}"
        yield tensor(f"{pre}.altup.correct_output_scale", (h,), "attention", i)
        yield tensor(f"{pre}.altup.correction_coefs.weight", (k, k), "attention", i)
        yield tensor(f"{pre}.altup.prediction_coefs.weight", (k * k, k), "attention", i)
        yield tensor(f"{pre}.altup.modality_router.weight", (k, h), "attention", i)
        yield tensor(f"{pre}.altup.router_norm.weight", (h,), "norms", i)
        yield tensor(f"{pre}.laurel.linear_left.weight", (a.laurel_rank, h), "attention", i)
        yield tensor(f"{pre}.laurel.linear_right.weight", (h, a.laurel_rank), "attention", i)
        yield tensor(f"{pre}.laurel.post_laurel_norm.weight", (h,), "norms", i)
        yield tensor(f"{pre}.per_layer_input_gate.weight", (p, h), "mlp", i)
        yield tensor(f"{pre}.per_layer_projection.weight", (h, p), "mlp", i)
        yield tensor(f"{pre}.post_per_layer_input_norm.weight", (h,), "norms", i)


def altup_layer_kinds(spec: ModelSpec) -> tuple[int, tuple[int, ...], ModelSpec]:
    """The layer kinds whose tensors differ (formats/layout.py): layers with their own k/v projections and
    KV-shared layers without (Gemma3nTextAttention); each layer's kind; a spec with one layer of each. The
    model-level tensors depend on every layer (the per-layer table's width): the layout takes them from
    the full spec."""
    shared = spec.kv_shared_layers
    kinds = 2 if shared else 1
    layer_kind = tuple(int(i in shared) for i in range(spec.num_layers))
    mini = spec.model_copy(
        update={"num_layers": kinds, "layer_types": (), "kv_shared_layers": (1,) if shared else ()}
    )
    return kinds, layer_kind, mini
