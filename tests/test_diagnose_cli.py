"""Issue 32 item 2: ``gpumem diagnose`` end to end on the published reports in tests/reference/observed/
(their sources in sources.json): a file, standard input, ``--json`` (schema gpumem.diagnosis/1), a run
against the estimate, picking a GPU, and bad input (one line, exit 2)."""

from __future__ import annotations

import io
import json
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from gpumem_gui.core import MiB
from tests.test_fuzz_cli import check_cli, run_cli

DIR = Path(__file__).parent / "reference" / "observed"
# https://github.com/qingze-bai/VSmTrans/issues/3: a 226.00 MiB request on a 15.70 GiB GPU, 336.73 MiB
# reserved but unallocated (so fragmentation), this process 15.48 GiB
VSMTRANS = DIR / "torch_oom_current_vsmtrans3.txt"
# https://github.com/pytorch/pytorch/issues/59778: the legacy form (no process figure), 2.26 GiB requested
LEGACY = DIR / "torch_oom_legacy_pytorch59778.txt"


def test_file_human_output_names_the_parts_in_gib_and_the_fragmentation() -> None:
    rc, out, err = check_cli(["diagnose", "--observed", str(VSMTRANS)])
    assert rc == 0, err
    assert "GiB" in out and "tensors (allocated by PyTorch)" in out and "14.81" in out
    assert "fragmentation:" in out and "expandable_segments:True" in out
    assert "no comparison with an estimate" in out


def test_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(VSMTRANS.read_bytes())))
    rc, out, _ = check_cli(["diagnose", "--observed", "-", "--json"])
    assert rc == 0
    doc = json.loads(out)
    assert doc["observed"]["requested_bytes"] == 226 * MiB


def test_json_schema_keys() -> None:
    rc, out, _ = check_cli(["diagnose", "--observed", str(LEGACY), "--json"])
    assert rc == 0
    doc = json.loads(out)
    assert doc["schema"] == "gpumem.diagnosis/1"
    observed = doc["observed"]
    keys = ["total_bytes", "free_bytes", "process_bytes", "allocated_bytes", "reserved_unallocated_bytes"]
    assert list(observed)[:6] == [*keys, "requested_bytes"]
    assert observed["process_bytes"] is None  # the legacy form does not state it
    assert observed["source_format"] == "torch_oom_legacy" and observed["unread"]
    assert "reserved_unallocated_bytes" in observed["derived"]
    assert [p["key"] for p in doc["parts"]] == [
        "tensors",
        "allocator_cache",
        "outside_pytorch_or_others",
        "free",
    ]
    assert doc["estimate"] is None and doc["predicted_failure"] is None and isinstance(doc["changes"], list)


def test_with_a_run_compares_and_judges() -> None:
    argv = [
        "diagnose",
        "meta-llama/Llama-3.2-1B",
        "--batch",
        "64",
        "--seq",
        "4096",
        "--observed",
        str(VSMTRANS),
    ]
    rc, out, _ = check_cli([*argv, "--json"])
    assert rc == 0
    doc = json.loads(out)
    p = doc["predicted_failure"]
    assert p["capacity_bytes"] == doc["observed"]["total_bytes"] == round(Fraction("15.70") * (1 << 30))
    assert p["observed_failed"] is True and isinstance(p["agrees"], bool)
    keys = ["tensors", "non_tensor", "process", "allocator_cache", "outside_pytorch"]
    assert [c["key"] for c in doc["estimate"]["compared"]] == keys
    assert any(c["update"] for c in doc["changes"])  # the fit report's run changes
    rc, out, _ = check_cli(argv)
    assert rc == 0 and "estimate for meta-llama/Llama-3.2-1B" in out and "changes that would have" in out


def _two_gpus(tmp_path: Path) -> Path:
    one = VSMTRANS.read_text().strip().splitlines()[-1]
    path = tmp_path / "two.txt"
    path.write_text(
        one + "\n" + one.replace("GPU 0 has", "GPU 1 has").replace("226.00 MiB", "1.00 GiB") + "\n"
    )
    return path


def test_gpu_index_picks_a_record(tmp_path: Path) -> None:
    path = _two_gpus(tmp_path)
    rc, _, err = check_cli(["diagnose", "--observed", str(path)])
    assert rc == 2 and "--gpu-index" in err and "0, 1" in err
    rc, out, _ = check_cli(["diagnose", "--observed", str(path), "--gpu-index", "1", "--json"])
    assert rc == 0 and json.loads(out)["observed"]["requested_bytes"] == 1024 * MiB
    rc, _, err = check_cli(["diagnose", "--observed", str(path), "--gpu-index", "7"])
    assert rc == 2 and "no GPU 7" in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--observed", "/nonexistent/oom.txt"], "cannot read"),
        (["--observed", "/"], "folder"),
        (["--observed", "x" * 5000], "cannot read"),  # the fuzzer's find: Path.is_dir raised OSError
        (["--observed", "a\x00b"], "not a path"),
        (["--observed", str(Path(__file__))], "no memory report"),
        (["--observed", str(VSMTRANS), "--batch", "4"], "name its MODEL"),
        (["--observed", str(VSMTRANS), "--gpu-index", "-1"], "gpu-index"),
        (["--observed", str(VSMTRANS), "--gpu", "nope-gpu"], "nope-gpu"),
        (["nope-model", "--observed", str(VSMTRANS)], "nope-model"),
        ([], "--observed"),
    ],
)
def test_bad_input_one_line_exit_2(argv: list[str], words: str) -> None:
    rc, _, err = check_cli(["diagnose", *argv])
    assert rc == 2 and words in err


def test_empty_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    rc, _, err = run_cli(["diagnose", "--observed", "-"])
    assert rc == 2 and "standard input" in err and "empty" in err


def test_nvidia_smi_table_of_several_gpus_needs_an_index() -> None:
    # https://github.com/karfly/learnable-triangulation-pytorch/issues/80: four GPU rows
    path = DIR / "nvidia_smi_table_triangulation80.txt"
    rc, _, err = check_cli(["diagnose", "--observed", str(path)])
    assert rc == 2 and "0, 1, 2, 3" in err
    rc, out, _ = check_cli(["diagnose", "--observed", str(path), "--gpu-index", "1", "--json"])
    doc = json.loads(out)
    assert (
        rc == 0
        and doc["observed"]["gpu_index"] == 1
        and doc["observed"]["source_format"] == "nvidia_smi_table"
    )
    assert [p["key"] for p in doc["parts"]] == ["every_process"]


def test_a_memory_snapshot_pickle_file(tmp_path: Path) -> None:
    # the snapshot tests/test_observed_snapshot.py documents: device 0 failed a 96 MiB request with 8 + 2 MiB
    # cached (no fragmentation: the request is larger), pickled as torch.cuda.memory._dump_snapshot does
    import pickle

    from tests.test_observed_snapshot import SNAPSHOT

    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(SNAPSHOT, protocol=4))
    rc, out, err = check_cli(["diagnose", "--observed", str(path), "--gpu-index", "0", "--json"])
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["observed"]["source_format"] == "torch_memory_snapshot"
    assert doc["observed"]["requested_bytes"] == 96 * MiB
    assert doc["causes"]["fragmentation"] is False
