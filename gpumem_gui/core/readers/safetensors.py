"""Weight inventories from ``.safetensors`` files, sharded folders and their index, without reading tensor
data (the headers are read and validated by :mod:`.safetensors_header`), and the quantization method the
tensors or the folder's ``config.json`` show."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, clip, short
from gpumem_gui.core.readers.reading import INDEX_JSON_MAX_BYTES, kind, listing, read_json_file
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
# A shard of a split checkpoint: huggingface_hub's split_torch_state_dict_into_shards names shards
# "model{suffix}.safetensors" with suffix "-{index:05d}-of-{total:05d}" (serialization/_base.py), and
# transformers' save_pretrained keeps that name; the index is "<stem>.safetensors.index.json".
SHARD_NAME = re.compile(r"(?P<stem>.+)-(?P<part>[0-9]{5})-of-(?P<total>[0-9]{5})\.safetensors")


def _tensors_of(header: SafetensorsHeader) -> list[WeightTensor]:
    return [
        make_tensor(name, e["dtype"], e["shape"], e["data_offsets"][1] - e["data_offsets"][0])
        for name, e in header["tensors"].items()
    ]


def _read_index(index: Path) -> dict[str, str]:
    obj = read_json_file(index, INDEX_JSON_MAX_BYTES, "safetensors index")
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
                f"tensor {short(name)} maps to {short(shard)}, not a .safetensors file name",
                source=str(index),
                field="weight_map",
            )
        parts = Path(shard).parts
        if Path(shard).is_absolute() or ".." in parts:
            raise GpumemInputError(
                f"shard {short(shard)} is not a file inside the model folder",
                source=str(index),
                field="weight_map",
            )
    return dict(wm)


def _missing(folder: Path, names: list[str]) -> str:
    """The names of ``folder`` that are no regular file, as a short list ('' when all are there)."""
    missing = [n for n in names if kind(folder / n) != "file"]
    if not missing:
        return ""
    shown = ", ".join(clip(n) for n in missing[:4])
    return shown + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")


def _from_index(index: Path) -> tuple[list[Path], list[WeightTensor]]:
    folder = index.parent
    weight_map = _read_index(index)
    shards: list[str] = list(dict.fromkeys(weight_map.values()))
    missing = _missing(folder, shards)
    if missing:
        raise header_error(
            index, f"the weight_map names shards that do not exist (as files) in {folder}: {missing}"
        )
    headers = {shard: read_safetensors_header(folder / shard) for shard in shards}
    for name, shard in weight_map.items():
        if name not in headers[shard]["tensors"]:
            raise header_error(
                folder / shard,
                f"tensor {short(name)} is listed in {index.name} for this shard but is not in it",
            )
    tensors: list[WeightTensor] = []
    seen: dict[str, str] = {}
    for shard in shards:
        for name in headers[shard]["tensors"]:
            if name in seen:
                raise header_error(
                    folder / shard, f"tensor {short(name)} is also stored in shard '{seen[name]}'"
                )
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
                raise header_error(f, f"tensor {short(name)} is also stored in '{seen[name].name}'")
            seen[name] = f
        tensors += _tensors_of(header)
    return tensors


def _from_folder(folder: Path) -> tuple[list[Path], list[WeightTensor]]:
    """With an index, the shards it names; without one, every regular ``*.safetensors`` file (folders and
    other non-files named so are no weights: the loader notes them)."""
    entries = listing(folder)
    if any(n == INDEX_NAME for n, _ in entries):  # the index rules; one that is no file is an error
        return _from_index(folder / INDEX_NAME)
    files = [folder / n for n, k in entries if k == "file" and n.endswith(".safetensors")]
    if not files:
        raise header_error(folder, "folder holds no .safetensors files")
    return files, _from_files(files)


def _from_one_file(path: Path) -> tuple[list[Path], list[WeightTensor]]:
    """One ``.safetensors`` file; a shard of a split checkpoint (``model-00001-of-00004.safetensors``) is read
    with the rest of the model, never alone: through the index that lists it, else with its siblings; a
    missing sibling is an error naming it."""
    m = SHARD_NAME.fullmatch(path.name)
    folder = path.parent
    stems = ([f"{m['stem']}.safetensors.index.json"] if m else []) + [INDEX_NAME]
    for name in dict.fromkeys(stems):
        index = folder / name
        if kind(index) == "file" and path.name in _read_index(index).values():
            return _from_index(index)
    if m is None:
        return [path], _from_files([path])
    total = int(m["total"])
    if not 1 <= int(m["part"]) <= total:
        raise header_error(path, f"is named as part {int(m['part'])} of {total}, which no split writes")
    names = [f"{m['stem']}-{i:05d}-of-{m['total']}.safetensors" for i in range(1, total + 1)]
    missing = _missing(folder, names)
    if missing:
        raise header_error(
            path,
            f"is one of {total} shards of a split checkpoint and the others are needed for the whole "
            f"model; missing in {folder}: {missing}",
        )
    files = [folder / n for n in names]
    return files, _from_files(files)


def inventory_from_safetensors(path_or_folder: str | os.PathLike[str]) -> WeightsInventory:
    """Inventory of a safetensors checkpoint, from its headers only.

    ``path_or_folder`` is one ``.safetensors`` file, a ``model.safetensors.index.json``, or a folder:
    with an index, the shards its ``weight_map`` names (each header read once; every mapped tensor must
    be in its shard); without one, every ``*.safetensors`` file in it. A file that is one shard of a split
    checkpoint is read with the whole checkpoint (:func:`_from_one_file`). Quantization is detected from
    the tensors, and the ``quantization_config.quant_method`` of a ``config.json`` next to the files wins.
    """
    p = Path(path_or_folder)
    what = kind(p)
    if what == "folder":
        folder = p
        files, tensors = _from_folder(p)
    elif what == "file":
        folder = p.parent
        if p.name.endswith(".safetensors.index.json"):
            files, tensors = _from_index(p)
        elif p.suffix == ".safetensors":
            files, tensors = _from_one_file(p)
        else:
            raise header_error(p, "not a .safetensors file, a .safetensors.index.json or a folder")
    elif what == "other":
        raise header_error(p, "not a regular file (a FIFO, a device or a socket): no weights to read")
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
                raise GpumemInputError(
                    f"tensor {short(name)} is also stored in {short(seen[name])}", source=where
                )
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
    if kind(cfg_path) != "file":
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
