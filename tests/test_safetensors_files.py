"""safetensors headers -> WeightsInventory: exact bytes of single, sharded and indexed files; index and
path problems."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.safetensors import inventory_from_safetensors, read_safetensors_header
from tests.safetensors_files import LLAMA, Spec, header_json, raw_file, write_st

# ---- valid files -------------------------------------------------------------------------------------


def test_single_file_exact_totals(tmp_path: Path) -> None:
    f = write_st(tmp_path / "model.safetensors", LLAMA, metadata={"format": "pt"})
    inv = inventory_from_safetensors(f)
    assert inv.format == "safetensors"
    assert inv.files == (str(f),)
    assert inv.tensor_count == 12
    assert inv.quantization is None
    # BF16: embed 512 + q 256 + k 128 + v 128 + o 256 + gate 384 + up 384 + down 384 + head 512 = 2944
    assert inv.elements_by_dtype == {"BF16": 2944, "F32": 48}
    assert inv.bytes_by_dtype == {"BF16": 5888, "F32": 192}
    assert inv.total_bytes == 6080
    assert inv.total_elements == 2992
    assert inv.elements_by_component["embedding"] == 512
    assert inv.elements_by_component["attention"] == 768
    assert inv.elements_by_component["mlp"] == 1152
    assert inv.elements_by_component["norms"] == 48
    assert inv.elements_by_component["lm_head"] == 512
    assert inv.bytes_by_component["attention"] == 1536
    assert inv.bytes_by_component["norms"] == 192
    assert inv.bytes_by_component["other"] == 0
    assert sum(inv.bytes_by_component.values()) == inv.total_bytes
    t = inv.tensor("model.layers.0.mlp.down_proj.weight")
    assert t is not None
    assert (t.shape, t.elements, t.nbytes, t.component, t.layer) == ((16, 24), 384, 768, "mlp", 0)


def test_header_keeps_metadata_apart_and_orders_by_offset(tmp_path: Path) -> None:
    tensors: Spec = {"b": ("F32", [2]), "a": ("F16", [3])}
    header, size = header_json(tensors, metadata={"format": "pt", "note": "x"})
    f = tmp_path / "m.safetensors"
    f.write_bytes(raw_file(header, size))
    h = read_safetensors_header(f)
    assert h["metadata"] == {"format": "pt", "note": "x"}
    assert list(h["tensors"]) == ["b", "a"]
    assert h["tensors"]["a"] == {"dtype": "F16", "shape": (3,), "data_offsets": (8, 14)}
    assert h["file_size"] == f.stat().st_size
    assert h["header_length"] == f.stat().st_size - 8 - 14


def _bytes_read() -> int:
    """Bytes this process has read through read() so far (Linux /proc/self/io, ``rchar``)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_only_header_bytes_are_read(tmp_path: Path) -> None:
    # a header for one 256 MiB tensor, the data section a hole (a sparse file): reading it would show
    header, size = header_json({"w": ("U8", [256 << 20])})
    f = tmp_path / "model.safetensors"
    f.write_bytes(raw_file(header, 0))
    with f.open("r+b") as fh:
        fh.truncate(f.stat().st_size + size)
    header_len = struct.unpack("<Q", f.read_bytes()[:8])[0]
    inventory_from_safetensors(f)  # warm: imports and caches read nothing during the measured call
    before = _bytes_read()
    inv = inventory_from_safetensors(f)
    read = _bytes_read() - before
    assert inv.total_bytes == size
    assert 8 + header_len <= read < 64 * 1024, read


def test_sharded_with_index(tmp_path: Path) -> None:
    names = list(LLAMA)
    shard1 = {n: LLAMA[n] for n in names[:6]}
    shard2 = {n: LLAMA[n] for n in names[6:]}
    write_st(tmp_path / "model-00001-of-00002.safetensors", shard1)
    write_st(tmp_path / "model-00002-of-00002.safetensors", shard2)
    # a stray consolidated file the index does not name must not be counted
    write_st(tmp_path / "consolidated.safetensors", LLAMA)
    weight_map = {n: "model-00001-of-00002.safetensors" for n in shard1} | {
        n: "model-00002-of-00002.safetensors" for n in shard2
    }
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 6080}, "weight_map": weight_map})
    )
    (tmp_path / "one").mkdir()
    single = inventory_from_safetensors(write_st(tmp_path / "one" / "x.safetensors", LLAMA))
    for source in (tmp_path, tmp_path / "model.safetensors.index.json"):
        inv = inventory_from_safetensors(source)
        assert [Path(f).name for f in inv.files] == [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ]
        assert inv.tensor_count == 12
        assert inv.total_bytes == 6080
        assert inv.bytes_by_dtype == single.bytes_by_dtype
        assert inv.bytes_by_component == single.bytes_by_component


def test_folder_without_index_reads_every_file(tmp_path: Path) -> None:
    names = list(LLAMA)
    write_st(tmp_path / "a.safetensors", {n: LLAMA[n] for n in names[:3]})
    write_st(tmp_path / "b.safetensors", {n: LLAMA[n] for n in names[3:]})
    inv = inventory_from_safetensors(tmp_path)
    assert [Path(f).name for f in inv.files] == ["a.safetensors", "b.safetensors"]
    assert inv.total_bytes == 6080


def test_index_problems(tmp_path: Path) -> None:
    write_st(tmp_path / "s1.safetensors", {"a.weight": ("F32", [2])})
    index = tmp_path / "model.safetensors.index.json"

    index.write_text(json.dumps({"weight_map": {"a.weight": "s1.safetensors", "b.weight": "s2.safetensors"}}))
    with pytest.raises(GpumemInputError, match=r"shards that do not exist .*: s2.safetensors$"):
        inventory_from_safetensors(tmp_path)

    index.write_text(json.dumps({"weight_map": {"a.weight": "s1.safetensors", "c.weight": "s1.safetensors"}}))
    with pytest.raises(GpumemInputError, match=r"tensor 'c.weight' is listed in .* but is not in it"):
        inventory_from_safetensors(tmp_path)

    write_st(tmp_path / "s2.safetensors", {"a.weight": ("F32", [2]), "b.weight": ("F32", [1])})
    index.write_text(json.dumps({"weight_map": {"a.weight": "s1.safetensors", "b.weight": "s2.safetensors"}}))
    with pytest.raises(GpumemInputError, match=r"tensor 'a.weight' is also stored in shard 's1.safetensors'"):
        inventory_from_safetensors(tmp_path)

    for bad in (
        {"weight_map": {}},
        {"weight_map": {"a.weight": 3}},
        {"weight_map": {"a.weight": "../x.safetensors"}},
        {"nothing": 1},
        [1, 2],
    ):
        index.write_text(json.dumps(bad))
        with pytest.raises(GpumemInputError, match=r"model\.safetensors\.index\.json"):
            inventory_from_safetensors(tmp_path)
    index.write_text("{not json")
    with pytest.raises(GpumemInputError, match="malformed JSON"):
        inventory_from_safetensors(tmp_path)


def test_path_problems(tmp_path: Path) -> None:
    with pytest.raises(GpumemInputError, match="no such file or folder"):
        inventory_from_safetensors(tmp_path / "missing.safetensors")
    with pytest.raises(GpumemInputError, match=r"holds no \.safetensors files"):
        inventory_from_safetensors(tmp_path)
    (tmp_path / "x.bin").write_bytes(b"1234")
    with pytest.raises(GpumemInputError, match=r"not a \.safetensors file"):
        inventory_from_safetensors(tmp_path / "x.bin")
