"""FakeBackend on broken scenarios (one clear line naming file and field), the default and null backends,
and immutable snapshots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.hardware import (
    FakeBackend,
    GpuBackend,
    GpuDevice,
    GpuSnapshot,
    NullBackend,
    NvmlBackend,
    default_backend,
    scenarios_dir,
)
from tests.fake_scenarios import one_gpu


@pytest.fixture(autouse=True)
def _no_cuda_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


# ---- broken scenarios -----------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "broken.json"
    p.write_text(text)
    return p


def test_bad_json_names_the_file(tmp_path: Path) -> None:
    p = write(tmp_path, '{"gpus": [}')
    with pytest.raises(GpumemInputError) as info:
        FakeBackend(p)
    msg = str(info.value)
    assert str(p) in msg and "malformed JSON" in msg and "line 1" in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("doc", "field", "words"),
    [
        (one_gpu(total_mib=-1), "gpus.0.total_mib", "greater than 0"),
        ({"gpus": [{"total_mib": 10}]}, "gpus.0.name", "required"),
        (one_gpu(colour="red"), "gpus.0.colour", "Extra inputs"),
        (one_gpu(utilization_percent=[10, 101]), "gpus.0.utilization_percent", ""),
        (one_gpu(not_supported=["fan"]), "gpus.0.not_supported.0", ""),
        ({"faults": {"nvml_init_error": "gremlins"}}, "faults.nvml_init_error", ""),
        ({"at_end": "bounce"}, "at_end", ""),
        ({"version": 2}, "version", ""),
    ],
)
def test_bad_field_names_file_and_field(tmp_path: Path, doc: dict, field: str, words: str) -> None:
    p = write(tmp_path, json.dumps(doc))
    with pytest.raises(GpumemInputError) as info:
        FakeBackend(p)
    msg = str(info.value)
    assert msg.startswith(f"{p}: field '{field}")
    assert words in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("gpu", "words"),
    [
        ({"used_mib": [10, 30000]}, "step 1: used_mib 30000"),
        ({"reserved_mib": 30000}, "reserved_mib (30000) is more than total_mib"),
        (
            {"mig_instances": [{"profile": "7g.80gb", "total_mib": 80000, "gpu_instance_id": 0}]},
            "MIG instances",
        ),
        (
            {
                "mig_mode": False,
                "mig_instances": [{"profile": "1g.10gb", "total_mib": 9728, "gpu_instance_id": 9}],
            },
            "mig_mode is false",
        ),
    ],
)
def test_inconsistent_gpu_is_rejected(tmp_path: Path, gpu: dict, words: str) -> None:
    p = write(tmp_path, json.dumps(one_gpu(**gpu)))
    with pytest.raises(GpumemInputError, match=r"field 'gpus\.0'") as info:
        FakeBackend(p)
    assert words in str(info.value)


def test_not_an_object(tmp_path: Path) -> None:
    with pytest.raises(GpumemInputError, match="must be a JSON object"):
        FakeBackend(write(tmp_path, "[1, 2]"))


def test_missing_file_lists_the_shipped_ones(tmp_path: Path) -> None:
    with pytest.raises(GpumemInputError) as info:
        FakeBackend(tmp_path / "nope.json")
    assert "rtx4090_browser" in str(info.value)
    with pytest.raises(GpumemInputError):
        FakeBackend("no_such_scenario")


def test_bad_inline_scenario() -> None:
    with pytest.raises(GpumemInputError, match=r"fake GPU scenario: field 'gpus\.0\.total_mib'"):
        FakeBackend(one_gpu(total_mib="lots"))


# ---- default backend, null backend, immutability -----------------------------------------------------------


def test_default_backend() -> None:
    assert isinstance(default_backend(), NvmlBackend)
    fake = default_backend(scenarios_dir() / "a100_mig.json")
    assert isinstance(fake, FakeBackend) and fake.name == "fake:a100_mig"
    assert isinstance(default_backend("gpu_lost"), FakeBackend)


def test_null_backend() -> None:
    b = NullBackend("no GPU here")
    assert isinstance(b, GpuBackend)
    snap = b.snapshot()
    assert snap.unavailable_reason == "no GPU here" and snap.devices == () and snap.backend == "null"
    b.close()


def test_snapshots_are_immutable() -> None:
    snap = FakeBackend("rtx4090_browser").snapshot()
    with pytest.raises(ValidationError):
        snap.devices[0].used_bytes = 0  # type: ignore[misc]
    with pytest.raises(ValidationError):
        snap.backend = "x"  # type: ignore[misc]
    assert isinstance(snap.devices, tuple)


def test_snapshot_validation() -> None:
    with pytest.raises(ValidationError):
        GpuSnapshot(taken_at=0, backend="x", unavailable_reason="r", devices=(GpuDevice(index=0, name="g"),))
    with pytest.raises(ValidationError):
        GpuDevice(index=0, name="g", is_mig_instance=True)
    with pytest.raises(ValidationError):
        GpuSnapshot(
            taken_at=0, backend="x", devices=(GpuDevice(index=0, name="g"), GpuDevice(index=0, name="h"))
        )
