"""Issue 32 item 1: a torch.cuda.memory._snapshot() pickle, read by the restricted unpickler only.

``_snapshot()`` needs CUDA, so the snapshot here is the dict torch/cuda/memory.py's ``_snapshot`` docstring
documents (``segments`` with ``device``, ``total_size``, ``allocated_size``, ``active_size``, ``stream``,
``segment_type``, ``blocks`` with ``size`` / ``requested_size`` / ``state`` / ``frames``; ``device_traces``
with an ``"oom"`` entry holding ``size`` and ``device_free``), pickled as ``_dump_snapshot`` does
(``pickle.dump``) with protocols 2, 4 and 5. A pickle whose ``__reduce__`` runs ``os.system`` must be refused
before anything runs.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from gpumem_gui.core import GpumemInputError, read_observed_bytes

MiB = 1 << 20
FRAME = {"filename": "train.py", "line": 42, "name": "forward"}


def _block(size: int, state: str) -> dict:
    return {"size": size, "requested_size": size - 512, "address": 0, "state": state, "frames": [FRAME]}


SNAPSHOT = {
    "segments": [
        {  # device 0: a 20 MiB large segment split into 12 MiB in use and 8 MiB cached
            "device": 0,
            "address": 139_000_000_000,
            "total_size": 20 * MiB,
            "stream": 0,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "allocated_size": 12 * MiB,
            "active_size": 12 * MiB,
            "requested_size": 12 * MiB - 512,
            "blocks": [_block(12 * MiB, "active_allocated"), _block(8 * MiB, "inactive")],
        },
        {  # device 0: a 2 MiB small segment, all cached
            "device": 0,
            "address": 140_000_000_000,
            "total_size": 2 * MiB,
            "stream": 0,
            "segment_type": "small",
            "segment_pool_id": (0, 0),
            "allocated_size": 0,
            "active_size": 0,
            "requested_size": 0,
            "blocks": [_block(2 * MiB, "inactive")],
        },
        {  # device 1: one segment in use
            "device": 1,
            "address": 150_000_000_000,
            "total_size": 40 * MiB,
            "stream": 0,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "allocated_size": 40 * MiB,
            "active_size": 40 * MiB,
            "requested_size": 40 * MiB,
            "blocks": [_block(40 * MiB, "active_allocated")],
        },
    ],
    "device_traces": [
        [
            {"action": "alloc", "addr": 139_000_000_000, "size": 12 * MiB, "stream": 0, "frames": [FRAME]},
            {"action": "oom", "size": 96 * MiB, "device_free": 30 * MiB, "stream": 0, "frames": [FRAME]},
        ],
        [],
    ],
    "allocator_settings": {"expandable_segments": False, "max_split_size": -1},
}


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_snapshot_reads_per_device(protocol: int) -> None:
    report = read_observed_bytes(pickle.dumps(SNAPSHOT, protocol=protocol))
    dev0, dev1 = report.records
    assert (dev0.source_format, dev0.gpu_index, dev1.gpu_index) == ("torch_memory_snapshot", 0, 1)
    assert dev0.stated() == {
        "free_bytes": 30 * MiB,
        "allocated_bytes": 12 * MiB,
        "reserved_bytes": 22 * MiB,
        "reserved_unallocated_bytes": 10 * MiB,
        "requested_bytes": 96 * MiB,
    }
    assert set(dev0.derived) == {"reserved_unallocated_bytes"}
    assert dev1.stated() == {
        "allocated_bytes": 40 * MiB,
        "reserved_bytes": 40 * MiB,
        "reserved_unallocated_bytes": 0,
    }


def test_old_snapshots_without_allocated_size_count_the_active_blocks() -> None:
    segments = [{k: v for k, v in s.items() if k != "allocated_size"} for s in SNAPSHOT["segments"]]
    (dev0, _) = read_observed_bytes(pickle.dumps(segments, protocol=2)).records  # memory_snapshot(): a list
    assert (dev0.allocated_bytes, dev0.reserved_bytes) == (12 * MiB, 22 * MiB)


class _Exploit:
    """What a hostile file does: unpickling it calls os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_malicious_pickle_is_refused_before_anything_runs(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "ran"
    payload = pickle.dumps({"segments": [_Exploit(marker)]}, protocol=protocol)
    with pytest.raises(GpumemInputError) as e:
        read_observed_bytes(payload)
    assert not marker.exists()
    assert "\n" not in str(e.value) and "gpumem does not load anything else" in str(e.value)


@pytest.mark.parametrize(
    "obj",
    [
        {"segments": [{b"bytes-key": 1}]},  # bytes: not a snapshot type
        {"segments": [{1, 2}]},  # a set
        {"segments": "not a list"},
        {"no_segments": []},
        [1, 2, 3],  # a list that is no segment list: no figures, still one line
    ],
)
def test_other_plain_pickles_are_refused_in_one_line(obj: object) -> None:
    try:
        report = read_observed_bytes(pickle.dumps(obj, protocol=4))
    except GpumemInputError as e:
        assert "\n" not in str(e)
    else:
        assert all(r.source_format == "torch_memory_snapshot" for r in report.records)


def test_shared_references_do_not_blow_up_the_walk() -> None:
    """A DAG of 60 levels of shared lists (2^60 paths) is walked once per object, in no time."""
    node: list = []
    for _ in range(60):
        node = [node, node]
    report = read_observed_bytes(pickle.dumps({"segments": [], "device_traces": [node]}, protocol=4))
    assert report.records[0].stated() == {}


@pytest.mark.parametrize("cut", [2, 10, 50, 200])
def test_a_truncated_pickle_is_one_line(cut: int) -> None:
    data = pickle.dumps(SNAPSHOT, protocol=4)[:cut]
    with pytest.raises(GpumemInputError) as e:
        read_observed_bytes(data)
    assert "\n" not in str(e.value)
