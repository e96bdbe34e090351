"""The registry of weight formats: every format by id, HF-side ones first (:mod:`.hf_quant`), then the
llama.cpp mixes and single ggml types (:mod:`.gguf_types`); :func:`get_weight_format` looks one up,
case-insensitively, and suggests close ids for a typo."""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterator, Mapping

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats.gguf_types import _gguf_formats
from gpumem_gui.core.formats.hf_quant import _hf_formats
from gpumem_gui.core.formats.scheme import WeightFormat, _Scheme

Entry = tuple[WeightFormat, _Scheme]


def _add(reg: dict[str, Entry], entries: Iterator[Entry]) -> dict[str, Entry]:
    for fmt, scheme in entries:
        if fmt.id in reg:
            raise AssertionError(f"duplicate weight format id {fmt.id}")
        reg[fmt.id] = (fmt, scheme)
    return reg


@functools.cache
def _hf_registry() -> dict[str, Entry]:
    return _add({}, _hf_formats())


@functools.cache
def _build_registry() -> dict[str, Entry]:
    """Every format: the HF-side ones (the same objects), then the GGUF ones (which import gguf-py)."""
    return _add(dict(_hf_registry()), _gguf_formats())


class _Registry(Mapping[str, Entry]):
    """The registry by id, built on first use. An HF-side id is answered from the HF-side formats alone;
    anything else builds the GGUF entries too (they import gguf-py, ~0.1 s, which the window's first paint
    should not wait for: issue 18). What it answers is the same either way."""

    def __getitem__(self, fmt_id: str) -> Entry:
        hit = _hf_registry().get(fmt_id)
        return hit if hit is not None else _build_registry()[fmt_id]

    def __iter__(self) -> Iterator[str]:
        return iter(_build_registry())

    def __len__(self) -> int:
        return len(_build_registry())


_REGISTRY = _Registry()


@functools.cache
def _lower_ids() -> dict[str, str]:
    return {k.lower(): k for k in _build_registry()}


def list_weight_formats() -> list[WeightFormat]:
    """Every weight format, HF-side formats first, then llama.cpp mixes, then single GGUF tensor types."""
    return [fmt for fmt, _ in _build_registry().values()]


def _resolve(fmt_id: str) -> tuple[WeightFormat, _Scheme]:
    key = fmt_id.strip() if isinstance(fmt_id, str) else ""
    hit = _REGISTRY.get(key) or _REGISTRY.get(_lower_ids().get(key.lower(), ""))
    if hit is not None:
        return hit
    lower_ids = _lower_ids()
    close = difflib.get_close_matches(key.lower(), list(lower_ids), n=5, cutoff=0.5)
    hint = f"; did you mean {', '.join(lower_ids[c] for c in close)}?" if close else ""
    raise GpumemInputError(
        f"unknown weight format {fmt_id!r}{hint} (`gpumem formats` lists all {len(_REGISTRY)})",
        field="weights",
    )


def get_weight_format(fmt_id: str) -> WeightFormat:
    """The format called ``fmt_id`` (case-insensitive); an unknown id raises :class:`GpumemInputError`."""
    return _resolve(fmt_id)[0]
