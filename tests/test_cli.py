"""The `gpumem` CLI: inspect equals the ground truth; JSON keys are stable; bad input is one line, exit 2."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpumem_gui.cli import main
from tests.conftest import reference_dir

REF = reference_dir()
GT = json.loads((REF / "groundtruth.json").read_text())
NAMES = sorted(n for n, st in GT["static"].items() if "total_params" in st)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("name", NAMES)
def test_inspect_json_equals_ground_truth(capsys: pytest.CaptureFixture[str], name: str) -> None:
    rc, out, _ = run(capsys, "inspect", str(REF / "configs" / f"{name}.json"), "--json")
    assert rc == 0
    doc = json.loads(out)
    st = GT["static"][name]
    assert doc["schema"] == "gpumem.inspect/1"
    assert doc["params"]["total"] == st["total_params"]
    assert doc["params"]["embedding"] == st["input_embedding_params"]
    assert doc["params"]["lm_head"] == st["lm_head_params"]
    assert doc["params"]["routed_experts"] == st["routed_expert_params"]
    if "active_params_per_token" in st:
        assert doc["params"]["active_per_token"] == st["active_params_per_token"]
    assert doc["kv_cache_bytes_per_token"] == st["kv_cache_bytes_per_token_bf16"]
    assert sum(doc["kv_cache_bytes_per_token_per_layer"]) == st["kv_cache_bytes_per_token_bf16"]
    assert len(doc["kv_cache_bytes_per_token_per_layer"]) == st["num_layers"]


def test_inspect_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    _rc, out, _ = run(capsys, "inspect", str(REF / "configs" / "google__gemma-3-4b-it.json"), "--json")
    doc = json.loads(out)
    for key in ("total", "embedding", "lm_head", "routed_experts", "active_per_token", "vision"):
        assert key in doc["params"]
    for key in ("weights_bytes_by_dtype", "kv_cache_bytes_per_token", "kv_cache_bytes_per_token_per_layer"):
        assert key in doc
    assert doc["params"]["vision"] > 0


def test_inspect_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inspect", str(REF / "configs" / "mistralai__Mixtral-8x7B-v0.1.json"))
    assert rc == 0
    assert "46,702,792,704" in out
    assert "active per token" in out
    assert "KV cache" in out


def test_models_and_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "models", "--json")
    assert rc == 0 and len(json.loads(out)) >= 40
    rc, out, _ = run(capsys, "models", "--search", "qwen3")
    assert rc == 0 and "Qwen3" in out
    rc, out, _ = run(capsys, "gpus", "--catalog", "--json")
    assert rc == 0 and len(json.loads(out)) >= 25
    rc, out, _ = run(capsys, "gpus", "--catalog")
    assert rc == 0 and "GiB" in out and "GB" in out


def test_catalog_id_inspect(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inspect", "meta-llama/Llama-3.1-8B", "--json")
    assert rc == 0
    assert json.loads(out)["params"]["total"] == 8030261248


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{broken", "malformed JSON"),
        ('{"model_type": "llama"}', "required field is missing"),
        ('{"model_type": "llama", "hidden_size": -1}', "hidden_size"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, words: str
) -> None:
    p = tmp_path / "config.json"
    p.write_text(content)
    rc, _out, err = run(capsys, "inspect", str(p))
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("gpumem: error: ")
    assert words in err and str(p) in err


def test_unknown_model_and_empty_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = run(capsys, "inspect", "definitely not a model")
    assert rc == 2 and "not a file" in err
    rc, _, err = run(capsys, "inspect", str(tmp_path))
    assert rc == 2 and "nothing usable" in err


def test_no_traceback_from_the_real_entry_point(tmp_path: Path) -> None:
    p = tmp_path / "model.safetensors"
    p.write_bytes(b"\x01")
    r = subprocess.run(
        [sys.executable, "-m", "gpumem_gui", "inspect", str(p)], capture_output=True, text=True
    )
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and r.stderr.startswith("gpumem: error: ")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("gpumem ")


def test_gpus_local_without_driver_exits_0_with_reason(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "gpus", "--fake-gpus", "no_driver", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["devices"] == [] and doc["unavailable_reason"]


def test_gpus_fake_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "gpus", "--fake-gpus", "a100_mig")
    assert rc == 0 and "MIG" in out
    rc, _, err = run(capsys, "gpus", "--fake-gpus", "/no/such/file.json")
    assert rc == 2 and err.startswith("gpumem: error: ")


def test_estimate_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "estimate", "Llama-3.2-1B", "--seq", "1024", "--new-tokens", "16", "--json")
    assert rc == 0
    doc = json.loads(out)
    for key in (
        "peak_bytes",
        "total_bytes",
        "peak_phase",
        "components",
        "phases",
        "per_gpu",
        "params",
        "kv_cache_bytes",
        "explain",
    ):
        assert key in doc, key
    assert set(doc["phases"]) == {"load", "prefill", "decode"}
    assert doc["phases"]["prefill"]["peak_bytes"] > 0 and doc["phases"]["prefill"]["components"]
    assert sum(c["bytes"] for c in doc["components"]) == doc["total_bytes"]
    assert all(doc["explain"][c["key"]]["formula"] for c in doc["components"])


def test_estimate_matches_a_reference_point(capsys: pytest.CaptureFixture[str]) -> None:
    p = next(p for p in GT["grid"] if p["mode"] == "infer_prefill" and p["attn_implementation"] == "sdpa")
    cfg = str(REF / "configs" / f"{p['model']}.json")
    _rc, out, _ = run(
        capsys,
        "estimate",
        cfg,
        "--batch",
        str(p["batch"]),
        "--seq",
        str(p["seq"]),
        "--logits",
        "all",
        "--json",
    )
    doc = json.loads(out)
    assert abs(doc["peak_bytes"] - p["peak_bytes"]) / p["peak_bytes"] < 0.03
    assert doc["kv_cache_bytes"] == p["kv_cache_bytes"]


def test_fit_and_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "fit", "Llama-3.1-8B", "--seq", "32768", "--batch", "4", "--gpu", "RTX-4090")
    assert rc == 0 and "misses by" in out and "to make it fit" in out
    rc, out, _ = run(capsys, "fit", "Llama-3.1-8B", "--gpu", "H100-SXM-80GB:2", "--tp", "2", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["fits"] and len(doc["verdicts"]) == 2
    rc, out, _ = run(
        capsys,
        "sweep",
        "Llama-3.2-1B",
        "--over",
        "seq",
        "--from",
        "512",
        "--to",
        "8192",
        "--steps",
        "5",
        "--gpu",
        "T4",
        "--json",
    )
    pts = json.loads(out)["points"]
    assert rc == 0 and [p["seq"] for p in pts] == [512, 2432, 4352, 6272, 8192]
    assert all(a["total_bytes"] <= b["total_bytes"] for a, b in itertools.pairwise(pts))
    rc, out, _ = run(capsys, "sweep", "Llama-3.2-1B", "--over", "batch", "--from", "1", "--to", "4", "--csv")
    assert rc == 0 and out.splitlines()[0].startswith("batch,")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["estimate", "Llama-3.2-1B", "--batch", "0"], "batch"),
        (["estimate", "Llama-3.2-1B", "--tp", "3"], "tp"),
        (["estimate", "Llama-3.2-1B", "--weights", "q4km"], "weights"),
        (["estimate", "Llama-3.2-1B", "--engine", "vllm", "--kv-dtype", "q4_0"], "kv_dtype"),
        (["fit", "Llama-3.2-1B"], "gpu"),
        (["fit", "Llama-3.2-1B", "--gpu", "H100:zero"], "gpu"),
        (["estimate", "Llama-3.2-1B", "--mode", "train", "--zero", "5"], "zero"),
    ],
)
def test_estimate_bad_input(capsys: pytest.CaptureFixture[str], argv: list[str], words: str) -> None:
    rc, _, err = run(capsys, *argv)
    assert rc == 2 and words in err and err.count("\n") == 1


def test_estimate_uses_file_bytes_when_files_are_given(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import shutil
    import struct

    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(REF / "configs" / "meta-llama__Llama-3.2-1B.json", folder / "config.json")
    header = {
        "model.embed_tokens.weight": {
            "dtype": "BF16",
            "shape": [128256, 2048],
            "data_offsets": [0, 525336576],
        }
    }
    raw = json.dumps(header).encode()
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + 525336576)
    rc, out, _ = run(capsys, "estimate", str(folder), "--seq", "128", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["run"]["weights"] == "file"
    weights = next(c for c in doc["components"] if c["key"] == "weights")
    assert weights["bytes"] >= 525336576
    assert weights["bytes"] < 1_000_000_000  # the file holds only the embedding, not the whole model


def test_fit_of_an_engine_that_does_not_start_says_why_not_a_negative_miss(capsys) -> None:
    """vLLM at gpu_memory_utilization 0.5 of 16 GiB: its 8 GiB budget is below the weights, so it does not
    start although the budget itself is free; the verdict says so instead of 'misses by -7.00 GiB'."""
    rc = main(
        [
            "fit",
            "meta-llama/Llama-3.1-8B",
            "--engine",
            "vllm",
            "--gpu-memory-utilization",
            "0.5",
            "--gpu",
            "16GiB",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "KV pool is too small" in out and "misses by -" not in out


def test_estimate_on_a_target_too_small_for_the_plan_is_one_line_and_no_estimate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--gpu naming fewer GPUs than tp x pp: the one-line error alone (it came after the whole estimate)."""
    for extra in ((), ("--json",)):
        code, out, err = run(
            capsys, "estimate", "meta-llama/Llama-3.1-8B", "--pp", "2", "--gpu", "H100-SXM-80GB", *extra
        )
        assert code == 2 and out == "" and err.count("\n") == 1 and "NAME:COUNT" in err
