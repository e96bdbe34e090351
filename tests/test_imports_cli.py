"""``gpumem estimate/fit --from "COMMAND"`` and ``--from-file FILE``: the imported run printed back before the
estimate, in ``--json`` as ``imported``, run flags given alongside overriding it (and said so), exit status 2
with one line on a bad command or file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumem_gui.cli import main

DATA = Path(__file__).parent / "data" / "imports"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_estimate_from_a_vllm_command(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(
        capsys,
        "estimate",
        "--from",
        "vllm serve Qwen/Qwen3-8B -tp 2 --max-model-len 32768 --port 8000 --frob 1",
    )
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == "read as: vLLM command (vllm serve), model Qwen/Qwen3-8B"
    assert "read as: -tp 2 -> tp = 2" in lines
    assert any(line.startswith("warning: --frob 1") for line in lines)
    first_estimate = next(
        i for i, line in enumerate(lines) if line.startswith("Qwen/Qwen3-8B: inference, engine vllm")
    )
    assert all(not line.startswith("read as:") for line in lines[first_estimate:])


def test_json_carries_the_import(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(
        capsys, "estimate", "--json", "--from", "vllm serve Qwen/Qwen3-8B -tp 2 --max-model-len 8192"
    )
    assert rc == 0
    doc = json.loads(out)
    imp = doc["imported"]
    assert imp["model"] == "Qwen/Qwen3-8B" and imp["source"].startswith("vLLM")
    assert {"written": "-tp 2", "read_as": "tp = 2"} in imp["read_as"]
    assert imp["warnings"] == [] and imp["overrides"] == []
    assert doc["run"]["tp"] == 2 and doc["run"]["max_model_len"] == 8192


def test_flags_override_the_import(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(DATA / "torchtune_llama3_1_8B_lora_single_device.yaml")
    rc, out, _ = _run(capsys, "estimate", "--json", "--from-file", path, "--batch", "4", "--seq", "1024")
    assert rc == 0
    doc = json.loads(out)
    assert doc["run"]["batch"] == 4 and doc["run"]["seq"] == 1024 and doc["run"]["method"] == "lora"
    assert "batch = 4 (instead of 2, from the command line)" in doc["imported"]["overrides"]
    rc, out, _ = _run(capsys, "estimate", "--from-file", path, "--batch", "4")
    assert "override: batch = 4 (instead of 2, from the command line)" in out


def test_the_model_from_the_command_line_wins_and_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(
        capsys, "estimate", "Qwen/Qwen3-4B", "--from", "vllm serve Qwen/Qwen3-8B --max-model-len 4096"
    )
    assert rc == 0
    assert "override: model Qwen/Qwen3-4B (instead of Qwen/Qwen3-8B)" in out
    assert "Qwen/Qwen3-4B: inference" in out


def test_fit_from_a_config_without_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(DATA / "deepspeed_llamafactory_ds_z3_offload_config.json")
    rc, _, err = _run(capsys, "fit", "--from-file", path, "--gpu", "24GiB:4")
    assert rc == 2 and "names no model" in err
    rc, out, _ = _run(
        capsys, "fit", "Qwen/Qwen3-8B", "--from-file", path, "--dp", "4", "--gpu", "24GiB:4", "--json"
    )
    assert rc == 0
    doc = json.loads(out)
    assert doc["imported"]["source"] == "DeepSpeed config"
    assert any(v["role"] for v in doc["verdicts"])


def test_the_mode_follows_the_import(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(DATA / "axolotl_llama3_qlora.yml")
    rc, _, err = _run(capsys, "estimate", "--mode", "inference", "--from-file", path)
    assert rc == 2 and "describes a train run" in err


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (
            ["--from", "vllm serve m -tp 2 --max-model-len abc"],
            "gpumem: error: argument 5 '--max-model-len': ",
        ),
        (["--from", "nonsense here"], "gpumem: error: argument 0 'nonsense': not a launch command"),
        (["--from-file", "/no/such/recipe.yaml"], "gpumem: error: /no/such/recipe.yaml: no such file"),
        (["--from", "vllm serve m", "--from-file", "x.yaml"], "gpumem: error: field 'from': give --from or"),
        ([], "gpumem: error: field 'model': name a model"),
    ],
)
def test_bad_input_is_one_line_and_status_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], start: str
) -> None:
    rc, _, err = _run(capsys, "estimate", *argv)
    assert rc == 2
    assert err.startswith(start), err
    assert err.count("\n") == 1


def test_a_bad_config_names_the_key(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "recipe.yaml"
    p.write_text("model:\n  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\n  lora_rank: -3\n")
    rc, _, err = _run(capsys, "estimate", "--from-file", str(p))
    assert rc == 2
    assert f"{p}: key 'model.lora_rank': -3 is out of range" in err


def test_an_ollama_modelfile_is_read_from_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "Modelfile"
    path.write_text("# a comment\nFROM llama3.1:8b\nPARAMETER num_ctx 8192\n")
    rc, out, err = _run(capsys, "estimate", "--from-file", str(path), "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["imported"]["model"] == "meta-llama/Llama-3.1-8B"
    assert doc["run"]["engine"] == "ollama" and doc["run"]["num_ctx"] == 8192


def test_a_fifo_is_refused_in_one_line_without_waiting(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import os

    fifo = tmp_path / "recipe.yaml"
    os.mkfifo(fifo)  # nothing ever writes to it: reading it would block forever
    rc, _, err = _run(capsys, "estimate", "--from-file", str(fifo))
    assert rc == 2 and "FIFO" in err and len(err.strip().splitlines()) == 1
