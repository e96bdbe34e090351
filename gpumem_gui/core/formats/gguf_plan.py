"""The GGUF file of a spec tensor by tensor: :func:`gguf_plan` lists every tensor llama-quantize would write,
in llama.cpp's order, with the ggml type its mix picks (:mod:`.gguf_mix`) and its exact size in bytes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats.gguf_mix import (
    _ATTN_V_LIKE,
    _FTYPES_WITH_IMATRIX,
    _fallback,
    _mix_type,
    _QuantState,
)
from gpumem_gui.core.formats.gguf_types import _GGML_FLOATS, _gguf_type_bytes
from gpumem_gui.core.formats.layout import _layout, _Template
from gpumem_gui.core.formats.registry import _resolve
from gpumem_gui.core.formats.scheme import _Scheme
from gpumem_gui.core.spec.model import ModelSpec


@dataclass(frozen=True, slots=True)
class GgufTensor:
    """One tensor of a GGUF file as llama-quantize would write it.

    ``shape`` is row-major (PyTorch order; ggml's ``ne0`` is the last entry), ``ggml_type`` the chosen
    type and ``nbytes`` its exact size. ``note`` says when llama.cpp had to fall back to another type.
    """

    name: str
    shape: tuple[int, ...]
    component: str
    layer: int | None
    ggml_type: str
    nbytes: int
    note: str = ""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _plan_rows(spec: ModelSpec, scheme: _Scheme) -> Iterator[tuple[int | None, _Template, str, int, str]]:
    """(layer, template, ggml type, bytes, fallback note) of every GGUF tensor, in llama.cpp's order.

    llama-quantize visits tensors sorted by layer, then by name (llama_model_loader weights_map with
    weight_name_comparer); the per-layer counters of llama_tensor_get_type_impl follow that order.
    """
    lay = _layout(spec)
    outside, layers = lay.gguf_outside, lay.gguf_kinds
    default, ftype = scheme.ggml_type, scheme.ftype
    source_float = default if default in _GGML_FLOATS else "F16"
    wv_per_kind = [sum(tp[3] in _ATTN_V_LIKE for tp in kind) for kind in layers]
    qs = _QuantState(
        ftype=ftype,
        n_expert=spec.moe.num_experts if spec.moe is not None else 0,
        n_gqa=spec.num_attention_heads // spec.num_kv_heads,
        is_falcon=spec.traits.gguf_arch == "falcon",
        is_70b=spec.traits.gguf_arch == "llama"
        and spec.num_layers == 80
        and spec.num_attention_heads != spec.num_kv_heads,
        has_imatrix=ftype in _FTYPES_WITH_IMATRIX,
        tied=not any(tp[0] == "output.weight" for tp in outside),
        n_layer=spec.num_layers,
        n_attention_wv=sum(wv_per_kind[k] for k in lay.layer_kind),
    )
    sizes: dict[tuple[str, tuple[int, ...]], int] = {}

    def choose(tp: _Template, layer: int | None) -> tuple[int | None, _Template, str, int, str]:
        shape, cat, allows, f32 = tp[1], tp[3], tp[4], tp[5]
        note = ""
        if default == "F32":
            t = "F32"
        elif not allows:
            t = "F32" if f32 else source_float
        elif default in _GGML_FLOATS:
            t = default
        else:
            t = default
            if ftype:
                ne2 = shape[0] if len(shape) == 3 else 1
                t = _mix_type(qs, t, cat, shape[-1], ne2, layer)
            t, note = _fallback(t, shape[-1])
        key = (t, shape)
        nbytes = sizes.get(key)
        if nbytes is None:
            nbytes = sizes[key] = _gguf_type_bytes(t, shape)
        return layer, tp, t, nbytes, note

    for tp in outside:
        yield choose(tp, None)
    for i, k in enumerate(lay.layer_kind):
        for tp in layers[k]:
            yield choose(tp, i)


def gguf_plan(spec: ModelSpec, fmt_id: str) -> tuple[GgufTensor, ...]:
    """Every tensor of ``spec``'s GGUF file in format ``fmt_id``, in llama.cpp's order, with its type."""
    fmt, scheme = _resolve(fmt_id)
    if scheme.kind != "gguf":
        raise GpumemInputError(f"'{fmt.id}' is not a GGUF format", field="weights")
    return tuple(
        GgufTensor(tp[0] if layer is None else f"blk.{layer}.{tp[0]}", tp[1], tp[2], layer, t, nbytes, note)
        for layer, tp, t, nbytes, note in _plan_rows(spec, scheme)
    )
