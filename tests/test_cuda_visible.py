"""parse_cuda_visible_devices follows CUDA's rules: order, stop at an invalid entry, duplicates, MIG."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpumem_gui.hardware import GpuDevice, parse_cuda_visible_devices, with_cuda_indices

UUIDS = [
    "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6",
    "GPU-18ef14e9-0000-4106-c12f-20bd9faed9f6",
    "GPU-849d5a8d-1111-4106-c12f-20bd9faed9f6",
    "GPU-849d0000-2222-4106-c12f-20bd9faed9f6",  # shares the prefix GPU-849d with the one above
]


def gpus(n: int = 4) -> list[GpuDevice]:
    return [GpuDevice(index=i, uuid=UUIDS[i], name="NVIDIA H100 80GB HBM3", mig_mode=False) for i in range(n)]


def mig_machine() -> list[GpuDevice]:
    """GPU 0 plain, GPU 1 in MIG mode with instances 0 and 1, GPU 2 in MIG mode without any, GPU 3 plain."""
    devs = gpus(4)
    devs[1] = devs[1].model_copy(update={"mig_mode": True})
    devs[2] = devs[2].model_copy(update={"mig_mode": True})
    migs = [
        GpuDevice(
            index=j,
            uuid=f"MIG-d184f67c-c95f-5ef2-a935-19{j}bd0094fbd",
            name="NVIDIA H100 80GB HBM3 MIG 3g.40gb",
            is_mig_instance=True,
            parent_index=1,
            parent_uuid=UUIDS[1],
            gpu_instance_id=1 + j,
            compute_instance_id=0,
        )
        for j in range(2)
    ]
    return [devs[0], devs[1], *migs, devs[2], devs[3]]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, {"0": 0, "1": 1, "2": 2, "3": 3}),  # unset: all
        ("", {}),  # empty: none
        ("   ", {}),
        ("2,1", {"2": 0, "1": 1}),  # listed order
        ("0,2,-1,1", {"0": 0, "2": 1}),  # CUDA's own example: stops at -1
        ("0,7,1", {"0": 0}),  # out of range stops
        ("1,x,0", {"1": 0}),  # not a number stops
        ("1,,0", {"1": 0}),  # an empty entry stops
        (" 3 , 0 ", {"3": 0, "0": 1}),  # blanks ignored
        ("1gpu,2ampere", {"1": 0, "2": 1}),  # strtoul: trailing characters ignored
        ("+2", {"2": 0}),
        ("0,1,0", {}),  # a duplicate invalidates the whole list
        ("1,1", {}),
        ("0,-1,0", {"0": 0}),  # ... but only when reached before an invalid entry
    ],
)
def test_indices(value: str | None, expected: dict[str, int]) -> None:
    assert parse_cuda_visible_devices(value, gpus()) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (UUIDS[1], {"1": 0}),
        (f"{UUIDS[2]},{UUIDS[0]}", {"2": 0, "0": 1}),
        ("GPU-8932f937", {"0": 0}),  # a unique prefix
        ("gpu-8932F937", {"0": 0}),  # case does not matter
        ("GPU-18ef,GPU-849d5", {"1": 0, "2": 1}),
        ("GPU-18ef,GPU-849d,GPU-8932", {"1": 0}),  # GPU-849d names two GPUs: ambiguous, stops
        ("GPU-18ef,GPU-ffff", {"1": 0}),  # unknown UUID stops
        ("GPU-18ef,0", {"1": 0}),  # the first entry chose UUIDs: an index is invalid
        ("0,GPU-18ef", {"0": 0}),  # and the other way round
        ("GPU-18ef,GPU-18ef14e9", {}),  # the same GPU twice
    ],
)
def test_uuids(value: str, expected: dict[str, int]) -> None:
    assert parse_cuda_visible_devices(value, gpus()) == expected


def test_mig_rules() -> None:
    devs = mig_machine()
    mig0, mig1 = devs[2].uuid, devs[3].uuid
    assert mig0 is not None and mig1 is not None
    # unset: GPU 1 is the first MIG-mode GPU with an instance; CUDA enumerates that one device only
    assert parse_cuda_visible_devices(None, devs) == {"1:0": 0}
    assert parse_cuda_visible_devices("0,3", devs) == {"0": 0, "3": 1}  # no MIG GPU listed
    assert parse_cuda_visible_devices("3,1", devs) == {"1:0": 0}
    assert parse_cuda_visible_devices("2,0", devs) == {"0": 0}  # MIG mode but no instance: skipped
    assert parse_cuda_visible_devices(mig1, devs) == {"1:1": 0}
    assert parse_cuda_visible_devices(f"{mig1},{mig0}", devs) == {"1:1": 0}  # at most one MIG device
    assert parse_cuda_visible_devices(f"{UUIDS[0]},{mig0}", devs) == {"1:0": 0}
    assert parse_cuda_visible_devices("MIG-d184f67c", devs) == {}  # ambiguous MIG prefix
    assert parse_cuda_visible_devices(f"MIG-{UUIDS[1]}/2/0", devs) == {"1:1": 0}  # R450 form
    assert parse_cuda_visible_devices(f"MIG-{UUIDS[1][:12]}/1/0", devs) == {"1:0": 0}
    assert parse_cuda_visible_devices(f"MIG-{UUIDS[1]}/9/0", devs) == {}  # no such GI
    assert parse_cuda_visible_devices(f"MIG-{UUIDS[1]}/x", devs) == {}


def test_with_cuda_indices_sets_and_clears() -> None:
    devs = with_cuda_indices(gpus(3), "2,0")
    assert [d.cuda_index for d in devs] == [1, None, 0]
    again = with_cuda_indices(devs, None)
    assert [d.cuda_index for d in again] == [0, 1, 2]


def test_lost_gpu_without_uuid_still_counts_for_indices() -> None:
    devs = gpus(2)
    devs[0] = GpuDevice(index=0, name="unknown GPU", error="lost", processes=None)
    assert parse_cuda_visible_devices("1", devs) == {"1": 0}
    assert parse_cuda_visible_devices("GPU-18ef", devs) == {"1": 0}


@given(st.permutations(range(4)), st.integers(min_value=0, max_value=4))
def test_any_prefix_of_a_permutation(perm: list[int], k: int) -> None:
    value = ",".join(str(i) for i in perm[:k])
    expected = {str(i): n for n, i in enumerate(perm[:k])}
    assert parse_cuda_visible_devices(value, gpus()) == expected


@given(st.text(alphabet="0123456789,-+ GPUMIabcdef/x", max_size=40))
def test_never_crashes_and_numbers_densely(value: str) -> None:
    for devs in (gpus(), mig_machine()):
        result = parse_cuda_visible_devices(value, devs)
        assert sorted(result.values()) == list(range(len(result)))
        assert set(result) <= {d.key for d in devs}
