"""An optional second opinion on a GGUF header: :class:`gguf.GGUFReader` must read a file that
:func:`~gpumem_gui.core.readers.gguf_header.parse_header` accepted, and agree on every tensor and key (see
:mod:`gpumem_gui.core.readers.gguf` for why it is not the parser of record)."""

from __future__ import annotations

from pathlib import Path

from gguf.constants import GGUFValueType
from gguf.gguf_reader import GGUFReader

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.gguf_header import Array, Header


def _err(path: Path, message: str, field: str | None = None) -> GpumemInputError:
    return GpumemInputError(message, source=str(path), field=field)


def cross_check_header(path: Path, header: Header) -> None:
    """Run :class:`gguf.GGUFReader` on a file :func:`parse_header` accepted; it must agree on everything."""
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
        if isinstance(v, Array):
            ok = r_counts[k] == v.count
        elif isinstance(v, float):
            ok = v == r_scalars[k] or (v != v and r_scalars[k] != r_scalars[k])
        else:
            ok = r_scalars[k] == v
        if not ok:
            raise _err(path, "gguf.GGUFReader reads a different value", field=k)
