"""Malformed safetensors files, each a GpumemInputError naming the file and the problem; fuzzing the
reader."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.safetensors import DTYPE_BITS, MAX_HEADER_BYTES, inventory_from_safetensors
from tests.safetensors_files import GPTQ, header_json, raw_file

# ---- malformed files: each a GpumemInputError naming the file and the problem ---------------------------

GOOD = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}


def _entry(**over: object) -> dict[str, object]:
    return {"w": {**GOOD["w"], **over}}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "too short for a safetensors header length"),
        (b"\x05\0\0", "too short for a safetensors header length"),
        (struct.pack("<Q", 0) + b"{}", "header length is 0"),
        (
            struct.pack("<Q", 123456) + b"{}" + b" " * 100,
            "header length 123456 is larger than the file (110 bytes)",
        ),
        (struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}", "exceeds the safetensors limit of 100000000 bytes"),
        (struct.pack("<Q", 2**64 - 1), "exceeds the safetensors limit"),
        (struct.pack("<Q", 4) + b"\xff\xfe{}", "not valid UTF-8"),
        (struct.pack("<Q", 5) + b"{abc}", "not valid JSON"),
        (raw_file([1, 2], 0), "must be a JSON object, got list"),
        (raw_file("x", 0), "must be a JSON object, got str"),
        (struct.pack("<Q", 17) + b'{"a": 1, "a": 2} ', "header lists 'a' twice"),
        (raw_file({"w": 3}, 0), "entry must be an object"),
        (raw_file({"w": {"shape": [1], "data_offsets": [0, 4]}}, 4), "entry has no dtype"),
        (raw_file({"w": {"dtype": "F32"}}, 4), "entry has no shape, data_offsets"),
        (raw_file(_entry(dtype="F128"), 16), "unknown dtype 'F128'"),
        (raw_file(_entry(dtype=7), 16), "unknown dtype 7"),
        (raw_file(_entry(shape=[2, -2]), 16), "negative dimension"),
        (raw_file(_entry(shape=[2, 2.0]), 16), "shape must be a list of integers"),
        (raw_file(_entry(shape=[True, 4]), 16), "shape must be a list of integers"),
        (raw_file(_entry(shape="2x2"), 16), "shape must be a list of integers"),
        (raw_file(_entry(data_offsets=[0]), 16), "data_offsets must be [begin, end] integers"),
        (raw_file(_entry(data_offsets=[0, 16.0]), 16), "data_offsets must be [begin, end] integers"),
        (raw_file(_entry(data_offsets={"begin": 0}), 16), "data_offsets must be [begin, end] integers"),
        (raw_file(_entry(data_offsets=[16, 0]), 16), "must satisfy 0 <= begin <= end"),
        (raw_file(_entry(data_offsets=[-4, 12]), 16), "must satisfy 0 <= begin <= end"),
        (raw_file(_entry(data_offsets=[0, 12]), 16), "span 12 bytes but shape [2, 2] of F32 needs 16"),
        (raw_file(GOOD, 8), "beyond the file"),
        (raw_file(_entry(data_offsets=[4, 20]), 20), "leaves a gap of 4 bytes"),
        (raw_file(GOOD, 20), "tensor data covers 16 bytes but the file holds 20 bytes"),
        (
            raw_file({"a": GOOD["w"], "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}}, 16),
            "overlaps the previous tensor",
        ),
        (raw_file({"__metadata__": {"a": 1}, **GOOD}, 16), "'__metadata__' must be an object of strings"),
        (raw_file({"__metadata__": [1], **GOOD}, 16), "'__metadata__' must be an object of strings"),
        (struct.pack("<Q", 4000) + b"[" * 4000 + b"\0" * 16, "not valid JSON"),
    ],
)
def test_malformed(tmp_path: Path, content: bytes, message: str) -> None:
    f = tmp_path / "bad.safetensors"
    f.write_bytes(content)
    with pytest.raises(GpumemInputError) as ei:
        inventory_from_safetensors(f)
    assert message in str(ei.value)
    assert str(f) in str(ei.value)


def test_empty_header_object_is_valid(tmp_path: Path) -> None:
    f = tmp_path / "empty.safetensors"
    f.write_bytes(raw_file({}, 0))
    inv = inventory_from_safetensors(f)
    assert (inv.tensor_count, inv.total_bytes) == (0, 0)


# ---- fuzzing: the only exception allowed out of the reader is GpumemInputError ----------------------------

_FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
_VALID = raw_file(*header_json({**GPTQ, "lm_head.weight": ("BF16", [4, 4])}, metadata={"format": "pt"}))


@pytest.fixture(scope="module")
def fuzz_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("st-fuzz") / "fuzz.safetensors"


def _try(f: Path, content: bytes) -> None:
    f.write_bytes(content)
    try:
        inv = inventory_from_safetensors(f)
    except GpumemInputError as e:
        assert str(f) in str(e)
        return
    assert inv.total_bytes == sum(t.nbytes for t in inv.tensors)


@_FUZZ
@given(st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8))
def test_fuzz_mutated_bytes(fuzz_file: Path, mutations: list[tuple[int, int]]) -> None:
    b = bytearray(_VALID)
    for pos, val in mutations:
        b[pos] = val
    _try(fuzz_file, bytes(b))


@_FUZZ
@given(st.integers(0, len(_VALID)))
def test_fuzz_truncated(fuzz_file: Path, n: int) -> None:
    _try(fuzz_file, _VALID[:n])


@_FUZZ
@given(st.integers(0, 2**64 - 1), st.binary(max_size=64))
def test_fuzz_header_length(fuzz_file: Path, n: int, rest: bytes) -> None:
    _try(fuzz_file, struct.pack("<Q", n) + rest)


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
_entry_strategy = st.fixed_dictionaries(
    {},
    optional={
        "dtype": st.sampled_from([*DTYPE_BITS, "F128", ""]) | _json,
        "shape": st.lists(st.integers(-2, 6), max_size=3) | _json,
        "data_offsets": st.lists(st.integers(-2, 200), min_size=0, max_size=3) | _json,
    },
)


@_FUZZ
@given(
    st.dictionaries(st.text(max_size=10), _entry_strategy | _json, max_size=4),
    st.integers(0, 256),
    st.booleans(),
)
def test_fuzz_random_json_headers(fuzz_file: Path, header: dict[str, Any], data_size: int, pad: bool) -> None:
    _try(fuzz_file, raw_file(header, data_size, pad=pad))
