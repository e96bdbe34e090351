"""The registry of weight formats: every format by id, HF-side ones first (:mod:`.hf_quant`), then the
llama.cpp mixes and single ggml types (:mod:`.gguf_types`); :func:`get_weight_format` looks one up,
case-insensitively, and suggests close ids for a typo."""

from __future__ import annotations

import difflib

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats.gguf_types import _gguf_formats
from gpumem_gui.core.formats.hf_quant import _hf_formats
from gpumem_gui.core.formats.scheme import WeightFormat, _Scheme


def _build_registry() -> dict[str, tuple[WeightFormat, _Scheme]]:
    reg: dict[str, tuple[WeightFormat, _Scheme]] = {}
    for fmt, scheme in (*_hf_formats(), *_gguf_formats()):
        if fmt.id in reg:
            raise AssertionError(f"duplicate weight format id {fmt.id}")
        reg[fmt.id] = (fmt, scheme)
    return reg


_REGISTRY = _build_registry()
_LOWER_IDS = {k.lower(): k for k in _REGISTRY}


def list_weight_formats() -> list[WeightFormat]:
    """Every weight format, HF-side formats first, then llama.cpp mixes, then single GGUF tensor types."""
    return [fmt for fmt, _ in _REGISTRY.values()]


def _resolve(fmt_id: str) -> tuple[WeightFormat, _Scheme]:
    key = fmt_id.strip() if isinstance(fmt_id, str) else ""
    hit = _REGISTRY.get(key) or _REGISTRY.get(_LOWER_IDS.get(key.lower(), ""))
    if hit is not None:
        return hit
    close = difflib.get_close_matches(key.lower(), list(_LOWER_IDS), n=5, cutoff=0.5)
    hint = f"; did you mean {', '.join(_LOWER_IDS[c] for c in close)}?" if close else ""
    raise GpumemInputError(
        f"unknown weight format {fmt_id!r}{hint} (`gpumem formats` lists all {len(_REGISTRY)})",
        field="weights",
    )


def get_weight_format(fmt_id: str) -> WeightFormat:
    """The format called ``fmt_id`` (case-insensitive); an unknown id raises :class:`GpumemInputError`."""
    return _resolve(fmt_id)[0]
