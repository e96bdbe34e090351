"""The bounded GGUF header parser: metadata and tensor infos, every length checked against the bytes left.

Built on the ``gguf`` package's definitions (``GGUFValueType``, ``GGMLQuantizationType``,
``GGML_QUANT_SIZES``); see :mod:`gpumem_gui.core.readers.gguf` for why it is not ``gguf.GGUFReader``, which
:func:`~gpumem_gui.core.readers.gguf_cross_check.cross_check_header` runs as a second opinion.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType
from gguf.gguf_reader import READER_SUPPORTED_VERSIONS

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.reading import open_checked

_MAGIC = b"GGUF"

# struct codes of the scalar metadata value types; their sizes (1, 1, 2, 2, 4, 4, 4, 1, 8, 8, 8 bytes)
# are those of ggml docs/gguf.md ``enum gguf_metadata_value_type``.
_SCALAR_CODES: dict[int, str] = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}

# Header layout (docs/gguf.md): magic u32, version u32, tensor_count u64, metadata_kv_count u64.
_FIXED_HEADER_BYTES = 4 + 4 + 8 + 8
# Smallest metadata pair: key length u64 + empty key + value type u32 + a 1-byte value.
_MIN_KV_BYTES = 8 + 4 + 1
# Smallest tensor info: name length u64 + empty name + n_dims u32 + type u32 + offset u64.
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
# ggml/include/ggml.h: ``#define GGML_MAX_DIMS 4``; gguf.cpp rejects tensors with more dimensions.
_GGML_MAX_DIMS = 4
# ggml/include/ggml.h: ``#define GGML_MAX_NAME 64``; gguf.cpp rejects a tensor name of 64 bytes or more.
_GGML_MAX_NAME = 64
# Bounds on what the parser walks, so a crafted header cannot keep it busy for minutes or copy gigabytes. Real
# headers are a few MB (a 150k-260k token vocabulary with its merges and scores), with 20-60 metadata keys and
# at most a few thousand tensor infos (DeepSeek-V3 with merged expert tensors: ~1,200; the old per-expert
# layout of Mixtral 8x7B: ~1,000). gguf.cpp itself bounds a string at 1 GiB and an array at 2^30 elements
# (GGUF_MAX_STRING_LENGTH, GGUF_MAX_ARRAY_ELEMENTS); these caps are ours, each over 10x what real files hold
# (at the caps a header parses in under a few seconds).
MAX_HEADER_BYTES = 128 << 20
MAX_METADATA_ENTRIES = 1 << 16
MAX_TENSOR_INFOS = 1 << 16
MAX_STRING_ARRAY_ITEMS = 1 << 22
# ggml counts elements in int64_t (ggml.h ``int64_t ne[GGML_MAX_DIMS]``): gguf.cpp rejects negative
# dimensions and element counts >= INT64_MAX (and divides by every dimension, so none may be zero).
_INT64_MAX = 2**63 - 1

# Numeric metadata arrays whose values are kept (per-layer hyperparameters the spec reads); the others
# (tokenizer scores, token types, ...) are only checked and counted.
_KEPT_ARRAYS = (
    ".attention.head_count",
    ".attention.head_count_kv",
    ".feed_forward_length",
    ".attention.sliding_window_pattern",
)


@dataclass(frozen=True, slots=True)
class _TensorInfo:
    name: str
    ggml_type: GGMLQuantizationType
    dims: tuple[int, ...]  # ggml order: ne[0] (contiguous) first
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class Array:
    item_type: int
    count: int
    values: tuple[Any, ...] | None  # None: not kept (strings, or not in _KEPT_ARRAYS)


@dataclass(frozen=True, slots=True)
class Header:
    version: int
    alignment: int
    data_start: int
    file_size: int
    metadata: dict[str, Any]  # scalar -> int/float/bool, string -> raw bytes, array -> Array
    tensors: tuple[_TensorInfo, ...]


class _Truncated(Exception):
    def __init__(self, what: str, pos: int) -> None:
        self.what = what
        self.pos = pos


class _Cursor:
    """Bounds-checked reads from a buffer; every overrun is a :class:`_Truncated`."""

    def __init__(self, buf: mmap.mmap, endian: str) -> None:
        self.buf = buf
        self.end = len(buf)
        self.pos = 0
        self.endian = endian
        self.u32 = struct.Struct(endian + "I")
        self.u64 = struct.Struct(endian + "Q")

    def need(self, n: int, what: str) -> None:
        if n > self.end - self.pos:
            raise _Truncated(what, self.pos)

    def read_u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = self.u32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def read_u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = self.u64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(v)

    def read_bytes(self, n: int, what: str) -> bytes:
        self.need(n, what)
        b = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return b

    def read_values(self, code: str, count: int, what: str) -> tuple[Any, ...]:
        size = count * struct.calcsize(self.endian + code)
        self.need(size, what)
        values = struct.unpack_from(f"{self.endian}{count}{code}", self.buf, self.pos)
        self.pos += size
        return values

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.pos += n

    def read_str(self, what: str) -> bytes:
        return self.read_bytes(self.read_u64(f"{what} length"), what)

    def skip_str(self, what: str) -> None:
        self.skip(self.read_u64(f"{what} length"), what)


def _err(path: Path, message: str, field: str | None = None) -> GpumemInputError:
    return GpumemInputError(message, source=str(path), field=field)


def decode(path: Path, raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _err(path, f"{what} is not valid UTF-8: {raw[:40]!r}") from None


def _type_name(t: int) -> str:
    try:
        return GGUFValueType(t).name
    except ValueError:
        return str(t)


def parse_header(path: Path) -> Header:
    """Parse the whole GGUF header with every length checked against the file (module docstring)."""
    try:
        with open_checked(path, None, "GGUF file") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(_FIXED_HEADER_BYTES)
            if not head:
                raise _err(path, "file is empty; not a GGUF file")
            if head[:4] != _MAGIC:
                raise _err(path, f"not a GGUF file (magic {head[:4]!r}, expected {_MAGIC!r})")
            if len(head) < _FIXED_HEADER_BYTES:
                raise _err(
                    path, f"file is truncated: {size} bytes, a GGUF header needs {_FIXED_HEADER_BYTES}"
                )
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse_buffer(path, buf, size)
    except OSError as e:
        raise _err(path, f"cannot read file: {e.strerror or e}") from None


def _parse_buffer(path: Path, buf: mmap.mmap, size: int) -> Header:
    (version_le,) = struct.unpack_from("<I", buf, 4)
    # As GGUFReader does: a version whose low 16 bits are zero means the file has the other byte order.
    endian = ">" if version_le & 0xFFFF == 0 else "<"
    cur = _Cursor(buf, endian)
    cur.end = min(size, MAX_HEADER_BYTES)  # the header is walked within its cap, the tensor data is not read
    cur.pos = 4
    version = cur.read_u32("version")
    if version not in READER_SUPPORTED_VERSIONS:
        supported = ", ".join(str(v) for v in READER_SUPPORTED_VERSIONS)
        raise _err(path, f"unsupported GGUF version {version} (supported: {supported})")
    n_tensors = cur.read_u64("tensor count")
    n_kv = cur.read_u64("metadata count")
    room = cur.end - _FIXED_HEADER_BYTES
    if n_kv * _MIN_KV_BYTES > room or n_tensors * _MIN_TENSOR_INFO_BYTES > room:
        raise _err(
            path,
            f"header claims {n_kv} metadata entries and {n_tensors} tensors, "
            f"more than a {size}-byte file holds",
        )
    if n_kv > MAX_METADATA_ENTRIES or n_tensors > MAX_TENSOR_INFOS:
        raise _err(
            path,
            f"header claims {n_kv:,} metadata entries and {n_tensors:,} tensors; gpumem reads at most "
            f"{MAX_METADATA_ENTRIES:,} and {MAX_TENSOR_INFOS:,}",
        )
    try:
        metadata = _parse_metadata(path, cur, n_kv)
        infos = _parse_tensor_infos(path, cur, n_tensors)
    except _Truncated as t:
        if cur.end < size:
            raise _err(
                path,
                f"the header runs past {MAX_HEADER_BYTES >> 20} MiB (gpumem's cap for GGUF metadata) "
                f"inside the {t.what}",
            ) from None
        raise _err(
            path, f"file is truncated: it ends ({size} bytes) inside the {t.what} at byte {t.pos}"
        ) from None
    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    data_start = -(-cur.pos // alignment) * alignment
    _check_data(path, infos, alignment, data_start, size)
    return Header(
        version=version,
        alignment=alignment,
        data_start=data_start,
        file_size=size,
        metadata=metadata,
        tensors=tuple(infos),
    )


def _check_data(path: Path, infos: list[_TensorInfo], alignment: int, data_start: int, size: int) -> None:
    """Tensor data as llama.cpp requires it: ggml/src/gguf.cpp (``gguf_init_from_reader``, formerly
    ``gguf_init_from_file_impl``) expects each tensor's offset to be exactly where the previous tensor's data
    ends, padded to the alignment ("tensor '%s' has offset %llu, expected %zu"), so tensors neither overlap
    nor leave gaps, and llama-model-loader.cpp refuses data past the end of the file ("tensor data is not
    within the file bounds")."""
    expected = 0
    for ti in infos:
        if ti.offset % alignment:
            raise _err(
                path,
                f"tensor {short(ti.name)}: data offset {ti.offset} is not a multiple of the alignment "
                f"{alignment}",
            )
        if ti.offset != expected:
            what = (
                "overlaps the tensor before it"
                if ti.offset < expected
                else "leaves a gap after the one before"
            )
            raise _err(
                path,
                f"tensor {short(ti.name)}: data offset {ti.offset}, expected {expected} (it {what}; "
                "llama.cpp requires tensor data back to back, each padded to the alignment)",
            )
        expected += -(-ti.nbytes // alignment) * alignment
        end = data_start + ti.offset + ti.nbytes
        if end > size:
            raise _err(
                path,
                f"file is truncated: tensor {short(ti.name)} data ends at byte {end} "
                f"but the file has {size} bytes",
            )


def _parse_metadata(path: Path, cur: _Cursor, n_kv: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = decode(path, cur.read_str(f"key of metadata entry {i}"), f"metadata key {i}")
        if not key:  # gguf.cpp: "key %d is empty"
            raise _err(path, f"metadata key {i} is empty")
        if key in metadata:
            raise _err(path, f"metadata key {short(key)} appears twice")
        label = short(key)
        vtype = cur.read_u32(f"type of {label}")
        what = f"value of {label}"
        if vtype == GGUFValueType.STRING:
            metadata[key] = cur.read_str(what)
        elif vtype in _SCALAR_CODES:
            (metadata[key],) = cur.read_values(_SCALAR_CODES[vtype], 1, what)
        elif vtype == GGUFValueType.ARRAY:
            itype = cur.read_u32(f"item type of {label}")
            count = cur.read_u64(f"length of {label}")
            values: tuple[Any, ...] | None = None
            if itype == GGUFValueType.STRING:
                _skip_strings(path, cur, count, key)
            elif itype in _SCALAR_CODES:
                code = _SCALAR_CODES[itype]
                if key.endswith(_KEPT_ARRAYS):
                    values = cur.read_values(code, count, f"array {label}")
                else:
                    cur.skip(count * struct.calcsize(cur.endian + code), f"array {label}")
            elif itype == GGUFValueType.ARRAY:
                # llama.cpp's gguf.cpp rejects arrays of arrays (GGUFReader would recurse without bound)
                raise _err(path, "nested arrays are not supported", field=key)
            else:
                raise _err(path, f"array has unknown item type {itype}", field=key)
            metadata[key] = Array(itype, count, values)
        else:
            raise _err(path, f"unknown value type {vtype}", field=key)
        if key == "general.alignment":
            # gguf.cpp and GGUFReader: a UINT32, a non-zero power of two
            if vtype != GGUFValueType.UINT32:
                raise _err(path, f"must be a UINT32, got {_type_name(vtype)}", field=key)
            a = metadata[key]
            if a == 0 or a & (a - 1):
                raise _err(path, f"must be a power of two, got {a}", field=key)
    return metadata


def _skip_strings(path: Path, cur: _Cursor, count: int, key: str) -> None:
    """Step over an array of ``count`` strings (a vocabulary: up to a few hundred thousand), checked."""
    if count > MAX_STRING_ARRAY_ITEMS:
        raise _err(
            path, f"array of {count:,} strings; gpumem reads at most {MAX_STRING_ARRAY_ITEMS:,}", field=key
        )
    cur.need(count * 8, f"array {short(key)}")
    unpack, buf, pos, end = cur.u64.unpack_from, cur.buf, cur.pos, cur.end
    for _ in range(count):
        if pos + 8 > end:
            cur.pos = pos
            raise _Truncated(f"string in array {short(key)}", pos)
        pos += 8 + unpack(buf, pos)[0]
        if pos > end:
            cur.pos = pos
            raise _Truncated(f"string in array {short(key)}", pos)
    cur.pos = pos


def _parse_tensor_infos(path: Path, cur: _Cursor, n_tensors: int) -> list[_TensorInfo]:
    infos: list[_TensorInfo] = []
    names: set[str] = set()
    for i in range(n_tensors):
        raw_name = cur.read_str(f"name of tensor {i}")
        if len(raw_name) >= _GGML_MAX_NAME:  # gguf.cpp: "tensor name %d is too long: %zu >= %d"
            raise _err(
                path,
                f"tensor {i} has a name of {len(raw_name):,} bytes; GGUF names are under {_GGML_MAX_NAME}",
            )
        name = decode(path, raw_name, f"name of tensor {i}")
        if name in names:
            raise _err(path, f"tensor '{name}' appears twice")
        names.add(name)
        n_dims = cur.read_u32(f"dimension count of tensor '{name}'")
        if n_dims > _GGML_MAX_DIMS:
            raise _err(path, f"tensor '{name}' has {n_dims} dimensions; GGUF allows at most {_GGML_MAX_DIMS}")
        dims = tuple(cur.read_u64(f"dimensions of tensor '{name}'") for _ in range(n_dims))
        raw_type = cur.read_u32(f"type of tensor '{name}'")
        offset = cur.read_u64(f"data offset of tensor '{name}'")
        try:
            gtype = GGMLQuantizationType(raw_type)
            block, type_bytes = GGML_QUANT_SIZES[gtype]
        except (ValueError, KeyError):
            raise _err(path, f"tensor '{name}' has unknown ggml type {raw_type}") from None
        if any(d == 0 or d > _INT64_MAX for d in dims):
            raise _err(path, f"tensor '{name}' has an invalid dimension in {list(dims)}")
        n = 1
        for d in dims:
            n *= d
        if n >= _INT64_MAX:
            raise _err(path, f"tensor '{name}' dimensions {list(dims)} overflow the element count")
        ne0 = dims[0] if dims else 1
        if ne0 % block:
            raise _err(
                path,
                f"tensor '{name}' rows of {ne0} elements are not a multiple of "
                f"the {gtype.name} block ({block})",
            )
        infos.append(_TensorInfo(name, gtype, dims, offset, n // ne0 * (ne0 // block) * type_bytes))
    return infos
