"""Fuzz: ``gpumem`` itself (``gpumem_gui.cli.main``) with generated command lines.

The flags come from the CLI's own parser (every option of models, gpus, inspect, estimate, fit, sweep,
calibrate, calibrations, diagnose and formats; the Prometheus flags and ``trace`` are left out: they reach a
network or run torch), each with extreme, wrong or random values. The property: exit 0 or 2, never an
exception; on 2, stderr is one line ``gpumem...: error: ...`` that echoes at most ~80 characters of any value;
with ``--json`` and exit 0, stdout is JSON.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from gpumem_gui.cli import build_parser, main
from tests.conftest import reference_dir
from tests.fuzz_strategies import ECHO_TOLERANCE, MAX_ECHO, echoed, fuzz_settings, passing_over_known_bugs
from tests.safetensors_files import LLAMA, write_st
from tests.test_fuzz_weights import BASE_KV, BASE_TENSORS, TINY_CONFIG, write_plan

MIXTRAL = json.loads((reference_dir() / "configs" / "mistralai__Mixtral-8x7B-v0.1.json").read_text())
PARSER = build_parser()
SUBPARSERS: dict[str, argparse.ArgumentParser] = next(
    a.choices for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)
)
COMMANDS = ["models", "gpus", "inspect", "estimate", "fit", "sweep", "diagnose", "formats"]
COMMANDS += ["calibrate", "calibrations"]
NETWORK = ("--prometheus", "--selector", "--host-label", "--stale-after", "--kubernetes", "--python")


def _model_files() -> list[str]:
    """A few model files and folders the CLI reads (in a folder removed at exit): a tiny Llama folder
    (config.json + safetensors), a config whose MoE routes one token to 1 of 1 experts, a 1-layer Mixtral,
    one with 512 layers (a training estimate costs ~1 ms per layer), a tiny GGUF."""
    root = Path(tempfile.mkdtemp(prefix="gpumem-fuzz-cli-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    tiny = root / "tiny-llama"
    tiny.mkdir()
    (tiny / "config.json").write_text(json.dumps(TINY_CONFIG))
    write_st(tiny / "model.safetensors", LLAMA)
    configs = {
        "mixtral-1-expert.json": {**MIXTRAL, "num_local_experts": 1, "num_experts_per_tok": 1},
        "mixtral-1-layer.json": {**MIXTRAL, "num_hidden_layers": 1},
        "llama-512-layers.json": {**TINY_CONFIG, "num_hidden_layers": 512},
    }
    for name, cfg in configs.items():
        (root / name).write_text(json.dumps(cfg))
    gguf_path = root / "tiny.gguf"
    write_plan(gguf_path, {"kv": BASE_KV, "tensors": BASE_TENSORS, "flips": [], "cut": None})
    return [str(tiny), *(str(root / n) for n in configs), str(gguf_path)]


MODELS = [
    "Llama-3.1-8B",
    "meta-llama/Llama-3.2-1B",
    "Qwen3-30B-A3B",
    "google/gemma-3-4b-it",
    "deepseek-ai/DeepSeek-V2-Lite",
    "openai-community/gpt2",
    "tiiuae/falcon-7b",
    "nope",
    "org/not-cached",  # a Hub id: offline in the tests (HF_HUB_OFFLINE=1), one line at once
    "",
    "x" * 5000,
    "/dev/null",
    "/",
    *_model_files(),
]
NUMBERS = [
    "0", "1", "-1", "2", "7", "4096", "4097", "65536", "16000000", "16777217", "2147483648", "1e308", "inf",
    "-inf", "nan", "-0", "0.5", "1e-320", "99999999999999999999999", "9" * 5000, "0x10", " 3", "",
]  # fmt: skip
GPUS = [
    "RTX-4090", "RTX-4090:4097", "RTX-4090:0", "RTX-4090:-1", "H100-SXM-80GB:8", "A100-80GB:2", "24GiB",
    "80GB:4", "0GiB", "-5GiB", "1e30GB", "nan GiB", "RTX-4090:" + "9" * 5000, "x" * 5000, "", ":", "H100",
]  # fmt: skip
# what diagnose --observed reads: the published reports, files that are no report, no file at all (not "-":
# the fuzzer has no standard input to give)
OBSERVED = [
    *sorted(str(p) for p in (Path(__file__).parent / "reference" / "observed").glob("*.txt")),
    str(Path(__file__)), "/dev/null", "/", "nope", "x" * 5000, "",
]  # fmt: skip
FAKE_GPUS = ["rtx4090_browser", "8xh100_busy", "a100_mig", "gpu_lost", "no_driver", "nope", "x" * 300, "/"]
TEXTS = st.text(max_size=10) | st.sampled_from(
    ["x" * 300, "x" * 300 + "!", "q_proj," + "y" * 5000 + "-", "auto", "none", "all-linear", "q_proj,v_proj"]
)


def _options(command: str) -> list[argparse.Action]:
    return [
        a
        for a in SUBPARSERS[command]._actions
        if a.option_strings and a.dest != "help" and not a.option_strings[0].startswith(NETWORK)
    ]


@st.composite
def _value(draw: st.DrawFn, action: argparse.Action) -> str:
    if action.choices and draw(st.integers(0, 3)):
        return str(draw(st.sampled_from(list(action.choices))))
    field = getattr(action.type, "field", None)
    if field is not None and field.values and draw(st.booleans()):
        return str(draw(st.sampled_from(list(field.values))))
    if action.dest == "gpu":
        return draw(st.sampled_from(GPUS))
    if action.dest == "fake_gpus":
        return draw(st.sampled_from(FAKE_GPUS))
    if action.dest == "observed":
        return draw(st.sampled_from(OBSERVED))
    if action.dest == "steps":  # not 100,000 itself: that sweep is the 18-minute reproducer
        return draw(st.sampled_from(["-1", "0", "1", "2", "16", "100001", "10" * 20, "x"]))
    return draw(st.sampled_from(NUMBERS) | st.integers(-3, 70000).map(str) | TEXTS)


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(COMMANDS))
    argv = [command]
    if command in ("inspect", "estimate", "fit", "sweep"):
        argv.append(draw(st.sampled_from(MODELS) | st.text(max_size=12)))
    if command == "diagnose":
        if draw(st.booleans()):
            argv.append(draw(st.sampled_from(MODELS)))
        if draw(st.integers(0, 4)):
            argv += ["--observed", draw(st.sampled_from(OBSERVED))]
    if command == "calibrate" and draw(st.integers(0, 4)):
        argv += [
            "--observed",
            draw(st.sampled_from(OBSERVED)),
            "--name",
            draw(st.sampled_from(["a", "b"]) | TEXTS),
        ]
    if command == "sweep" and draw(st.integers(0, 4)):
        argv += ["--over", draw(st.sampled_from(["seq", "batch"])), "--from", "1", "--to", "4096"]
    options = _options(command)
    for action in draw(st.lists(st.sampled_from(options), max_size=6)) if options else []:
        flag = draw(st.sampled_from(action.option_strings))
        if action.nargs == 0:  # store_true, --x / --no-x
            argv.append(flag)
        else:
            argv += [flag, draw(_value(action))]
    return argv


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def check_cli(argv: list[str]) -> tuple[int, str, str]:
    rc, out, err = run_cli(argv)
    assert rc in (0, 2), f"exit {rc}: {err[-500:]}"
    if rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1, f"{len(lines)} lines on stderr: {err[:600]!r}"
        assert lines[0].startswith("gpumem") and ": error: " in lines[0], lines[0][:300]
        part = echoed(lines[0], [a for a in argv if len(a) > MAX_ECHO])
        assert part is None, f"the error echoes over {ECHO_TOLERANCE} characters of a value: {lines[0][:300]}"
    elif "--json" in argv and "--csv" not in argv:
        json.loads(out)
    return rc, out, err


REPRODUCERS: list[list[str]] = [
    ["estimate", "Llama-3.1-8B", "--gpu", "RTX-4090:4097"],
    ["fit", "Llama-3.1-8B", "--new-tokens", "16000000", "--gpu", "RTX-4090"],
    ["fit", "Llama-3.1-8B", "--margin-mib", "-1000000", "--gpu", "RTX-4090"],
    ["fit", "Llama-3.1-8B", "--margin-mib", "9" * 5000, "--gpu", "RTX-4090"],
    ["estimate", "x" * 100_000],
    ["gpus", "--fake-gpus", "x" * 5000],
    ["sweep", "Llama-3.1-8B", "--over", "seq", "--from", "1", "--to", "10", "--steps", "10" * 20],
    ["estimate", "Llama-3.1-8B", "--batch", "9" * 5000],
    ["estimate"],
    ["estimate", "Llama-3.1-8B", "--mode", "train", "--method", "lora", "--lora-targets", "x" * 5000 + "!"],
    ["diagnose", "Llama-3.1-8B", "--observed", OBSERVED[0], "--gpu-index", "9" * 5000, "--batch", "0"],
    ["diagnose", "--observed", "x" * 5000],  # found: an OSError (name too long) from Path.is_dir
]


@fuzz_settings(100)
@given(argv=command_lines())
@example(argv=REPRODUCERS[0])
@example(argv=REPRODUCERS[1])
@example(argv=REPRODUCERS[2])
@example(argv=REPRODUCERS[3])
@example(argv=REPRODUCERS[4])
@example(argv=REPRODUCERS[5])
@example(argv=REPRODUCERS[6])
@example(argv=REPRODUCERS[7])
@example(argv=REPRODUCERS[8])
@example(argv=REPRODUCERS[9])
@example(argv=REPRODUCERS[10])
@example(argv=REPRODUCERS[11])
def test_cli_exits_0_or_2_with_one_line(argv: list[str]) -> None:
    with passing_over_known_bugs():
        check_cli(argv)


def _catalog_ids() -> list[Any]:
    rc, out, _ = run_cli(["models", "--json"])
    return [m["id"] for m in json.loads(out)] if rc == 0 else []


@fuzz_settings(20)
@given(model=st.sampled_from(_catalog_ids()), gpu=st.sampled_from(["RTX-4090", "H100-SXM-80GB:8", "24GiB"]))
def test_every_catalog_model_fits_or_not_as_json(model: str, gpu: str) -> None:
    rc, out, _ = check_cli(["fit", model, "--gpu", gpu, "--json"])
    assert rc == 0 and isinstance(json.loads(out)["fits"], bool)
