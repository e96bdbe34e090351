"""Issue 18's rough edges of the CLI, each reproducer a test: one line ``gpumem: error: ...`` and exit 2 for
bad input (never a traceback, never a long echo), solvers that answer instead of raising, sweeps capped per
mode with a progress bar, --fake-gpus implying --local, custom GPU capacities, and no no-op suggestions (the
solvers, the GPU-target parser and the catalog alone: tests/test_rough_fit.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpumem_gui.cli import main
from gpumem_gui.core import (
    MAX_SWEEP_POINTS,
    POINT_COST_S,
    SWEEP_BUDGET_S,
    GpumemInputError,
    load_model,
    make_run,
    make_training_run,
    sweep,
)

GEMMA = "google/gemma-3-1b-it"  # small KV cache: 16M generated tokens fit a B200 with an int4 cache


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc: int, err: str) -> str:
    """The error line of a bad input: exit 2, exactly one line on stderr, starting ``gpumem: error:``."""
    assert rc == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpumem: error: "), err
    return lines[0]


def fake_gpus(path: Path, n: int) -> Path:
    """A fake-GPU scenario (gpumem_gui/hardware/fake_scenario.py) with ``n`` RTX 4090s."""
    gpu = {"name": "NVIDIA GeForce RTX 4090", "total_mib": 24564, "used_mib": 512}
    path.write_text(json.dumps({"version": 1, "description": f"{n} GPUs", "gpus": [gpu] * n}))
    return path


# ---- 1. more than 4,096 GPUs -------------------------------------------------------------------------------


def test_gpu_count_over_4096_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line_error(*cli(capsys, "fit", "Llama-3.1-8B", "--gpu", "RTX-4090:4097")[::2])
    assert "GPU count must be 1 to 4,096" in line and "'4097'" in line


@pytest.mark.parametrize("count", ["0", "-1", "x", "4.5", "9" * 400])
def test_bad_gpu_counts(capsys: pytest.CaptureFixture[str], count: str) -> None:
    line = one_line_error(*cli(capsys, "fit", "Llama-3.1-8B", "--gpu", f"H100:{count}")[::2])
    assert "'gpu'" in line and len(line) < 200


def test_local_with_4097_gpus_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    scenario = fake_gpus(tmp_path / "many.json", 4097)
    line = one_line_error(*cli(capsys, "fit", "Llama-3.1-8B", "--local", "--fake-gpus", str(scenario))[::2])
    assert "4,097 local GPUs" in line and "at most 4,096" in line and "CUDA_VISIBLE_DEVICES" in line


# ---- 5. --fake-gpus implies --local ------------------------------------------------------------------------


def test_fake_gpus_implies_local(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(capsys, "fit", "Llama-3.1-8B", "--fake-gpus", "rtx4090_browser", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["gpu"] == "NVIDIA GeForce RTX 4090" and doc["local_gpus"] is not None
    # the same as asking for --local explicitly
    rc, out2, _ = cli(capsys, "fit", "Llama-3.1-8B", "--local", "--fake-gpus", "rtx4090_browser", "--json")
    assert rc == 0 and json.loads(out2) == doc


@pytest.mark.parametrize("extra", [["--gpu", "H100"], ["--gpu", "H100", "--local"]])
def test_fake_gpus_or_local_with_gpu_is_an_error(
    capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    argv = ["estimate", "Llama-3.1-8B", "--fake-gpus", "a100_mig", *extra]
    line = one_line_error(*cli(capsys, *argv)[::2])
    assert "--gpu names the GPUs to check against" in line


# ---- 2. solvers stay inside the fields' ranges -------------------------------------------------------------


def test_max_context_with_16m_new_tokens_does_not_raise(capsys: pytest.CaptureFixture[str]) -> None:
    # before: pydantic's ValidationError (seq 48,000,004 > 16,777,216) escaped the max-context solver
    argv = ["fit", GEMMA, "--gpu", "B200", "--seq", "1", "--new-tokens", "16000000", "--kv-dtype", "int4"]
    rc, out, err = cli(capsys, *argv, "--json")
    assert rc == 0 and err == ""
    doc = json.loads(out)
    # 16M new tokens alone are past the model's 32,768-token window: no prompt fits, and the window says why
    assert doc["max_context"] is None and doc["context_window"] == 32_768
    rc, out, _ = cli(capsys, *argv)
    assert rc == 0 and "no context length fits (the model's context window is 32,768 tokens)" in out


# ---- 3. sweep caps per mode, progress ----------------------------------------------------------------------


def test_sweep_caps_follow_the_measured_cost() -> None:
    assert {m: int(SWEEP_BUDGET_S / c) for m, c in POINT_COST_S.items()} == MAX_SWEEP_POINTS
    assert MAX_SWEEP_POINTS["train"] == 600 and MAX_SWEEP_POINTS["inference"] == 24_000
    spec = load_model("Llama-3.2-1B").spec
    with pytest.raises(GpumemInputError, match="at most 600") as e:
        sweep(spec, make_training_run(), "seq", range(1, 602))
    assert e.value.field == "steps"


def test_train_sweep_with_100000_steps_is_refused_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    # before: ~18 minutes of estimates (the 100,000 cap was the inference one)
    argv = ["sweep", "Llama-3.1-8B", "--mode", "train", "--over", "seq", "--from", "1", "--to", "100000"]
    line = one_line_error(*cli(capsys, *argv, "--steps", "100000")[::2])
    assert "--steps" in line and "24,000" in line
    line = one_line_error(*cli(capsys, *argv, "--steps", "601")[::2])
    assert "'steps'" in line and "a train sweep of this model takes at most 600" in line


@pytest.mark.parametrize(
    ("over", "lo", "hi", "problem"),
    [("seq", "0", "10", "must be an integer from 1"), ("batch", "1", "16777216", "takes 1 to 1,048,576")],
)
def test_sweep_range_is_the_fields_range(
    capsys: pytest.CaptureFixture[str], over: str, lo: str, hi: str, problem: str
) -> None:
    argv = ["sweep", "Llama-3.2-1B", "--over", over, "--from", lo, "--to", hi]
    assert problem in one_line_error(*cli(capsys, *argv)[::2])


def test_sweep_progress_callback_and_stop() -> None:
    spec = load_model("Llama-3.2-1B").spec
    calls: list[tuple[int, int]] = []
    points = sweep(spec, make_run(), "seq", [64, 128, 256, 512], progress=lambda d, t: calls.append((d, t)))
    assert calls == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)] and len(points) == 4
    stopped = sweep(spec, make_run(), "seq", [64, 128, 256, 512], progress=lambda d, t: d < 2)
    assert [p.x for p in stopped] == [64, 128]


def _sweep_on_a_terminal(*flags: str) -> tuple[int, str, str]:
    """Run ``gpumem sweep`` with stderr on a pseudo-terminal (stdout a pipe); (rc, stdout, terminal text)."""
    master, slave = os.openpty()
    argv = ["sweep", "Llama-3.2-1B", "--mode", "train", "--over", "seq", "--from", "64", "--to", "512"]
    try:
        p = subprocess.run(
            [sys.executable, "-m", "gpumem_gui", *argv, "--steps", "21", *flags],
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
            timeout=300,
        )
    finally:
        os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return p.returncode, p.stdout, b"".join(chunks).decode()


def test_progress_bar_on_a_terminal_only_for_tables() -> None:
    rc, out, term = _sweep_on_a_terminal()
    assert rc == 0 and "peak GiB" in out
    assert "sweep [" in term and "100% 21/21" in term and term.endswith("\r\x1b[K")
    rc, out, term = _sweep_on_a_terminal("--csv")
    assert rc == 0 and out.startswith("seq,") and term == ""


def test_no_progress_bar_when_stderr_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sweep", "Llama-3.2-1B", "--mode", "train", "--over", "seq", "--from", "64", "--to", "512"]
    rc, _, err = cli(capsys, *argv, "--steps", "21")
    assert rc == 0 and err == ""


# ---- 4. numeric flags, argparse errors ---------------------------------------------------------------------


@pytest.mark.parametrize("margin", ["-1000000", "-1", "1048577", "1e3", "99999999999999999999999"])
def test_margin_range(capsys: pytest.CaptureFixture[str], margin: str) -> None:
    # before: --margin-mib -1000000 gave "fits with 867.48 GiB headroom"
    line = one_line_error(*cli(capsys, "fit", "Llama-3.1-8B", "--gpu", "H100", "--margin-mib", margin)[::2])
    assert line.startswith("gpumem: error: fit: --margin-mib: must be an integer from 0 to 1,048,576 MiB")


def test_margin_bounds_are_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(capsys, "fit", "Llama-3.1-8B", "--gpu", "H100", "--margin-mib", "0", "--json")
    assert rc == 0 and json.loads(out)["margin_bytes"] == 0
    rc, out, _ = cli(capsys, "fit", "Llama-3.1-8B", "--gpu", "H100", "--margin-mib", "1048576", "--json")
    assert rc == 0 and json.loads(out)["margin_bytes"] == 1 << 40 and json.loads(out)["fits"] is False


@pytest.mark.parametrize(
    ("argv", "where"),
    [
        # the model is optional on the command line since --from / --from-file can name it
        (["estimate"], "gpumem: error: field 'model': name a model (or give --from / --from-file)"),
        (["bogus"], "gpumem: error: command line: COMMAND: invalid choice"),
        (["fit", "Llama-3.1-8B", "--batch", "x"], "gpumem: error: fit: --batch: invalid int value"),
        (["fit", "Llama-3.1-8B", "--attn", "nope"], "gpumem: error: fit: --attn: invalid choice"),
        (
            ["fit", "Llama-3.1-8B", "--no-such-flag"],
            "gpumem: error: command line: unrecognized arguments: --no-such-flag",
        ),
        (["sweep", "Llama-3.1-8B", "--over", "seq"], "gpumem: error: sweep: the following arguments"),
        (["trace"], "gpumem: error: trace: the following arguments are required"),
    ],
)
def test_argparse_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], where: str
) -> None:
    assert one_line_error(*cli(capsys, *argv)[::2]).startswith(where)


def test_long_values_are_not_echoed(capsys: pytest.CaptureFixture[str]) -> None:
    huge = "9" * 100_000
    for argv in (["fit", "Llama-3.1-8B", "--batch", huge], ["fit", "Llama-3.1-8B", "--gpu", "x" * 5000]):
        line = one_line_error(*cli(capsys, *argv)[::2])
        assert len(line) < 300 and "characters" in line


def test_real_cli_one_line_exit_2() -> None:
    """The installed entry point (python -m gpumem_gui) on the issue's reproducers."""
    for argv in (
        ["fit", "Llama-3.1-8B", "--gpu", "RTX-4090:4097"],
        ["fit", "Llama-3.1-8B", "--gpu", "H100", "--margin-mib", "-1000000"],
        ["fit", "Llama-3.1-8B", "--gpu", "H100", "--fake-gpus", "a100_mig"],
    ):
        p = subprocess.run([sys.executable, "-m", "gpumem_gui", *argv], capture_output=True, text=True)
        assert p.returncode == 2 and p.stdout == "" and len(p.stderr.splitlines()) == 1, p.stderr
        assert p.stderr.startswith("gpumem: error: ") and "Traceback" not in p.stderr


def test_cli_custom_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(capsys, "fit", "Llama-3.1-8B", "--gpu", "23.5GiB:2", "--json")
    doc = json.loads(out)
    assert rc == 0 and (doc["gpu"], doc["gpu_count"], doc["capacity_bytes"]) == (
        "custom 23.5 GiB",
        2,
        25232932864,
    )
    rc, out, _ = cli(capsys, "fit", "Llama-3.1-8B", "--gpu", "24GiB")
    assert rc == 0 and "fit on 1 x custom 24 GiB (24.00 GiB each" in out


# ---- 8. no no-op suggestions, "no batch size fits" ---------------------------------------------------------


def test_no_same_size_format_suggested_when_it_fits(capsys: pytest.CaptureFixture[str]) -> None:
    # before: "best weights fp16, best KV dtype fp16" for a bf16 run that fits
    rc, out, _ = cli(capsys, "fit", "Llama-3.1-8B", "--gpu", "H100")
    assert rc == 0 and "best weights" not in out and "best KV dtype" not in out
    rc, out, _ = cli(capsys, "fit", "Llama-3.1-8B", "--gpu", "H100", "--json")
    doc = json.loads(out)
    assert doc["fits"] and doc["smallest_weights"] is None and doc["smallest_kv_dtype"] is None
    assert not any(c["kind"] in ("weights", "kv_dtype") for c in doc["changes"])


def test_nothing_fits_reads_as_a_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(capsys, "fit", "Llama-3.1-70B-Instruct", "--gpu", "RTX-4090")
    assert rc == 0 and "no batch size fits, no context length fits" in out and "None" not in out
    rc, out, _ = cli(capsys, "fit", "Llama-3.1-70B-Instruct", "--gpu", "RTX-4090", "--json")
    doc = json.loads(out)
    assert doc["max_batch"] is None and doc["max_context"] is None and "smallest_weights" in doc
    rc, out, _ = cli(capsys, "fit", "Llama-3.1-70B-Instruct", "--gpu", "RTX-4090", "--mode", "train")
    assert "no micro-batch size fits, no sequence length fits, no GPU count tried fits" in out


def test_the_sweep_cap_shrinks_for_a_model_deeper_than_the_one_it_was_measured_on() -> None:
    """Found by the fuzz suite: a 4,096-layer config costs ~3.9 s per training point, so the 600-point cap
    would allow ~39 minutes; the cap shrinks with the layer count."""
    from gpumem_gui.core import GpumemInputError, check_sweep_size, make_run, make_training_run
    from gpumem_gui.core.fit.sweep import REFERENCE_LAYERS, sweep_cap

    train, infer = make_training_run(), make_run()
    assert sweep_cap(train, REFERENCE_LAYERS["train"]) == MAX_SWEEP_POINTS["train"]
    assert sweep_cap(train, 4096) == int(MAX_SWEEP_POINTS["train"] * REFERENCE_LAYERS["train"] / 4096) == 18
    assert sweep_cap(infer, 12) == MAX_SWEEP_POINTS["inference"]
    check_sweep_size(train, 18, 4096)
    with pytest.raises(GpumemInputError, match="4,096 layers"):
        check_sweep_size(train, 19, 4096)
