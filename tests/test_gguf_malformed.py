"""Malformed GGUF files: each a GpumemInputError naming the file and the problem; fuzzing the reader."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.gguf import inventory_from_gguf, load_gguf, spec_from_gguf
from tests.gguf_files import Q, Tensors, write_gguf

# ---- malformed files ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def valid_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    d = tmp_path_factory.mktemp("gguf-valid")
    tensors: Tensors = {
        "token_embd.weight": ((4, 256), Q.F16),
        "blk.0.attn_norm.weight": ((256,), Q.F32),
        "blk.0.attn_q.weight": ((256, 256), Q.Q4_K),
        "blk.0.ffn_down.weight": ((256, 64), Q.Q8_0),
    }

    def meta(w: gguf.GGUFWriter) -> None:
        w.add_embedding_length(256)
        w.add_block_count(1)
        w.add_head_count(4)
        w.add_feed_forward_length(64)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
        w.add_array("x.floats", [1.0, 2.0])

    return write_gguf(d / "v.gguf", "llama", meta, tensors, n_tokens=4).read_bytes()


def _kv_header(n_tensors: int, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "file is empty"),
        (b"GGU", "not a GGUF file (magic b'GGU'"),
        (b"PK\x03\x04" + b"\0" * 40, "not a GGUF file (magic b'PK\\x03\\x04'"),
        (b"GGUF\x03\0\0\0", "file is truncated"),
        (_kv_header(0, 0, version=1), "unsupported GGUF version 1"),
        (_kv_header(0, 0, version=7), "unsupported GGUF version 7"),
        (_kv_header(2**40, 0), "header claims 0 metadata entries and 1099511627776 tensors"),
        (_kv_header(0, 1) + _s("a") + struct.pack("<IIQ", 9, 0, 10**12) + b"\0" * 16, "file is truncated"),
        (_kv_header(0, 1) + _s("a") + struct.pack("<IIQ", 9, 8, 10**6) + b"\0" * 16, "file is truncated"),
        (
            _kv_header(0, 1) + _s("a") + struct.pack("<IIQ", 9, 9, 1) + b"\0" * 16,
            "nested arrays are not supported",
        ),
        (_kv_header(0, 1) + _s("a") + struct.pack("<I", 77) + b"\0" * 16, "unknown value type 77"),
        (_kv_header(0, 1) + _s("a") + struct.pack("<IIQ", 9, 77, 1) + b"\0" * 16, "unknown item type 77"),
        (_kv_header(0, 2) + _s("a") + struct.pack("<IB", 0, 1) + _s("a") + struct.pack("<IB", 0, 1), "twice"),
        (_kv_header(0, 1) + struct.pack("<Q", 2) + b"\xff\xfe" + struct.pack("<IB", 0, 1), "not valid UTF-8"),
        (_kv_header(0, 1) + _s("general.alignment") + struct.pack("<IQ", 10, 32), "must be a UINT32"),
        (_kv_header(0, 1) + _s("general.alignment") + struct.pack("<II", 4, 24), "must be a power of two"),
        (_kv_header(1, 0) + _s("t") + struct.pack("<I", 5) + b"\0" * 60, "at most 4"),
        (_kv_header(1, 0) + _s("t") + struct.pack("<IQIQ", 1, 4, 99, 0) + b"\0" * 32, "unknown ggml type 99"),
        (
            _kv_header(1, 0) + _s("t") + struct.pack("<IQIQ", 1, 33, 8, 0) + b"\0" * 64,
            "not a multiple of the Q8_0",
        ),
        (_kv_header(1, 0) + _s("t") + struct.pack("<IQQIQ", 2, 2**62, 4, 0, 0), "overflow"),
        (_kv_header(1, 0) + _s("t") + struct.pack("<IQQIQ", 2, 4, 0, 0, 0), "invalid dimension in [4, 0]"),
        (_kv_header(1, 0) + _s("t") + struct.pack("<IQIQ", 1, 2**63, 0, 0), "invalid dimension"),
        (
            _kv_header(1, 0) + _s("t") + struct.pack("<IQIQ", 1, 4, 0, 4) + b"\0" * 32,
            "not a multiple of the alignment",
        ),
        (_kv_header(1, 0) + _s("t") + struct.pack("<IQIQ", 1, 64, 0, 0) + b"\0" * 40, "data ends at byte"),
        (
            _kv_header(2, 0) + (_s("t") + struct.pack("<IQIQ", 1, 1, 0, 0)) * 2 + b"\0" * 64,
            "tensor 't' appears twice",
        ),
    ],
)
def test_malformed(tmp_path: Path, content: bytes, message: str) -> None:
    f = tmp_path / "bad.gguf"
    f.write_bytes(content)
    for fn in (inventory_from_gguf, spec_from_gguf):
        with pytest.raises(GpumemInputError) as ei:
            fn(f)
        assert message in str(ei.value)
        assert str(f) in str(ei.value)


def test_truncated_tensor_data(tmp_path: Path, valid_bytes: bytes) -> None:
    f = tmp_path / "t.gguf"
    f.write_bytes(valid_bytes[:-100])
    with pytest.raises(
        GpumemInputError, match=r"file is truncated: tensor 'blk\.0\.ffn_down\.weight' data ends"
    ):
        inventory_from_gguf(f)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(GpumemInputError, match="no such file"):
        inventory_from_gguf(tmp_path / "nope.gguf")


def test_big_endian_file(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(tmp_path / "be.gguf", "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_block_count(1)
    w.add_tensor("blk.0.attn_norm.weight", np.zeros((64,), np.float32), tensor_endianess=gguf.GGUFEndian.BIG)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    inv = inventory_from_gguf(tmp_path / "be.gguf", cross_check=True)
    assert (inv.tensor_count, inv.total_bytes, inv.bytes_by_component["norms"]) == (1, 256, 256)


# ---- fuzzing: the only exception allowed out is GpumemInputError -------------------------------------------

_FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)


@pytest.fixture(scope="module")
def fuzz_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf-fuzz") / "fuzz.gguf"


def _try(f: Path, content: bytes) -> None:
    f.write_bytes(content)
    try:
        inv, _spec = load_gguf(f)
    except GpumemInputError as e:
        assert str(f) in str(e)
        return
    assert inv.total_bytes == sum(t.nbytes for t in inv.tensors)
    # gguf.GGUFReader must read every file the parser accepts, and agree with it
    assert load_gguf(f, cross_check=True)[0] == inv


@_FUZZ
@given(data=st.data())
def test_fuzz_mutated_bytes(fuzz_file: Path, valid_bytes: bytes, data: st.DataObject) -> None:
    # mostly in the header, where the structure is; the data section is zeros either way
    header_end = min(len(valid_bytes), 900)
    mutations = data.draw(
        st.lists(st.tuples(st.integers(0, header_end - 1), st.integers(0, 255)), min_size=1, max_size=6)
    )
    b = bytearray(valid_bytes)
    for pos, val in mutations:
        b[pos] = val
    _try(fuzz_file, bytes(b))


@_FUZZ
@given(data=st.data())
def test_fuzz_truncated(fuzz_file: Path, valid_bytes: bytes, data: st.DataObject) -> None:
    _try(fuzz_file, valid_bytes[: data.draw(st.integers(0, len(valid_bytes)))])


@_FUZZ
@given(
    version=st.sampled_from([1, 2, 3, 4, 0x03000000]),
    n_tensors=st.integers(0, 2**64 - 1) | st.integers(0, 3),
    n_kv=st.integers(0, 2**64 - 1) | st.integers(0, 3),
    rest=st.binary(max_size=200),
)
def test_fuzz_random_headers(fuzz_file: Path, version: int, n_tensors: int, n_kv: int, rest: bytes) -> None:
    _try(fuzz_file, b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + rest)


@_FUZZ
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "llama.embedding_length",
                    "llama.block_count",
                    "llama.attention.head_count",
                    "llama.attention.head_count_kv",
                    "llama.feed_forward_length",
                    "general.architecture",
                    "general.alignment",
                    "llama.vocab_size",
                    "llama.attention.key_length",
                ]
            ),
            st.integers(0, 12),
            st.integers(0, 2**32 - 1),
        ),
        max_size=6,
        unique_by=lambda kv: kv[0],
    )
)
def test_fuzz_metadata_values(fuzz_file: Path, kvs: list[tuple[str, int, int]]) -> None:
    """Well-formed files with arbitrary metadata values: spec building must fail cleanly too."""
    body = b""
    for key, vtype, value in kvs:
        body += _s(key) + struct.pack("<I", vtype)
        if vtype == 8:
            body += _s(str(value))
        elif vtype == 9:
            body += struct.pack("<IQ", 4, 2) + struct.pack("<II", value, value)
        elif vtype in (10, 11, 12):
            body += struct.pack("<Q", value)
        elif vtype in (0, 1, 7):
            body += struct.pack("<B", value & 0xFF)
        elif vtype in (2, 3):
            body += struct.pack("<H", value & 0xFFFF)
        else:
            body += struct.pack("<I", value)
    arch = _s("general.architecture") + struct.pack("<I", 8) + _s("llama")
    n_kv = len(kvs) + (0 if any(k == "general.architecture" for k, _, _ in kvs) else 1)
    if n_kv > len(kvs):
        body = arch + body
    tensor = _s("blk.0.attn_norm.weight") + struct.pack("<IQIQ", 1, 8, 0, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, n_kv) + body + tensor
    _try(fuzz_file, head + b"\0" * (-len(head) % 32) + b"\0" * 64)
