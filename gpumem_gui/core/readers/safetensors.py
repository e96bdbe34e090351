"""Weight inventories from ``.safetensors`` files, sharded folders and their index, without reading tensor
data (the headers are read and validated by :mod:`.safetensors_header`), and the quantization method the
tensors or the folder's ``config.json`` show."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import read_json_file
from gpumem_gui.core.readers.safetensors_header import (
    DTYPE_BITS,
    MAX_HEADER_BYTES,
    SafetensorsHeader,
    check_entry,
    header_error,
    read_safetensors_header,
)
from gpumem_gui.core.readers.weights import WeightsInventory, WeightTensor, build_inventory, make_tensor

__all__ = [
    "DTYPE_BITS",
    "MAX_HEADER_BYTES",
    "inventory_from_safetensor_headers",
    "inventory_from_safetensors",
    "read_safetensors_header",
]

INDEX_NAME = "model.safetensors.index.json"  # transformers SAFE_WEIGHTS_INDEX_NAME (utils/constants.py)


def _tensors_of(header: SafetensorsHeader) -> list[WeightTensor]:
    return [
        make_tensor(name, e["dtype"], e["shape"], e["data_offsets"][1] - e["data_offsets"][0])
        for name, e in header["tensors"].items()
    ]


def _read_index(index: Path) -> dict[str, str]:
    obj = read_json_file(index)
    if not isinstance(obj, dict):
        raise header_error(index, "an index must hold a JSON object")
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
            raise header_error(index, f"shard '{shard}' listed in the weight_map does not exist in {folder}")
        headers[shard] = read_safetensors_header(sp)
    for name, shard in weight_map.items():
        if name not in headers[shard]["tensors"]:
            raise header_error(
                folder / shard, f"tensor '{name}' is listed in {index.name} for this shard but is not in it"
            )
    tensors: list[WeightTensor] = []
    seen: dict[str, str] = {}
    for shard in shards:
        for name in headers[shard]["tensors"]:
            if name in seen:
                raise header_error(folder / shard, f"tensor '{name}' is also stored in shard '{seen[name]}'")
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
                raise header_error(f, f"tensor '{name}' is also stored in '{seen[name].name}'")
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
                raise header_error(p, "folder holds no .safetensors files")
            tensors = _from_files(files)
    elif p.is_file():
        folder = p.parent
        if p.name.endswith(".safetensors.index.json"):
            files, tensors = _from_index(p)
        elif p.suffix == ".safetensors":
            files, tensors = [p], _from_files([p])
        else:
            raise header_error(p, "not a .safetensors file, a .safetensors.index.json or a folder")
    else:
        raise header_error(p, "no such file or folder")
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
            e = check_entry(Path(where), name, entry, None)
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
