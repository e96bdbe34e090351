"""Weight inventories and model specs from GGUF headers (llama.cpp's file format).

The header is parsed by :func:`~gpumem_gui.core.readers.gguf_header.parse_header`, a bounded parser
built on the ``gguf`` package's definitions (``GGUFValueType``, ``GGMLQuantizationType``,
``GGML_QUANT_SIZES``, ``LlamaFileType``): every length is checked against the bytes left, every type must
be known, and the tensors' data must lie back to back inside the file (as llama.cpp requires), so a damaged
file is one :class:`GpumemInputError` naming the file and the problem. Tensor data is never read.

:class:`gguf.GGUFReader` is not the parser of record for two reasons found while building this: it
trusts the counts in the file (a truncated array whose length field says 10^12 makes it loop without
end), and it walks metadata arrays element by element in Python (about 35 µs per element, so 15 to 30 s
for the 150k-token vocabularies of current models). With ``cross_check=True`` it is run as well, after
the bounded parse, and must agree on every tensor (name, type, shape, byte size) and every metadata key.
The spec comes from the metadata mapped onto a ``config.json`` (:mod:`.gguf_config`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gguf.constants import LlamaFileType
from pydantic import ValidationError

from gpumem_gui.core.errors import describe_validation_error
from gpumem_gui.core.readers.gguf_config import GGUF_ARCHITECTURES, GgufMeta, spec_from_gguf_meta
from gpumem_gui.core.readers.gguf_cross_check import cross_check_header
from gpumem_gui.core.readers.gguf_header import Array, Header, decode, parse_header
from gpumem_gui.core.readers.weights import WeightsInventory, WeightTensor, build_inventory, make_tensor
from gpumem_gui.core.spec.model import ModelSpec

# ---- inventory -----------------------------------------------------------------------------------------


def _read(path: str | os.PathLike[str], cross_check: bool) -> tuple[Path, Header]:
    p = Path(path)
    header = parse_header(p)
    if cross_check:
        cross_check_header(p, header)
    return p, header


def _file_type(header: Header) -> str | None:
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


def _inventory(path: Path, header: Header) -> WeightsInventory:
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
    inv, spec, _config = load_gguf_model(path, cross_check=cross_check)
    return inv, spec


def load_gguf_model(
    path: str | os.PathLike[str], *, cross_check: bool = False
) -> tuple[WeightsInventory, ModelSpec | None, dict[str, Any] | None]:
    """The inventory, the spec and the ``config.json`` the metadata maps onto (None where no spec)."""
    p, header = _read(path, cross_check)
    spec, config = _spec_and_config(p, header)
    return _inventory(p, header), spec, config


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


# ---- spec --------------------------------------------------------------------------------------------


def _spec(path: Path, header: Header) -> ModelSpec | None:
    return _spec_and_config(path, header)[0]


def _spec_and_config(path: Path, header: Header) -> tuple[ModelSpec | None, dict[str, Any] | None]:
    """The file's metadata mapped onto a config.json and read by the config path
    (:mod:`gpumem_gui.core.readers.gguf_config`); None for an architecture a spec cannot describe, or a
    file without tensors (a vocabulary-only file: nothing to check the metadata against)."""

    def raw(key: str) -> Any:
        """Scalars as Python values, strings decoded, kept arrays as lists; other arrays as None."""
        v = header.metadata.get(key)
        if isinstance(v, bytes):
            return decode(path, v, f"metadata value '{key}'")
        if isinstance(v, Array):
            return list(v.values) if v.values is not None else None
        return v

    arch = raw("general.architecture")
    if not isinstance(arch, str) or arch not in GGUF_ARCHITECTURES or not header.tensors:
        return None, None
    counts = {k: v.count for k, v in header.metadata.items() if isinstance(v, Array)}
    shapes = {ti.name: tuple(reversed(ti.dims)) for ti in header.tensors}
    meta = GgufMeta(path, raw, counts, shapes)
    try:
        spec = spec_from_gguf_meta(meta, arch)
    except ValidationError as e:
        raise describe_validation_error(e, source=str(path)) from None
    return spec, meta.config if spec is not None else None
