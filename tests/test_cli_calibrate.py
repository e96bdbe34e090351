"""Issue 32 item 3 end to end: ``gpumem calibrate`` saves what a published OOM message implies, ``estimate`` /
``fit`` on that GPU apply it with a note (``--no-calibration`` leaves it out), ``gpumem calibrations`` lists
and removes; bad input is one line and exit status 2."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from gpumem_gui.cli import main

OBSERVED = Path(__file__).parent / "reference" / "observed"
# https://github.com/pytorch/pytorch/issues/16417 (comment of 2024-03-13; tests/reference/observed/
# sources.json): "GPU 0 has a total capacity of 23.65 GiB ... this process has 23.60 GiB memory in use. Of the
# allocated memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTorch but unallocated."
OOM = OBSERVED / "torch_oom_current_pytorch16417.txt"
MODEL = "meta-llama/Llama-3.2-1B"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    path = tmp_path / "calibrations.json"
    monkeypatch.setenv("GPUMEM_CALIBRATIONS", str(path))
    return path


def _components(doc: dict) -> dict[str, int]:
    return {c["key"]: c["bytes"] for c in doc["components"]}


def test_calibrate_then_estimate_and_fit_apply_it(capsys: pytest.CaptureFixture[str], store: Path) -> None:
    code, out, err = run(
        capsys, "calibrate", "--observed", str(OOM), "--name", "oom-4090", "--gpu", "RTX-4090"
    )
    assert code == 0, err
    assert "saved calibration 'oom-4090'" in out and "non-PyTorch memory: 0.51 GiB" in out
    saved = json.loads(store.read_text())["calibrations"][0]
    # 23.60 GiB - (22.90 GiB + 194.87 MiB), each as the message prints it (format_size: 2 decimals)
    assert saved["non_torch_bytes"] == round(23.60 * 2**30) - (round(22.90 * 2**30) + round(194.87 * 2**20))
    args = ("estimate", MODEL, "--seq", "4096", "--gpu", "RTX-4090", "--json")
    code, out, _ = run(capsys, *args)
    with_cal = json.loads(out)
    code2, out2, _ = run(capsys, *args, "--no-calibration")
    plain = json.loads(out2)
    assert code == code2 == 0
    a, b = _components(with_cal), _components(plain)
    assert a["non_torch"] == saved["non_torch_bytes"] and "cuda_context" not in a
    moved = (a["non_torch"] - b["cuda_context"]) + (a["allocator_reserve"] - b["allocator_reserve"])
    assert with_cal["total_bytes"] == plain["total_bytes"] + moved
    assert with_cal["facts"]["calibration"] == "oom-4090" and "calibration" not in plain["facts"]
    assert with_cal["fit"]["verdicts"][0]["needed_bytes"] == with_cal["total_bytes"]
    # the text report says so before the estimate; fit applies it too
    code, out, _ = run(capsys, "fit", MODEL, "--seq", "4096", "--gpu", "RTX-4090")
    assert code == 0 and out.startswith("note: calibration 'oom-4090' applied")
    assert "non-PyTorch memory (calibration 'oom-4090')" in out
    # another GPU, or another engine, gets none
    code, out, _ = run(capsys, "estimate", MODEL, "--gpu", "A100-80GB")
    assert "calibration" not in out
    code, out, _ = run(
        capsys, "estimate", MODEL, "--engine", "vllm", "--gpu", "RTX-4090", "--max-model-len", "4096"
    )
    assert code == 0 and "calibration" not in out
    code, out, _ = run(capsys, "estimate", MODEL, "--mode", "train", "--seq", "512", "--gpu", "RTX-4090")
    assert code == 0 and "calibration" not in out  # measured in inference (the default --mode)
    assert saved["mode"] == "inference" and saved["engine"] == "transformers"


def test_calibrations_list_json_and_remove(capsys: pytest.CaptureFixture[str], store: Path) -> None:
    code, out, _ = run(capsys, "calibrations")
    assert code == 0 and "no calibrations" in out
    stdin = io.TextIOWrapper(io.BytesIO(OOM.read_bytes()))
    sys.stdin, old = stdin, sys.stdin
    try:
        code, out, err = run(
            capsys, "calibrate", "--observed", "-", "--name", "from-stdin",
            "--gpu", "NVIDIA GeForce RTX 4090", "--stack-torch", "2.2.1", "--measured-on", "2024-03-13",
            "--json",
        )  # fmt: skip
    finally:
        sys.stdin = old
    assert code == 0, err
    doc = json.loads(out)
    assert doc["calibrations"][0]["stack"]["torch"] == "2.2.1"
    assert doc["calibrations"][0]["measurement"]["measured_on"] == "2024-03-13"
    code, out, _ = run(capsys, "calibrations", "--json")
    listed = json.loads(out)
    assert listed["schema"] == "gpumem.calibrations/1" and [c["name"] for c in listed["calibrations"]] == [
        "from-stdin"
    ]
    code, out, _ = run(capsys, "calibrations")
    assert "from-stdin" in out and "NVIDIA GeForce RTX 4090" in out
    # matched by the catalog id of the same GPU
    code, out, _ = run(capsys, "estimate", MODEL, "--gpu", "4090")
    assert "calibration 'from-stdin' applied" in out
    code, out, _ = run(capsys, "calibrations", "--remove", "from-stdin")
    assert code == 0 and "removed calibration 'from-stdin'" in out
    code, out, _ = run(capsys, "estimate", MODEL, "--gpu", "4090")
    assert "calibration" not in out


def test_the_run_named_is_checked_and_shown_calibrated(
    capsys: pytest.CaptureFixture[str], store: Path
) -> None:
    code, _, err = run(
        capsys,
        "calibrate",
        MODEL,
        "--engine",
        "vllm",
        "--observed",
        str(OOM),
        "--name",
        "x",
        "--gpu",
        "RTX-4090",
    )
    assert code == 2 and "none of the components a calibration replaces" in err
    assert not store.exists()
    code, out, err = run(
        capsys,
        "calibrate",
        MODEL,
        "--seq",
        "4096",
        "--observed",
        str(OOM),
        "--name",
        "x",
        "--gpu",
        "RTX-4090",
    )
    assert code == 0, err
    with_cal = json.loads(run(capsys, "estimate", MODEL, "--seq", "4096", "--gpu", "RTX-4090", "--json")[1])
    assert f"{with_cal['total_bytes'] / 2**30:,.2f} GiB calibrated" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("calibrate", "--observed", "/nonexistent/oom.txt", "--name", "x"), "No such file"),
        (("calibrate", "--observed", str(OOM), "--name", "x"), "does not name its GPU"),
        (
            ("calibrate", "--observed", str(OOM), "--name", "x", "--gpu", "H100", "--gpu-index", "2"),
            "no GPU 2",
        ),
        (
            ("calibrate", "--observed", str(OOM), "--name", "x", "--gpu", "H100", "--measured-on", "May 1"),
            "YYYY-MM-DD",
        ),
        (("calibrate", "--observed", str(OOM), "--name", "", "--gpu", "H100"), "name"),
        (
            ("calibrate", "--observed", str(Path(__file__)), "--name", "x", "--gpu", "H100"),
            "no memory report",
        ),
        (("calibrations", "--remove", "nope"), "no calibration named 'nope'"),
    ],
)
def test_bad_input_is_one_line_and_status_2(
    capsys: pytest.CaptureFixture[str], store: Path, argv: tuple[str, ...], message: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not store.exists()  # nothing saved


def test_a_corrupt_store_is_one_warning_and_the_estimate_goes_on(
    capsys: pytest.CaptureFixture[str], store: Path
) -> None:
    store.write_text("{not json")
    code, out, err = run(capsys, "estimate", MODEL, "--gpu", "RTX-4090")
    assert code == 0 and "GPU memory needed" in out
    assert err.startswith("gpumem: warning: calibrations file") and err.count("\n") == 1
    assert len(list(store.parent.glob("calibrations.json.corrupt-*"))) == 1


def test_sweep_applies_it_too(capsys: pytest.CaptureFixture[str], store: Path) -> None:
    assert run(capsys, "calibrate", "--observed", str(OOM), "--name", "c", "--gpu", "RTX-4090")[0] == 0
    args = (
        "sweep",
        MODEL,
        "--over",
        "seq",
        "--from",
        "1024",
        "--to",
        "2048",
        "--steps",
        "2",
        "--gpu",
        "RTX-4090",
    )
    with_cal = json.loads(run(capsys, *args, "--json")[1])["points"]
    plain = json.loads(run(capsys, *args, "--json", "--no-calibration")[1])["points"]
    est = json.loads(run(capsys, "estimate", MODEL, "--seq", "2048", "--gpu", "RTX-4090", "--json")[1])
    assert with_cal[-1]["total_bytes"] == est["total_bytes"] != plain[-1]["total_bytes"]
    assert [p["peak_bytes"] for p in with_cal] == [p["peak_bytes"] for p in plain]


def test_a_memory_summary_gives_the_allocator_ratio_only(
    capsys: pytest.CaptureFixture[str], store: Path
) -> None:
    # pytorch/pytorch#35901 (its URL in tests/reference/observed/sources.json): a memory_summary() with peak
    # allocated 4.76 GiB and peak reserved 12.13 GiB (a fragmented cache)
    summary = OBSERVED / "torch_summary_pytorch35901.txt"
    code, out, err = run(
        capsys, "calibrate", "--observed", str(summary), "--name", "frag", "--gpu", "A100-80GB"
    )
    assert code == 0, err
    assert "non-PyTorch memory: not measured" in out and "reserved / allocated = 2.5466" in out
    saved = json.loads(store.read_text())["calibrations"][0]
    assert saved["allocator_ratio"] == 13023313920 / 5113905152 and saved["non_torch_bytes"] is None
    code, out, _ = run(capsys, "estimate", MODEL, "--gpu", "A100-80GB")
    assert "reserved / allocated 2.5466 at 4.76 GiB allocated" in out
    assert "CUDA context" in out  # not measured: the default stays
    # an nvidia-smi table of other GPUs pasted with it: the figures are not of one process
    smi = (OBSERVED / "nvidia_smi_table_rlinf255.txt").read_text()
    both = store.parent / "both.txt"
    both.write_text(smi + "\n" + summary.read_text())
    code, _, err = run(capsys, "calibrate", "--observed", str(both), "--name", "x", "--gpu-index", "0")
    assert code == 2 and "below PyTorch's reserved" in err
