"""The readers' file access: :mod:`gpumem_gui.files`' checked reads (regular files only, size caps, bounded
JSON) with every problem as one :class:`GpumemInputError` naming the file, and the caps of each file kind.

Caps are far above any real file of the kind and keep a mistaken path (a disk image, ``/dev/zero`` behind a
``.json`` name) from being read whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from gpumem_gui import files
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.files import PathKind

# config.json: a few KB (Llama-3.1-405B's is under 1 KB; the longest, with per-layer lists such as
# layer_types or Gemma 3n's, are tens of KB). 16 MiB is hundreds of times that.
CONFIG_JSON_MAX_BYTES = 16 << 20
# model.safetensors.index.json: one weight_map entry (~60-100 bytes) per tensor; DeepSeek-V3 in FP8 lists
# ~91k tensors (~9 MB). The safetensors reference caps one header's JSON at 100 MB (MAX_HEADER_SIZE in
# safetensors/src/tensor.rs); an index names the same tensors with less per entry, so the same cap holds.
INDEX_JSON_MAX_BYTES = 100_000_000
# the built-in catalogs (resources/*.json, resources/configs/*.json): ours, under 100 KB each today.
CATALOG_MAX_BYTES = 16 << 20


def _error(e: files.FileReadError) -> GpumemInputError:
    return GpumemInputError(e.problem, source=e.path)


def kind(path: str | os.PathLike[str]) -> PathKind:
    """:func:`gpumem_gui.files.path_kind`, with an unreadable path as a :class:`GpumemInputError`."""
    try:
        return files.path_kind(path)
    except files.FileReadError as e:
        raise _error(e) from None


def listing(folder: str | os.PathLike[str]) -> list[tuple[str, PathKind]]:
    """``(name, kind)`` of each entry of ``folder`` (:func:`gpumem_gui.files.list_folder`)."""
    try:
        return files.list_folder(folder)
    except files.FileReadError as e:
        raise _error(e) from None


def read_json_file(
    path: str | os.PathLike[str], max_bytes: int = CONFIG_JSON_MAX_BYTES, what: str = "config.json"
) -> Any:
    """A JSON file of at most ``max_bytes`` (:func:`gpumem_gui.files.read_json`); any problem is one
    :class:`GpumemInputError` naming the file."""
    try:
        return files.read_json(path, max_bytes, what)
    except files.FileReadError as e:
        raise _error(e) from None


def read_text_file(path: str | os.PathLike[str], max_bytes: int, what: str = "file") -> str:
    """A regular file's UTF-8 text, at most ``max_bytes`` (:func:`gpumem_gui.files.read_text`)."""
    try:
        return files.read_text(path, max_bytes, what)
    except files.FileReadError as e:
        raise _error(e) from None


@contextmanager
def open_checked(path: str | os.PathLike[str], max_bytes: int | None, what: str) -> Iterator[IO[bytes]]:
    """A regular file opened for reading (:func:`gpumem_gui.files.open_regular`), closed on exit."""
    try:
        f = files.open_regular(path, max_bytes, what)
    except files.FileReadError as e:
        raise _error(e) from None
    with f:
        yield f
