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

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import read_json_file
from gpumem_gui.core.readers.weights import WeightsInventory, WeightTensor, build_inventory, make_tensor

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

INDEX_NAME = "model.safetensors.index.json"  # transformers SAFE_WEIGHTS_INDEX_NAME (utils/constants.py)


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


def _err(path: Path | str, message: str) -> GpumemInputError:
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
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(_LEN_PREFIX_BYTES)
            if len(head) < _LEN_PREFIX_BYTES:
                raise _err(
                    path, f"file is {len(head)} bytes, too short for a safetensors header length (8 bytes)"
                )
            n = int.from_bytes(head, "little", signed=False)
            if n == 0:
                raise _err(path, "header length is 0; not a safetensors file")
            if n > MAX_HEADER_BYTES:
                raise _err(
                    path,
                    f"header length {n} exceeds the safetensors limit of {MAX_HEADER_BYTES} bytes; "
                    "not a safetensors file or corrupted",
                )
            if n > size - _LEN_PREFIX_BYTES:
                raise _err(path, f"header length {n} is larger than the file ({size} bytes)")
            data = f.read(n)
    except OSError as e:
        raise _err(path, f"cannot read file: {e.strerror or e}") from None
    if len(data) != n:
        raise _err(path, f"file ended after {len(data)} of {n} header bytes")
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
        raise _err(p, f"header is not valid UTF-8 (byte {e.start})") from None
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as e:
        raise _err(p, f"header lists '{e.key}' twice") from None
    except json.JSONDecodeError as e:
        raise _err(p, f"header is not valid JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    except (ValueError, RecursionError) as e:
        raise _err(p, f"header is not valid JSON ({type(e).__name__})") from None
    if not isinstance(obj, dict):
        raise _err(p, f"header must be a JSON object, got {type(obj).__name__}")

    metadata: dict[str, str] = {}
    if "__metadata__" in obj:
        meta = obj.pop("__metadata__")
        if meta is not None:
            if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
                raise _err(p, "header field '__metadata__' must be an object of strings")
            metadata = dict(meta)

    data_size = size - _LEN_PREFIX_BYTES - len(raw)
    entries: list[tuple[str, TensorEntry]] = [
        (name, _check_entry(p, name, e, data_size)) for name, e in obj.items()
    ]
    entries.sort(key=lambda kv: kv[1]["data_offsets"])
    pos = 0
    for name, e in entries:
        begin, end = e["data_offsets"]
        if begin != pos:
            what = "overlaps the previous tensor" if begin < pos else f"leaves a gap of {begin - pos} bytes"
            raise _err(p, f"tensor '{name}': data_offsets {[begin, end]} {what}")
        pos = end
    if pos != data_size:
        raise _err(
            p,
            f"tensor data covers {pos} bytes but the file holds {data_size} bytes after the header "
            f"({size} bytes in all)",
        )
    return SafetensorsHeader(header_length=len(raw), file_size=size, tensors=dict(entries), metadata=metadata)


def _check_entry(p: Path, name: str, e: object, data_size: int | None) -> TensorEntry:
    """One header entry, checked (this runs once per tensor: ~10^5 times for the largest checkpoints)."""

    def bad(problem: str) -> GpumemInputError:
        return _err(p, f"tensor '{name}': {problem}")

    if not isinstance(e, Mapping):
        raise bad("entry must be an object with dtype, shape and data_offsets")
    try:
        dtype, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
    except KeyError:
        missing = [k for k in ("dtype", "shape", "data_offsets") if k not in e]
        raise bad(f"entry has no {', '.join(missing)}") from None
    bits_per = DTYPE_BITS.get(dtype) if type(dtype) is str else None
    if bits_per is None:
        raise bad(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BITS)}")
    if type(shape) is not list:
        raise bad(f"shape must be a list of integers, got {shape!r}")
    numel = 1
    for d in shape:
        if type(d) is not int:  # JSON integers only: no bools, no floats
            raise bad(f"shape must be a list of integers, got {shape!r}")
        if d < 0:
            raise bad(f"shape {shape} has a negative dimension")
        numel *= d
    if type(offs) is not list or len(offs) != 2 or type(offs[0]) is not int or type(offs[1]) is not int:
        raise bad(f"data_offsets must be [begin, end] integers, got {offs!r}")
    begin, end = offs
    if begin < 0 or end < begin:
        raise bad(f"data_offsets {offs} must satisfy 0 <= begin <= end")
    bits = numel * bits_per
    if bits % 8:
        raise bad(f"{numel} elements of {dtype} do not fill whole bytes")
    if end - begin != bits // 8:
        raise bad(
            f"data_offsets {offs} span {end - begin} bytes but shape {shape} of {dtype} needs {bits // 8}"
        )
    if data_size is not None and end > data_size:
        raise bad(f"data ends at byte {end} of the data section, beyond the file ({data_size} bytes)")
    return TensorEntry(dtype=dtype, shape=tuple(shape), data_offsets=(begin, end))


# ---- inventories -------------------------------------------------------------------------------------


def _tensors_of(header: SafetensorsHeader) -> list[WeightTensor]:
    return [
        make_tensor(name, e["dtype"], e["shape"], e["data_offsets"][1] - e["data_offsets"][0])
        for name, e in header["tensors"].items()
    ]


def _read_index(index: Path) -> dict[str, str]:
    obj = read_json_file(index)
    if not isinstance(obj, dict):
        raise _err(index, "an index must hold a JSON object")
    wm = obj.get("weight_map")
    if not isinstance(wm, dict) or not wm:
        raise GpumemInputError(
            "must be a non-empty object of tensor name -> shard file", source=str(index), field="weight_map"
        )
    for name, shard in wm.items():
        if not isinstance(shard, str) or not shard.endswith(".safetensors"):
            raise GpumemInputError(
                f"tensor '{name}' maps to {shard!r}, not a .safetensors file name",
                source=str(index),
                field="weight_map",
            )
        parts = Path(shard).parts
        if Path(shard).is_absolute() or ".." in parts:
            raise GpumemInputError(
                f"shard {shard!r} is not a file inside the model folder",
                source=str(index),
                field="weight_map",
            )
    return dict(wm)


def _from_index(index: Path) -> tuple[list[Path], list[WeightTensor]]:
    folder = index.parent
    weight_map = _read_index(index)
    shards: list[str] = list(dict.fromkeys(weight_map.values()))
    headers: dict[str, SafetensorsHeader] = {}
    for shard in shards:
        sp = folder / shard
        if not sp.is_file():
            raise _err(index, f"shard '{shard}' listed in the weight_map does not exist in {folder}")
        headers[shard] = read_safetensors_header(sp)
    for name, shard in weight_map.items():
        if name not in headers[shard]["tensors"]:
            raise _err(
                folder / shard, f"tensor '{name}' is listed in {index.name} for this shard but is not in it"
            )
    tensors: list[WeightTensor] = []
    seen: dict[str, str] = {}
    for shard in shards:
        for name in headers[shard]["tensors"]:
            if name in seen:
                raise _err(folder / shard, f"tensor '{name}' is also stored in shard '{seen[name]}'")
            seen[name] = shard
        tensors += _tensors_of(headers[shard])
    return [folder / s for s in shards], tensors


def _from_files(files: list[Path]) -> list[WeightTensor]:
    tensors: list[WeightTensor] = []
    seen: dict[str, Path] = {}
    for f in files:
        header = read_safetensors_header(f)
        for name in header["tensors"]:
            if name in seen:
                raise _err(f, f"tensor '{name}' is also stored in '{seen[name].name}'")
            seen[name] = f
        tensors += _tensors_of(header)
    return tensors


def inventory_from_safetensors(path_or_folder: str | os.PathLike[str]) -> WeightsInventory:
    """Inventory of a safetensors checkpoint, from its headers only.

    ``path_or_folder`` is one ``.safetensors`` file, a ``model.safetensors.index.json``, or a folder:
    with an index, the shards its ``weight_map`` names (each header read once; every mapped tensor must
    be in its shard); without one, every ``*.safetensors`` file in it. Quantization is detected from the
    tensors, and the ``quantization_config.quant_method`` of a ``config.json`` next to the files wins.
    """
    p = Path(path_or_folder)
    if p.is_dir():
        folder = p
        index = p / INDEX_NAME
        if index.is_file():
            files, tensors = _from_index(index)
        else:
            files = sorted(f for f in p.glob("*.safetensors") if f.is_file())
            if not files:
                raise _err(p, "folder holds no .safetensors files")
            tensors = _from_files(files)
    elif p.is_file():
        folder = p.parent
        if p.name.endswith(".safetensors.index.json"):
            files, tensors = _from_index(p)
        elif p.suffix == ".safetensors":
            files, tensors = [p], _from_files([p])
        else:
            raise _err(p, "not a .safetensors file, a .safetensors.index.json or a folder")
    else:
        raise _err(p, "no such file or folder")
    detected = detect_quantization(tensors)
    quant = _quant_from_config(folder / "config.json", detected) or detected
    return build_inventory(
        format="safetensors",
        source=str(p),
        files=[str(f) for f in files],
        tensors=tensors,
        quantization=quant,
    )


def inventory_from_safetensor_headers(
    headers: Mapping[str, Mapping[str, Any]], *, source: str, quant_method: str | None = None
) -> WeightsInventory:
    """Inventory from headers fetched elsewhere (e.g. the Hub's ranged reads): ``{file: header dict}``.

    Each header is the parsed JSON of one file (``__metadata__`` allowed and ignored); entries are
    checked as in :func:`read_safetensors_header` except against a file size, which is unknown here.
    ``quant_method`` is the config's ``quantization_config.quant_method`` and wins over detection.
    """
    if not isinstance(headers, Mapping) or not headers:
        raise GpumemInputError("no safetensors headers", source=source)
    tensors: list[WeightTensor] = []
    seen: dict[str, str] = {}
    for fname in sorted(headers):
        header = headers[fname]
        where = f"{source}/{fname}"
        if not isinstance(header, Mapping):
            raise GpumemInputError("header must be an object", source=where)
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            if name in seen:
                raise GpumemInputError(f"tensor '{name}' is also stored in '{seen[name]}'", source=where)
            seen[name] = fname
            e = _check_entry(Path(where), name, entry, None)
            tensors.append(
                make_tensor(name, e["dtype"], e["shape"], e["data_offsets"][1] - e["data_offsets"][0])
            )
    detected = detect_quantization(tensors)
    quant = normalise_quant_method(quant_method, None, detected) or detected
    return build_inventory(
        format="safetensors", source=source, files=sorted(headers), tensors=tensors, quantization=quant
    )


# ---- quantization --------------------------------------------------------------------------------------


def _quant_from_config(cfg_path: Path, detected: str | None) -> str | None:
    """``quantization_config.quant_method`` of a Hugging Face ``config.json`` beside the weights, if any."""
    if not cfg_path.is_file():
        return None
    cfg = read_json_file(cfg_path)
    if not isinstance(cfg, Mapping):
        return None
    qc = cfg.get("quantization_config")
    if not isinstance(qc, Mapping):
        return None
    return normalise_quant_method(qc.get("quant_method"), qc, detected)


def normalise_quant_method(
    method: object, quantization_config: Mapping[str, Any] | None = None, detected: str | None = None
) -> str | None:
    """A config's ``quant_method``, lower-cased; ``bitsandbytes`` gains ``-4bit`` / ``-8bit``.

    The bit width comes from ``load_in_4bit`` / ``load_in_8bit`` (``BitsAndBytesConfig.to_dict()``;
    older configs write ``_load_in_4bit``) or else from the tensors (``detected``). None when ``method``
    is not a non-empty string.
    """
    if not isinstance(method, str) or not method.strip():
        return None
    m = method.strip().lower()
    if m != "bitsandbytes":
        return m
    qc = quantization_config or {}
    if qc.get("load_in_4bit") or qc.get("_load_in_4bit"):
        return "bitsandbytes-4bit"
    if qc.get("load_in_8bit") or qc.get("_load_in_8bit"):
        return "bitsandbytes-8bit"
    if detected is not None and detected.startswith("bitsandbytes-"):
        return detected
    return m


def _module(name: str, suffix: str) -> str | None:
    return name[: -len(suffix)] if name.endswith(suffix) else None


def detect_quantization(tensors: list[WeightTensor]) -> str | None:
    """Quantization scheme recognisable from tensor names and dtypes alone, or None.

    Layouts (as the respective packers write them):
      * GPTQ (AutoGPTQ / GPTQModel): ``qweight`` int32 [in / pack, out], ``qzeros`` [groups, out / pack],
        ``scales`` [groups, out], usually ``g_idx`` [in]: ``qweight`` and ``scales`` share the last axis.
      * AWQ (AutoAWQ GEMM): ``qweight`` int32 [in, out / pack], ``qzeros`` [groups, out / pack],
        ``scales`` [groups, out], no ``g_idx``: ``qweight`` is packed along the output axis.
      * bitsandbytes 8-bit: int8 ``weight`` with ``SCB`` (and ``weight_format``).
      * bitsandbytes 4-bit: uint8 ``weight`` with ``weight.absmax``, ``weight.quant_map``,
        ``weight.nested_absmax``, ``weight.quant_state.bitsandbytes__nf4|fp4``.
      * compressed-tensors pack-quantized: ``weight_packed`` with ``weight_scale``.
      * MXFP4 (gpt-oss): ``*_blocks`` with ``*_scales``.
      * FP8: float8 weights, usually with ``weight_scale`` or ``weight_scale_inv``.
    """
    by_name = {t.name: t for t in tensors}
    names = by_name.keys()
    if any(n.endswith(".weight_packed") for n in names):
        return "compressed-tensors"
    qweights = [m for n in names if (m := _module(n, ".qweight")) is not None]
    if qweights:
        if any(f"{m}.g_idx" in by_name for m in qweights):
            return "gptq"
        for m in qweights:
            qw, sc = by_name[f"{m}.qweight"], by_name.get(f"{m}.scales")
            if sc is not None and len(qw.shape) == 2 and len(sc.shape) == 2:
                return "gptq" if qw.shape[1] == sc.shape[1] else "awq"
        return "gptq"
    if any(n.endswith((".SCB", ".weight_format")) for n in names):
        return "bitsandbytes-8bit"
    if any(
        n.endswith((".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map")) or ".quant_state." in n
        for n in names
    ):
        return "bitsandbytes-4bit"
    if any(n.endswith("_blocks") and f"{n[: -len('_blocks')]}_scales" in by_name for n in names):
        return "mxfp4"
    if any(t.dtype.startswith("F8_") and t.dtype != "F8_E8M0" for t in tensors):
        return "fp8"
    return None
