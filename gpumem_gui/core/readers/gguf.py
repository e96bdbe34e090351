"""Weight inventories and model specs from GGUF headers (llama.cpp's file format).

The header is parsed here by :func:`_parse`, a bounded parser built on the ``gguf`` package's
definitions (``GGUFValueType``, ``GGMLQuantizationType``, ``GGML_QUANT_SIZES``, ``LlamaFileType``): every
length is checked against the bytes left, every type must be known, and every tensor's data must lie
inside the file, so a damaged file is one :class:`GpumemInputError` naming the file and the problem.
Tensor data is never read.

:class:`gguf.GGUFReader` is not the parser of record for two reasons found while building this: it
trusts the counts in the file (a truncated array whose length field says 10^12 makes it loop without
end), and it walks metadata arrays element by element in Python (about 35 µs per element, so 15 to 30 s
for the 150k-token vocabularies of current models). With ``cross_check=True`` it is run as well, after
the bounded parse, and must agree on every tensor (name, type, shape, byte size) and every metadata key.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf.constants import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGMLQuantizationType,
    GGUFValueType,
    LlamaFileType,
)
from gguf.gguf_reader import READER_SUPPORTED_VERSIONS, GGUFReader
from pydantic import ValidationError

from gpumem_gui.core.errors import GpumemInputError, describe_validation_error
from gpumem_gui.core.readers.traits import traits_for
from gpumem_gui.core.readers.weights import WeightsInventory, WeightTensor, build_inventory, make_tensor
from gpumem_gui.core.spec.model import LayerType, MLASpec, ModelSpec, MoESpec, Provenance

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
class _Array:
    item_type: int
    count: int
    values: tuple[Any, ...] | None  # None: not kept (strings, or not in _KEPT_ARRAYS)


@dataclass(frozen=True, slots=True)
class _Header:
    version: int
    alignment: int
    data_start: int
    file_size: int
    metadata: dict[str, Any]  # scalar -> int/float/bool, string -> raw bytes, array -> _Array
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


def _decode(path: Path, raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _err(path, f"{what} is not valid UTF-8: {raw[:40]!r}") from None


def _type_name(t: int) -> str:
    try:
        return GGUFValueType(t).name
    except ValueError:
        return str(t)


def _parse(path: Path) -> _Header:
    """Parse the whole GGUF header with every length checked against the file (module docstring)."""
    if not path.is_file():
        raise _err(path, "no such file")
    try:
        with path.open("rb") as f:
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


def _parse_buffer(path: Path, buf: mmap.mmap, size: int) -> _Header:
    (version_le,) = struct.unpack_from("<I", buf, 4)
    # As GGUFReader does: a version whose low 16 bits are zero means the file has the other byte order.
    endian = ">" if version_le & 0xFFFF == 0 else "<"
    cur = _Cursor(buf, endian)
    cur.pos = 4
    version = cur.read_u32("version")
    if version not in READER_SUPPORTED_VERSIONS:
        supported = ", ".join(str(v) for v in READER_SUPPORTED_VERSIONS)
        raise _err(path, f"unsupported GGUF version {version} (supported: {supported})")
    n_tensors = cur.read_u64("tensor count")
    n_kv = cur.read_u64("metadata count")
    room = size - _FIXED_HEADER_BYTES
    if n_kv * _MIN_KV_BYTES > room or n_tensors * _MIN_TENSOR_INFO_BYTES > room:
        raise _err(
            path,
            f"header claims {n_kv} metadata entries and {n_tensors} tensors, "
            f"more than a {size}-byte file holds",
        )
    try:
        metadata = _parse_metadata(path, cur, n_kv)
        infos = _parse_tensor_infos(path, cur, n_tensors)
    except _Truncated as t:
        raise _err(
            path, f"file is truncated: it ends ({size} bytes) inside the {t.what} at byte {t.pos}"
        ) from None
    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    data_start = -(-cur.pos // alignment) * alignment
    for ti in infos:
        if ti.offset % alignment:
            raise _err(
                path,
                f"tensor '{ti.name}': data offset {ti.offset} is not a multiple of the alignment {alignment}",
            )
        end = data_start + ti.offset + ti.nbytes
        if end > size:
            raise _err(
                path,
                f"file is truncated: tensor '{ti.name}' data ends at byte {end} "
                f"but the file has {size} bytes",
            )
    return _Header(
        version=version,
        alignment=alignment,
        data_start=data_start,
        file_size=size,
        metadata=metadata,
        tensors=tuple(infos),
    )


def _parse_metadata(path: Path, cur: _Cursor, n_kv: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = _decode(path, cur.read_str(f"key of metadata entry {i}"), f"metadata key {i}")
        if key in metadata:
            raise _err(path, f"metadata key '{key}' appears twice")
        vtype = cur.read_u32(f"type of '{key}'")
        what = f"value of '{key}'"
        if vtype == GGUFValueType.STRING:
            metadata[key] = cur.read_str(what)
        elif vtype in _SCALAR_CODES:
            (metadata[key],) = cur.read_values(_SCALAR_CODES[vtype], 1, what)
        elif vtype == GGUFValueType.ARRAY:
            itype = cur.read_u32(f"item type of '{key}'")
            count = cur.read_u64(f"length of '{key}'")
            values: tuple[Any, ...] | None = None
            if itype == GGUFValueType.STRING:
                cur.need(count * 8, f"array '{key}'")
                for _ in range(count):
                    cur.skip_str(f"string in array '{key}'")
            elif itype in _SCALAR_CODES:
                code = _SCALAR_CODES[itype]
                if key.endswith(_KEPT_ARRAYS):
                    values = cur.read_values(code, count, f"array '{key}'")
                else:
                    cur.skip(count * struct.calcsize(cur.endian + code), f"array '{key}'")
            elif itype == GGUFValueType.ARRAY:
                # llama.cpp's gguf.cpp rejects arrays of arrays (GGUFReader would recurse without bound)
                raise _err(path, "nested arrays are not supported", field=key)
            else:
                raise _err(path, f"array has unknown item type {itype}", field=key)
            metadata[key] = _Array(itype, count, values)
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


def _parse_tensor_infos(path: Path, cur: _Cursor, n_tensors: int) -> list[_TensorInfo]:
    infos: list[_TensorInfo] = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = _decode(path, cur.read_str(f"name of tensor {i}"), f"name of tensor {i}")
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


# ---- optional cross-check against gguf.GGUFReader ---------------------------------------------------------


def _cross_check(path: Path, header: _Header) -> None:
    """Run :class:`gguf.GGUFReader` on a file :func:`_parse` accepted; it must agree on everything."""
    try:
        reader = GGUFReader(path)
        r_tensors = [
            (t.name, int(t.tensor_type), tuple(int(d) for d in t.shape), int(t.n_bytes))
            for t in reader.tensors
        ]
        r_keys = {k for k in reader.fields if not k.startswith("GGUF.")}
        r_scalars = {
            k: f.parts[-1].tobytes() if f.types[0] == GGUFValueType.STRING else f.contents()
            for k, f in reader.fields.items()
            if f.types and f.types[0] != GGUFValueType.ARRAY and not k.startswith("GGUF.")
        }
        r_counts = {
            k: len(f.data) for k, f in reader.fields.items() if f.types and f.types[0] == GGUFValueType.ARRAY
        }
    except Exception as e:  # the reader raises ValueError, KeyError, IndexError, numpy errors, ...
        raise _err(path, f"gguf.GGUFReader cannot read the header: {type(e).__name__}: {e}") from None
    mine = [(t.name, int(t.ggml_type), t.dims, t.nbytes) for t in header.tensors]
    if r_tensors != mine:
        bad = next((m, r) for m, r in zip([*mine, None], [*r_tensors, None], strict=False) if m != r)
        raise _err(path, f"gguf.GGUFReader disagrees on a tensor: {bad[1]} vs {bad[0]}")
    if r_keys != set(header.metadata):
        raise _err(
            path, f"gguf.GGUFReader disagrees on the metadata keys: {sorted(r_keys ^ set(header.metadata))}"
        )
    for k, v in header.metadata.items():
        if isinstance(v, _Array):
            ok = r_counts[k] == v.count
        elif isinstance(v, float):
            ok = v == r_scalars[k] or (v != v and r_scalars[k] != r_scalars[k])
        else:
            ok = r_scalars[k] == v
        if not ok:
            raise _err(path, "gguf.GGUFReader reads a different value", field=k)


# ---- inventory -----------------------------------------------------------------------------------------


def _read(path: str | os.PathLike[str], cross_check: bool) -> tuple[Path, _Header]:
    p = Path(path)
    header = _parse(p)
    if cross_check:
        _cross_check(p, header)
    return p, header


def _file_type(header: _Header) -> str | None:
    value = header.metadata.get("general.file_type")
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    try:
        ft = LlamaFileType(value)
    except ValueError:
        return None
    if ft == LlamaFileType.GUESSED:
        return None
    return ft.name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _inventory(path: Path, header: _Header) -> WeightsInventory:
    tensors: list[WeightTensor] = [
        make_tensor(ti.name, ti.ggml_type.name, tuple(reversed(ti.dims)), ti.nbytes) for ti in header.tensors
    ]
    return build_inventory(
        format="gguf", source=str(path), files=[str(path)], tensors=tensors, quantization=_file_type(header)
    )


def inventory_from_gguf(path: str | os.PathLike[str], *, cross_check: bool = False) -> WeightsInventory:
    """Inventory of one GGUF file from its header: ggml type, shape (row-major order), exact bytes.

    Bytes are rows x (row length / block size) x block bytes, from ``gguf.GGML_QUANT_SIZES``.
    ``quantization`` is ``general.file_type`` as a llama.cpp file type name without its ``MOSTLY_``
    prefix (``Q4_K_M``, ``F16``, ...). ``cross_check`` also runs :class:`gguf.GGUFReader` (slow on large
    vocabularies, see the module docstring), which must agree on every tensor's bytes.
    """
    p, header = _read(path, cross_check)
    return _inventory(p, header)


def load_gguf(
    path: str | os.PathLike[str], *, cross_check: bool = False
) -> tuple[WeightsInventory, ModelSpec | None]:
    """:func:`inventory_from_gguf` and :func:`spec_from_gguf` with one read of the header."""
    p, header = _read(path, cross_check)
    return _inventory(p, header), _spec(p, header)


def spec_from_gguf(path: str | os.PathLike[str], *, cross_check: bool = False) -> ModelSpec | None:
    """A :class:`ModelSpec` from a GGUF file's architecture metadata and tensor list.

    Sizes come from the ``{arch}.*`` keys (``embedding_length``, ``block_count``,
    ``attention.head_count`` ...); which tensors exist (biases, norms, ``output.weight`` for an untied
    head, ...) comes from the tensor list. None when ``general.architecture`` is not one a
    :class:`ModelSpec` can describe (:data:`GGUF_ARCHITECTURES`), or the file holds no tensors; the
    inventory still works for those.
    """
    p, header = _read(path, cross_check)
    return _spec(p, header)


# ---- spec ------------------------------------------------------------------------------------------------

# GGUF architecture (llama.cpp ``LLM_ARCH_*`` names, gguf-py constants.py MODEL_ARCH_NAMES) -> the
# Hugging Face model_type whose modeling code builds the same tensors (see hf_config.READERS).
GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "llama",
    "mistral": "mistral",
    "granite": "granite",
    "qwen2": "qwen2",
    "qwen2moe": "qwen2_moe",
    "qwen3": "qwen3",
    "qwen3moe": "qwen3_moe",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
    "deepseek2": "deepseek_v2",
    "gpt2": "gpt2",
    "falcon": "falcon",
    "bloom": "bloom",
    "gptneox": "gpt_neox",
    "olmo2": "olmo2",
    "starcoder2": "starcoder2",
}

# Architectures whose norms are LayerNorm (the rest use RMSNorm), per their transformers modeling code.
_LAYERNORM_ARCHS = frozenset({"gpt2", "falcon", "bloom", "gptneox", "starcoder2"})

# Activation defaults of the transformers config classes (hf_config.py uses the same).
_ACTIVATION = {
    "gemma": "gelu_pytorch_tanh",
    "gemma2": "gelu_pytorch_tanh",
    "gemma3": "gelu_pytorch_tanh",
    "starcoder2": "gelu_pytorch_tanh",
    "gpt2": "gelu_new",
    "falcon": "gelu",
    "bloom": "gelu",
    "gptneox": "gelu",
}

# Sliding-window layer period when the file has no ``attention.sliding_window_pattern``: llama.cpp
# src/llama-model.cpp ``hparams.set_swa_pattern(2)`` (Gemma 2) and ``set_swa_pattern(6)`` (Gemma 3);
# layer i is full attention when (i + 1) % period == 0.
_SWA_PERIOD = {"gemma2": 2, "gemma3": 6}
# Architectures where a ``sliding_window`` key means every layer slides (as in hf_config._uniform_sliding).
_UNIFORM_SWA_ARCHS = frozenset({"llama", "mistral", "phi3", "starcoder2"})

# Per-layer norm tensors counted by ModelSpec.norms_per_layer; the q/k and MLA low-rank norms are not.
_SUBLAYER_NORMS = frozenset({"attn_q_norm", "attn_k_norm", "attn_q_a_norm", "attn_kv_a_norm"})


class _Meta:
    """Typed access to the parsed metadata; errors name the file and key."""

    def __init__(self, path: Path, header: _Header, arch: str) -> None:
        self.path = path
        self.metadata = header.metadata
        self.arch = arch

    def key(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def raw(self, key: str) -> Any:
        """Scalars as Python values, strings decoded, kept arrays as lists; other arrays as ``_Array``."""
        v = self.metadata.get(key)
        if isinstance(v, bytes):
            return _decode(self.path, v, f"metadata value '{key}'")
        if isinstance(v, _Array) and v.values is not None:
            return list(v.values)
        return v

    def string(self, key: str) -> str | None:
        v = self.raw(key)
        return v if isinstance(v, str) else None

    def integer(self, key: str, *, required: bool = False, minimum: int = 1) -> int | None:
        """An integer, or a per-layer integer array whose entries are all equal."""
        v = self.raw(key)
        if v is None:
            if required:
                raise _err(self.path, "required key is missing", field=key)
            return None
        if isinstance(v, list):
            if not v or len(set(v)) != 1:
                raise _NotDescribable(f"{key} varies per layer")
            v = v[0]
        if isinstance(v, bool) or not isinstance(v, int | float) or v != v or int(v) != v:
            raise _err(self.path, f"must be an integer, got {v!r}", field=key)
        if v < minimum:
            raise _err(self.path, f"must be >= {minimum}, got {v}", field=key)
        return int(v)

    def flag(self, key: str) -> bool | None:
        v = self.raw(key)
        return v if isinstance(v, bool) else None

    def array_len(self, key: str) -> int | None:
        v = self.metadata.get(key)
        return v.count if isinstance(v, _Array) else None


class _NotDescribable(Exception):
    """The file is well formed but its architecture does not fit a ModelSpec."""


def _spec(path: Path, header: _Header) -> ModelSpec | None:
    arch = _Meta(path, header, "").string("general.architecture")
    if arch is None or arch not in GGUF_ARCHITECTURES:
        return None
    if not header.tensors:
        return None  # a vocabulary-only file: nothing to check the metadata against
    meta = _Meta(path, header, arch)
    try:
        fields = _spec_fields(meta, header)
    except _NotDescribable:
        return None
    except ValidationError as e:
        raise describe_validation_error(e, source=str(path)) from None
    name = (meta.string("general.name") or "").strip() or path.stem or "model"
    fields["name"] = name[:200]
    fields["provenance"] = Provenance(kind="gguf", source=str(path), note=f"general.architecture={arch}")
    try:
        return ModelSpec(**fields)
    except ValidationError as e:
        raise describe_validation_error(e, source=str(path)) from None


def _spec_fields(meta: _Meta, header: _Header) -> dict[str, Any]:
    arch = meta.arch
    shapes = {ti.name: tuple(reversed(ti.dims)) for ti in header.tensors}

    def has(name: str) -> bool:
        return name in shapes

    h = meta.integer(meta.key("embedding_length"), required=True)
    n_layers = meta.integer(meta.key("block_count"), required=True)
    heads = meta.integer(meta.key("attention.head_count"), required=True)
    assert h is not None and n_layers is not None and heads is not None
    # Every architecture described here stores tensors for each of its blocks as blk.<i>.*; the block
    # count must name exactly those (it bounds every per-layer loop below, too).
    layer_ids = {
        int(p[1])
        for p in (n.split(".") for n in shapes)
        if len(p) > 1 and p[0] == "blk" and p[1].isascii() and p[1].isdecimal()
    }
    if layer_ids != set(range(len(layer_ids))) or len(layer_ids) != n_layers:
        raise _err(
            meta.path,
            f"is {n_layers} but the file has tensors for {len(layer_ids)} blocks"
            + ("" if layer_ids == set(range(len(layer_ids))) else " with gaps in their numbering"),
            field=meta.key("block_count"),
        )
    kv = meta.integer(meta.key("attention.head_count_kv")) or heads
    key_len = meta.integer(meta.key("attention.key_length"))
    if key_len is None:
        if h % heads:
            raise _err(
                meta.path,
                f"{h} is not divisible by the head count {heads} and no key_length is given",
                field=meta.key("embedding_length"),
            )
        key_len = h // heads
    vocab = (
        meta.integer(meta.key("vocab_size"))
        or (
            shapes["token_embd.weight"][0]
            if has("token_embd.weight") and shapes["token_embd.weight"]
            else None
        )
        or meta.array_len("tokenizer.ggml.tokens")
    )
    if not vocab:
        raise _err(
            meta.path,
            "no vocab_size key, token_embd.weight or tokenizer.ggml.tokens",
            field=meta.key("vocab_size"),
        )

    expert_count = meta.integer(meta.key("expert_count"), minimum=0) or 0
    moe_layers = [i for i in range(n_layers) if has(f"blk.{i}.ffn_gate_inp.weight")]
    dense_layers = tuple(sorted(set(range(n_layers)) - set(moe_layers)))
    ff = meta.integer(meta.key("feed_forward_length"))
    expert_ff = meta.integer(meta.key("expert_feed_forward_length"))

    model_type = GGUF_ARCHITECTURES[arch]
    moe: MoESpec | None = None
    if expert_count:
        used = meta.integer(meta.key("expert_used_count"), required=True)
        assert used is not None
        if arch == "llama":
            model_type = "mixtral"
        e_ff = expert_ff or ff
        if e_ff is None:
            raise _err(meta.path, "required key is missing", field=meta.key("expert_feed_forward_length"))
        shared = meta.integer(meta.key("expert_shared_feed_forward_length"), minimum=0) or 0
        if arch == "deepseek2":
            shared = (meta.integer(meta.key("expert_shared_count"), minimum=0) or 0) * e_ff
        if not shared and any(has(f"blk.{i}.ffn_up_shexp.weight") for i in moe_layers):
            shared = shapes[f"blk.{moe_layers[0]}.ffn_up_shexp.weight"][0]
        moe = MoESpec(
            num_experts=expert_count,
            experts_per_token=used,
            expert_intermediate_size=e_ff,
            shared_expert_intermediate_size=shared,
            shared_expert_gate=any(has(f"blk.{i}.ffn_gate_inp_shexp.weight") for i in moe_layers),
            router_bias=any(has(f"blk.{i}.ffn_gate_inp.bias") for i in moe_layers),
            expert_bias=any(
                has(f"blk.{i}.ffn_up_exps.bias") or has(f"blk.{i}.ffn_gate_up_exps.bias") for i in moe_layers
            ),
            dense_layers=dense_layers if moe_layers else (),
        )
        ff = ff or e_ff
    if ff is None:
        raise _err(meta.path, "required key is missing", field=meta.key("feed_forward_length"))

    mla: MLASpec | None = None
    if arch == "deepseek2":
        rope = meta.integer(meta.key("rope.dimension_count"), required=True)
        # llama.cpp since the MLA rework writes key/value_length for the compressed cache and the
        # per-head sizes as key_length_mla / value_length_mla; older files only the per-head sizes.
        k_mla = meta.integer(meta.key("attention.key_length_mla")) or key_len
        v_mla = meta.integer(meta.key("attention.value_length_mla")) or meta.integer(
            meta.key("attention.value_length"), required=True
        )
        assert rope is not None and v_mla is not None
        if k_mla <= rope:
            raise _err(
                meta.path,
                f"key length {k_mla} must exceed the rope dimension {rope}",
                field=meta.key("attention.key_length"),
            )
        mla = MLASpec(
            q_lora_rank=meta.integer(meta.key("attention.q_lora_rank"), minimum=0) or None,
            kv_lora_rank=meta.integer(meta.key("attention.kv_lora_rank"), required=True),
            qk_nope_head_dim=k_mla - rope,
            qk_rope_head_dim=rope,
            v_head_dim=v_mla,
        )
        # as hf_config._deepseek: MLA has no per-head K/V cache; describe the decompressed heads
        kv, key_len = heads, mla.qk_head_dim
        if any(has(f"blk.{i}.exp_probs_b.bias") or has(f"blk.{i}.exp_probs_b") for i in moe_layers):
            model_type = "deepseek_v3"

    layer_types, window = _sliding(meta, n_layers)

    first_dense = dense_layers[0] if dense_layers else None
    d = f"blk.{first_dense}" if first_dense is not None else "blk.0"
    if first_dense is not None and has(f"{d}.ffn_gate.weight"):
        gated = True
    elif first_dense is not None and has(f"{d}.ffn_up.weight"):
        gated = shapes[f"{d}.ffn_up.weight"][0] == 2 * ff  # Phi-3 fuses gate and up into ffn_up
    else:
        # merged experts (ffn_gate_exps, or fused ffn_gate_up_exps), or the per-expert tensors
        # blk.N.ffn_gate.E.weight of Mixtral files written before llama.cpp merged them (2024)
        gated = any(
            has(f"blk.{i}.ffn_gate_exps.weight")
            or has(f"blk.{i}.ffn_gate_up_exps.weight")
            or has(f"blk.{i}.ffn_gate.0.weight")
            for i in moe_layers
        )

    qk_norm = "none"
    if has("blk.0.attn_q_norm.weight") and arch != "deepseek2":
        width = shapes["blk.0.attn_q_norm.weight"][-1]
        qk_norm = "per_head" if width == key_len else "full_width"

    norms = sorted(
        {
            n.split(".")[2]
            for n in shapes
            if n.startswith("blk.0.")
            and n.endswith(".weight")
            and n.count(".") == 3
            and n.split(".")[2].rstrip("_0123456789").endswith("norm")
        }
        - _SUBLAYER_NORMS
    )
    if not 1 <= len(norms) <= 4:
        raise _NotDescribable(f"{len(norms)} norms per layer")

    pos_rows = shapes["position_embd.weight"][0] if has("position_embd.weight") else 0
    position = "learned" if pos_rows else ("alibi" if arch == "bloom" else "rope")
    context = meta.integer(meta.key("context_length")) or pos_rows or None
    parallel = arch == "falcon" or (
        arch == "gptneox" and meta.flag(meta.key("use_parallel_residual")) is not False
    )

    fields: dict[str, Any] = dict(
        model_type=model_type,
        traits=traits_for(model_type, source=str(meta.path)),
        hidden_size=h,
        num_layers=n_layers,
        num_attention_heads=heads,
        num_kv_heads=kv,
        head_dim=key_len,
        intermediate_size=ff,
        vocab_size=vocab,
        tie_word_embeddings=not has("output.weight"),
        embedding_norm=has("token_embd_norm.weight"),
        position_embedding=position,
        learned_position_rows=pos_rows,
        norm="layernorm" if arch in _LAYERNORM_ARCHS else "rmsnorm",
        norm_bias=has("blk.0.attn_norm.bias") or has("output_norm.bias"),
        norms_per_layer=len(norms),
        final_norm=has("output_norm.weight"),
        qk_norm=qk_norm,
        qkv_bias=any(has(f"blk.0.{t}.bias") for t in ("attn_q", "attn_qkv", "attn_q_a", "attn_kv_a_mqa")),
        o_bias=has("blk.0.attn_output.bias"),
        mlp_bias=first_dense is not None and (has(f"{d}.ffn_up.bias") or has(f"{d}.ffn_down.bias")),
        lm_head_bias=has("output.bias"),
        mlp_gated=gated,
        activation=_ACTIVATION.get(arch, "silu"),
        parallel_attn_mlp=parallel,
        sliding_window=window,
        layer_types=layer_types,
        moe=moe,
        mla=mla,
    )
    if context is not None:
        fields["max_position_embeddings"] = context
    return fields


def _sliding(meta: _Meta, n_layers: int) -> tuple[tuple[LayerType, ...], int | None]:
    window = meta.integer(meta.key("attention.sliding_window"), minimum=0) or None
    if window is None:
        return (), None
    pattern = meta.raw(meta.key("attention.sliding_window_pattern"))
    if isinstance(pattern, list):
        # convert_hf_to_gguf.py writes one bool per layer: True where the layer slides
        if len(pattern) != n_layers or not all(isinstance(b, bool) for b in pattern):
            raise _err(
                meta.path,
                f"must list one bool per layer ({n_layers})",
                field=meta.key("attention.sliding_window_pattern"),
            )
        types = tuple("sliding_attention" if b else "full_attention" for b in pattern)
    else:
        period: int | None = _SWA_PERIOD.get(meta.arch)
        if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
            period = pattern
        if period is not None:
            types = tuple(
                "sliding_attention" if (i + 1) % period else "full_attention" for i in range(n_layers)
            )
        elif meta.arch in _UNIFORM_SWA_ARCHS:
            types = ("sliding_attention",) * n_layers
        else:
            return (), None
    typed: tuple[LayerType, ...] = types  # type: ignore[assignment]
    return (typed, window) if "sliding_attention" in typed else ((), None)
