"""Byte accounting: :func:`weight_bytes` sizes every parameter tensor of a spec in one weight format and
totals the bytes by component, decoder layer and storage kind (:class:`WeightBytes`), with the formula and
sources that explain them.

HF-side formats go tensor by tensor through the rules of :mod:`.hf_quant`; GGUF formats take the per-tensor
plan of :mod:`.gguf_plan`. A decoder layer is sized once per kind of layer and repeated (:mod:`.layout`);
results are cached per (spec, format, options).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from pydantic import Field

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats.gguf_plan import _plan_rows
from gpumem_gui.core.formats.gguf_types import _GGML_FLOATS
from gpumem_gui.core.formats.hf_quant import _expert_matrices, _matrix_parts, _quantizes, _role
from gpumem_gui.core.formats.layout import _layout
from gpumem_gui.core.formats.registry import _REGISTRY, _resolve
from gpumem_gui.core.formats.scheme import Parts, WeightFormat, _Scheme
from gpumem_gui.core.results.estimate import Explanation
from gpumem_gui.core.spec.model import Frozen, ModelSpec
from gpumem_gui.core.spec.params import COMPONENTS, Tensor

_VISION_NOTE = "the vision tower and projector are never quantized: they stay at the compute dtype"


class WeightBytes(Frozen):
    """Bytes of a model's weights in one format, split by component, decoder layer and storage kind.

    ``by_component`` has every component of :data:`~gpumem_gui.core.spec.params.COMPONENTS` (vision included);
    ``per_layer`` the bytes of each decoder layer. ``quantized_params``/``quantized_bytes`` cover the
    tensors the format quantizes, their scales and indices included; ``bits_per_param`` is the average
    over all parameters.
    """

    format: str
    total_bytes: int = Field(ge=0)
    params: int = Field(ge=0)
    quantized_params: int = Field(ge=0)
    quantized_bytes: int = Field(ge=0)
    by_component: dict[str, int]
    per_layer: tuple[int, ...]
    by_storage: dict[str, int]
    bits_per_param: float = Field(ge=0)
    notes: tuple[str, ...] = ()
    explain: Explanation

    @property
    def quantized_bits_per_param(self) -> float:
        """Average bits of the quantized tensors (0 when the format quantizes nothing)."""
        return self.quantized_bytes * 8 / self.quantized_params if self.quantized_params else 0.0


class _Acc:
    """Running totals while the tensors are sized."""

    def __init__(self, num_layers: int) -> None:
        self.by_component = dict.fromkeys(COMPONENTS, 0)
        self.per_layer = [0] * num_layers
        self.by_storage: dict[str, int] = {}
        self.params = 0
        self.q_params = 0
        self.q_bytes = 0
        self.total = 0

    def add(self, component: str, layer: int | None, numel: int, parts: Parts, quantized: bool) -> None:
        total = 0
        for label, nbytes in parts:
            self.by_storage[label] = self.by_storage.get(label, 0) + nbytes
            total += nbytes
        self.by_component[component] += total
        if layer is not None:
            self.per_layer[layer] += total
        self.total += total
        self.params += numel
        if quantized:
            self.q_params += numel
            self.q_bytes += total

    def repeat(self, layer: _Acc, layers: list[int]) -> None:
        """Add ``layer`` (one decoder layer's totals) once for each layer index in ``layers``."""
        n = len(layers)
        for k, v in layer.by_component.items():
            self.by_component[k] += v * n
        for k, v in layer.by_storage.items():
            self.by_storage[k] = self.by_storage.get(k, 0) + v * n
        for i in layers:
            self.per_layer[i] += layer.total
        self.total += layer.total * n
        self.params += layer.params * n
        self.q_params += layer.q_params * n
        self.q_bytes += layer.q_bytes * n


def _kept_label(nbytes: int) -> str:
    return "fp32 (kept)" if nbytes == 4 else "16-bit float (kept)"


def _hf_tensors(
    acc: _Acc,
    tensors: Iterable[Tensor],
    spec: ModelSpec,
    fmt: WeightFormat,
    scheme: _Scheme,
    cdt: int,
    qe: bool,
) -> None:
    kept = _kept_label(cdt)
    last_weight, last_quantized = "", False
    for t in tensors:
        numel = t.numel
        if t.fp32:  # kept in fp32 whatever the format (DeepSeek-V4: spec/compressed.py is_fp32)
            acc.add(t.component, None, numel, ((_kept_label(4), 4 * numel),), False)
            continue
        if scheme.kind == "float":
            acc.add(t.component, None, numel, ((fmt.id, numel * scheme.float_bytes),), False)
            continue
        role = _role(t)
        if role == "bias":
            owner = t.name.rpartition(".")[0]
            fp16_bias = scheme.kind in ("gptq", "awq") and last_quantized and owner == last_weight
            # GPTQ/AWQ QuantLinear keep the bias as an fp16 buffer; elsewhere it stays in the compute dtype
            parts: Parts = (("fp16 bias", 2 * numel),) if fp16_bias else ((kept, cdt * numel),)
            acc.add(t.component, None, numel, parts, False)
            continue
        quantized = False
        parts = ((kept, cdt * numel),)
        if _quantizes(scheme, role, qe):
            if role == "experts":
                count, out, inp = _expert_matrices(t, spec.mlp_gated)
                one = _matrix_parts(scheme, out, inp)
                if one is not None:
                    parts, quantized = tuple((lab, b * count) for lab, b in one), True
            else:
                one = _matrix_parts(scheme, t.shape[0], t.shape[1])
                if one is not None:
                    parts, quantized = one, True
        last_weight, last_quantized = t.name.rpartition(".")[0], quantized
        acc.add(t.component, None, numel, parts, quantized)


def _hf_bytes(spec: ModelSpec, fmt: WeightFormat, scheme: _Scheme, cdt: int, quantize_experts: bool) -> _Acc:
    lay = _layout(spec)
    acc = _Acc(spec.num_layers)
    _hf_tensors(acc, lay.outside, spec, fmt, scheme, cdt, quantize_experts)
    for k, tensors in enumerate(lay.kinds):
        one = _Acc(0)
        _hf_tensors(one, tensors, spec, fmt, scheme, cdt, quantize_experts)
        acc.repeat(one, [i for i, kind in enumerate(lay.layer_kind) if kind == k])
    return acc


def _gguf_bytes(spec: ModelSpec, scheme: _Scheme) -> tuple[_Acc, tuple[str, ...]]:
    acc = _Acc(spec.num_layers)
    notes: dict[str, int] = {}
    by_component, by_storage, per_layer = acc.by_component, acc.by_storage, acc.per_layer
    for layer, tp, t, nbytes, note in _plan_rows(spec, scheme):
        by_component[tp[2]] += nbytes
        by_storage[t] = by_storage.get(t, 0) + nbytes
        if layer is not None:
            per_layer[layer] += nbytes
        acc.total += nbytes
        acc.params += tp[6]
        if t not in _GGML_FLOATS:
            acc.q_params += tp[6]
            acc.q_bytes += nbytes
        if note:
            notes[note] = notes.get(note, 0) + 1
    return acc, tuple(f"{n} tensor(s): {text}" for text, n in notes.items())


def _explain(fmt: WeightFormat, scheme: _Scheme, cdt: int, vision_bytes: int, quantize_experts: bool) -> str:
    if scheme.kind == "float":
        tower = " including the vision tower" if vision_bytes else ""
        return f"weights = P x {scheme.float_bytes} B ({fmt.id}), every parameter{tower}"
    kept = f"{cdt} B ({'fp32' if cdt == 4 else 'bf16/fp16'})"
    b, g = scheme.bits, scheme.group
    skip = f"modules with out or in not a multiple of 32, or in not a multiple of {g}, stay unquantized"
    base = {
        "fp8": "quantized linears: out x in x 1 B (fp8 e4m3) + 4 B fp32 scale per tensor (per expert)",
        "fp8-block": "quantized linears: out x in x 1 B + 4 B x ceil(out/128) x ceil(in/128) block scales",
        "int8": "quantized linears: out x in x 1 B (int8) + 4 B x out (fp32 SCB row scales)",
        "bnb4": (
            "quantized linears: n/2 B packed 4-bit + per 64 weights "
            + (
                "1 B absmax + 4 B per 256 blocks nested absmax + 1092 B state"
                if scheme.double_quant
                else "4 B fp32 absmax + 64 B quant_map"
            )
            + " per module (n = out x in)"
        ),
        "gptq": f"quantized linears: in x out x {b}/8 B qweight + (in/{g}) x out x 2 B fp16 scales "
        f"+ (in/{g}) x out x {b}/8 B qzeros + in x 4 B g_idx; {skip}",
        "awq": f"quantized linears: in x out/2 B qweight + (in/{g}) x out x 2 B fp16 scales + "
        f"(in/{g}) x out/2 B qzeros; {skip}",
        "mxfp4": "quantized tensors: out x ceil(in/32) blocks x (16 B E2M1 + 1 B E8M0 scale)",
        "nvfp4": "quantized linears: out x in/2 B E2M1 + out x in/16 B fp8 scales + 8 B fp32 global "
        "scales; in not a multiple of 16 stays unquantized",
        "gguf": "every tensor: rows x (ne0 / block) x block bytes of its ggml type, the type chosen per "
        "tensor as llama-quantize does (llama_tensor_get_type); 1-D tensors, routers and biases F32",
    }[scheme.kind]
    if scheme.kind == "gguf":
        return base + (f"; {_VISION_NOTE} ({vision_bytes} B, the mmproj file)" if vision_bytes else "")
    rest = f"; everything else (embeddings, lm_head, norms, routers, biases) at {kept}"
    if not quantize_experts:
        rest += "; routed experts kept unquantized"
    return base + rest + (f"; {_VISION_NOTE}" if vision_bytes else "")


def _compute(spec: ModelSpec, fmt_id: str, cdt: int, quantize_experts: bool) -> WeightBytes:
    fmt, scheme = _REGISTRY[fmt_id]
    notes: tuple[str, ...] = ()
    if scheme.kind == "gguf":
        acc, notes = _gguf_bytes(spec, scheme)
    else:
        acc = _hf_bytes(spec, fmt, scheme, cdt, quantize_experts)
    vision = spec.vision.params if spec.vision is not None else 0
    vb = 0
    if vision:
        vb = scheme.float_bytes if scheme.kind == "float" else cdt
        if scheme.kind == "gguf" and scheme.ggml_type in _GGML_FLOATS:
            vb = 4 if scheme.ggml_type == "F32" else 2
        label = fmt.id if scheme.kind == "float" else f"vision ({_kept_label(vb)})"
        acc.add("vision", None, vision, ((label, vision * vb),), False)
    total = sum(acc.by_component.values())
    quantized_bits = acc.q_bytes * 8 / acc.q_params if acc.q_params else 0.0
    inputs: dict[str, int | float | str | bool | None] = {
        "format": fmt.id,
        "params": acc.params,
        "quantized_params": acc.q_params,
        "kept_params": acc.params - acc.q_params,
        "quantized_bits_per_param": round(quantized_bits, 4),
        "compute_dtype_bytes": cdt,
        "vision_params": vision,
    }
    if scheme.kind in ("gptq", "awq"):
        inputs["group_size"] = scheme.group
        inputs["bits"] = scheme.bits
    if scheme.kind == "gguf":
        inputs["ftype"] = scheme.ftype or f"pure {scheme.ggml_type}"
        for label, nbytes in sorted(acc.by_storage.items(), key=lambda kv: -kv[1]):
            inputs[f"bytes {label}"] = nbytes
    return WeightBytes(
        format=fmt.id,
        total_bytes=total,
        params=acc.params,
        quantized_params=acc.q_params,
        quantized_bytes=acc.q_bytes,
        by_component=acc.by_component,
        per_layer=tuple(acc.per_layer),
        by_storage=dict(sorted(acc.by_storage.items(), key=lambda kv: -kv[1])),
        bits_per_param=total * 8 / acc.params if acc.params else 0.0,
        notes=notes,
        explain=Explanation(
            formula=_explain(fmt, scheme, cdt, vb, quantize_experts),
            inputs=inputs,
            source=fmt.source,
        ),
    )


@functools.lru_cache(maxsize=512)
def _cached(spec: ModelSpec, fmt_id: str, cdt: int, quantize_experts: bool) -> WeightBytes:
    return _compute(spec, fmt_id, cdt, quantize_experts)


def weight_bytes(
    spec: ModelSpec, fmt_id: str, *, compute_dtype_bytes: int = 2, quantize_experts: bool = True
) -> WeightBytes:
    """Exact bytes of ``spec``'s weights stored in format ``fmt_id``.

    ``compute_dtype_bytes`` (2: bf16/fp16, 4: fp32) is the width of every tensor the format leaves
    unquantized. ``quantize_experts=False`` keeps routed experts at the compute dtype, as transformers >= 5
    with bitsandbytes does (fused 3-D expert parameters are not ``nn.Linear``; bitsandbytes issue #1849).
    Results are cached per (spec, format, options).
    """
    fmt, _ = _resolve(fmt_id)
    if compute_dtype_bytes not in (2, 4):
        raise GpumemInputError(
            f"compute dtype must be 2 (bf16/fp16) or 4 (fp32) bytes, got {compute_dtype_bytes}",
            field="compute_dtype",
        )
    try:
        hash(spec)
    except TypeError:  # a spec with an unhashable field: compute without the cache
        return _compute(spec, fmt.id, compute_dtype_bytes, quantize_experts)
    return _cached(spec, fmt.id, compute_dtype_bytes, quantize_experts)
