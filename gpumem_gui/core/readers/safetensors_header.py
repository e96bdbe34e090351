"""Weight inventories from ``.safetensors`` headers, without reading tensor data.

A safetensors file is an 8-byte little-endian unsigned header length N, N bytes of UTF-8 JSON (one entry
per tensor: ``dtype``, ``shape``, ``data_offsets`` relative to the end of the header, plus an optional
``__metadata__`` string map), then the tensor bytes. Only the first 8 + N bytes are ever read. Headers
are validated as strictly as the reference implementation (huggingface/safetensors,
``safetensors/src/tensor.rs``: ``read_metadata`` and ``Metadata::validate``) so that a file this module
accepts is one ``safetensors`` can load; every problem is a :class:`GpumemInputError` naming the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.reading import open_checked

# Bits per element of every dtype the safetensors format defines: huggingface/safetensors,
# safetensors/src/tensor.rs, ``enum Dtype`` and ``Dtype::bitsize`` (checked at commit 24b0b28, May 2026).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

# Largest header the reference reader accepts: ``MAX_HEADER_SIZE: usize = 100_000_000`` in
# huggingface/safetensors safetensors/src/tensor.rs (100 MB, decimal).
MAX_HEADER_BYTES = 100_000_000

# The header-length prefix: a little-endian u64 (safetensors format spec, README "Format").
_LEN_PREFIX_BYTES = 8
# Shapes and offsets are usize in the reference (``TensorInfo``), and its validation multiplies the shape
# with checked arithmetic (``checked_mul``): nothing may exceed a u64. Checking as we go also keeps a header
# of huge dimensions from making ever larger Python integers.
_USIZE_MAX = 2**64 - 1


class TensorEntry(TypedDict):
    """One tensor of a header: dtype name, shape, and byte range inside the data section."""

    dtype: str
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]


class SafetensorsHeader(TypedDict):
    """A parsed, validated header. ``tensors`` maps each tensor name to its entry, in data order."""

    header_length: int
    file_size: int
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]


def header_error(path: Path | str, message: str) -> GpumemInputError:
    return GpumemInputError(message, source=str(path))


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return out


def _read_prefix(path: Path) -> tuple[bytes, int]:
    """(header bytes, file size): reads the 8-byte length and the header, nothing more."""
    try:
        with open_checked(path, None, ".safetensors file") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(_LEN_PREFIX_BYTES)
            if len(head) < _LEN_PREFIX_BYTES:
                raise header_error(
                    path, f"file is {len(head)} bytes, too short for a safetensors header length (8 bytes)"
                )
            n = int.from_bytes(head, "little", signed=False)
            if n == 0:
                raise header_error(path, "header length is 0; not a safetensors file")
            if n > MAX_HEADER_BYTES:
                raise header_error(
                    path,
                    f"header length {n} exceeds the safetensors limit of {MAX_HEADER_BYTES} bytes; "
                    "not a safetensors file or corrupted",
                )
            if n > size - _LEN_PREFIX_BYTES:
                raise header_error(path, f"header length {n} is larger than the file ({size} bytes)")
            data = f.read(n)
    except OSError as e:
        raise header_error(path, f"cannot read file: {e.strerror or e}") from None
    if len(data) != n:
        raise header_error(path, f"file ended after {len(data)} of {n} header bytes")
    return data, size


def read_safetensors_header(path: str | os.PathLike[str]) -> SafetensorsHeader:
    """Read and validate the header of one ``.safetensors`` file (never its tensor data).

    Checks, each a :class:`GpumemInputError` naming the file: the length prefix (present, non-zero,
    within the file and the 100 MB format limit), UTF-8, JSON object, unique keys, ``__metadata__`` a
    string map, and for each tensor a known dtype, non-negative integer shape, and ``data_offsets``
    ``[begin, end]`` with ``end - begin`` equal to the element count times the dtype size; the tensors
    must tile the data section exactly (no gap, no overlap, ending at the end of the file), as the
    reference reader requires.
    """
    p = Path(path)
    raw, size = _read_prefix(p)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise header_error(p, f"header is not valid UTF-8 (byte {e.start})") from None
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as e:
        raise header_error(p, f"header lists {short(e.key)} twice") from None
    except json.JSONDecodeError as e:
        raise header_error(
            p, f"header is not valid JSON (line {e.lineno} column {e.colno}: {e.msg})"
        ) from None
    except RecursionError:
        raise header_error(p, "header is not valid JSON (nested too deeply)") from None
    except ValueError as e:  # Python's 4,300-digit limit on integer literals
        problem = "an integer of more than 4,300 digits" if "digits" in str(e) else type(e).__name__
        raise header_error(p, f"header is not valid JSON ({problem})") from None
    if not isinstance(obj, dict):
        raise header_error(p, f"header must be a JSON object, got {type(obj).__name__}")

    metadata: dict[str, str] = {}
    if "__metadata__" in obj:
        meta = obj.pop("__metadata__")
        if meta is not None:
            if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
                raise header_error(p, "header field '__metadata__' must be an object of strings")
            metadata = dict(meta)

    data_size = size - _LEN_PREFIX_BYTES - len(raw)
    entries: list[tuple[str, TensorEntry]] = [
        (name, check_entry(p, name, e, data_size)) for name, e in obj.items()
    ]
    entries.sort(key=lambda kv: kv[1]["data_offsets"])
    pos = 0
    for name, e in entries:
        begin, end = e["data_offsets"]
        if begin != pos:
            what = "overlaps the previous tensor" if begin < pos else f"leaves a gap of {begin - pos} bytes"
            raise header_error(p, f"tensor {short(name)}: data_offsets {[begin, end]} {what}")
        pos = end
    if pos != data_size:
        raise header_error(
            p,
            f"tensor data covers {pos} bytes but the file holds {data_size} bytes after the header "
            f"({size} bytes in all)",
        )
    return SafetensorsHeader(header_length=len(raw), file_size=size, tensors=dict(entries), metadata=metadata)


def check_entry(p: Path, name: str, e: object, data_size: int | None) -> TensorEntry:
    """One header entry, checked (this runs once per tensor: ~10^5 times for the largest checkpoints)."""

    def bad(problem: str) -> GpumemInputError:
        return header_error(p, f"tensor {short(name)}: {problem}")

    if not isinstance(e, Mapping):
        raise bad("entry must be an object with dtype, shape and data_offsets")
    try:
        dtype, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
    except KeyError:
        missing = [k for k in ("dtype", "shape", "data_offsets") if k not in e]
        raise bad(f"entry has no {', '.join(missing)}") from None
    bits_per = DTYPE_BITS.get(dtype) if type(dtype) is str else None
    if bits_per is None:
        raise bad(f"unknown dtype {short(dtype)}; known: {', '.join(DTYPE_BITS)}")
    if type(shape) is not list:
        raise bad(f"shape must be a list of integers, got {short(shape)}")
    numel = 1
    for d in shape:
        if type(d) is not int:  # JSON integers only: no bools, no floats
            raise bad(f"shape must be a list of integers, got {short(shape)}")
        if d < 0:
            raise bad(f"shape {short(shape)} has a negative dimension")
        numel *= d
        if numel > _USIZE_MAX:
            raise bad(f"shape {short(shape)} overflows the element count (at most 2^64 - 1)")
    if type(offs) is not list or len(offs) != 2 or type(offs[0]) is not int or type(offs[1]) is not int:
        raise bad(f"data_offsets must be [begin, end] integers, got {short(offs)}")
    begin, end = offs
    if begin < 0 or end < begin or end > _USIZE_MAX:
        raise bad(f"data_offsets {short(offs)} must satisfy 0 <= begin <= end < 2^64")
    bits = numel * bits_per
    if bits % 8:
        raise bad(f"{numel} elements of {dtype} do not fill whole bytes")
    if end - begin != bits // 8:
        raise bad(
            f"data_offsets {offs} span {end - begin} bytes but shape {short(shape)} of {dtype} needs "
            f"{bits // 8}"
        )
    if data_size is not None and end > data_size:
        raise bad(f"data ends at byte {end} of the data section, beyond the file ({data_size} bytes)")
    return TensorEntry(dtype=dtype, shape=tuple(shape), data_offsets=(begin, end))


# ---- inventories -------------------------------------------------------------------------------------
