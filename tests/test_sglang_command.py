"""SGLang's launch command (gpumem_gui/core/imports/sglang.py, runtimes/sglang_command.py): published commands
read as their runs, options gpumem does not model named, bad commands one error naming the position, the
command round trip to the same estimate, and the parser fuzzed."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.imports import import_command
from gpumem_gui.core.readers.catalog import load_gpu_catalog
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run, runtime
from tests.conftest import REPO
from tests.fuzz_strategies import fuzz_settings
from validation.validate_report.common import spec_for

GPUS = {g.id: g.memory_bytes for g in load_gpu_catalog()}
H100, H200 = GPUS["H100-SXM-80GB"], GPUS["H200-SXM-141GB"]
LLAMA8 = spec_for("meta-llama/Llama-3.1-8B")
LLAMA70 = spec_for("meta-llama/Llama-3.3-70B-Instruct")


# ------------------------------------------------------------------------------------------------ commands

# published launch commands (validation/data/engine_logs/sglang.json) and what they read as
PUBLISHED = [
    (
        "python3.12 -m sglang.launch_server   --model Qwen/QwQ-32B --model-path /home/model/Qwen/QwQ-32B   "
        "--host 0.0.0.0 --port 30000 --tensor-parallel-size 4   --log-level info   --enable-metrics "
        "--trust-remote-code --enable-p2p-check",
        {"tp": 4},
        "/home/model/Qwen/QwQ-32B",
    ),
    (
        "python3 -m sglang.launch_server --model /path/to/Qwen3-235B-A22B-FP8 --tp 4 --trust-remote-code "
        "--host 0.0.0.0 --port 8000 --mem-fraction-static 0.93",
        {"tp": 4, "mem_fraction_static": 0.93},
        "/path/to/Qwen3-235B-A22B-FP8",
    ),
    (
        "python3 -m sglang.launch_server --model meta-llama/Llama-3.3-70B-Instruct --tp 8 --port 30000 "
        "--enable-piecewise-cuda-graph --piecewise-cuda-graph-max-tokens 8192",
        {"tp": 8},
        "meta-llama/Llama-3.3-70B-Instruct",
    ),
]


@pytest.mark.parametrize(("command", "fields", "model"), PUBLISHED)
def test_published_commands_read_as_their_runs(command, fields, model) -> None:
    imported = import_command(command)
    assert imported.model == model and imported.run.engine == "sglang"
    for name, value in fields.items():
        assert getattr(imported.run, name) == value


def test_published_commands_are_in_the_logs_data() -> None:
    quotes = " ".join(
        p["quote"]
        for p in json.loads((REPO / "validation/data/engine_logs/sglang.json").read_text())["points"]
    )
    for command, _, _ in PUBLISHED:
        assert " ".join(command.split()[2:6]) in " ".join(quotes.split())


def test_options_gpumem_does_not_model_are_named() -> None:
    imported = import_command(
        "python -m sglang.launch_server --model-path m --disable-hybrid-swa-memory --speculative-algorithm "
        "EAGLE --enable-piecewise-cuda-graph --frobnicate 3"
    )
    joined = " | ".join(imported.warnings)
    for option in (
        "--disable-hybrid-swa-memory",
        "--speculative-algorithm",
        "--enable-piecewise-cuda-graph",
        "--frobnicate",
    ):
        assert option in joined


@pytest.mark.parametrize(
    ("command", "where"),
    [
        ("python -m sglang.launch_server --model-path m --tp 0", "argument 5 '--tp'"),
        ("python -m sglang.launch_server --model-path m --mem-fraction-static 1.5", "argument 5"),
        ("python -m sglang.launch_server --model-path m --chunked-prefill-size 0", "argument 5"),
        ("python -m sglang.launch_server --model-path m --kv-cache-dtype q4_0", "argument 5"),
        ("python -m sglang.launch_server --model-path m --dtype int3", "argument 5"),
        ("python -m sglang.launch_server --model-path", "argument 3 '--model-path'"),
        ("python -m sglang.launch_server --model-path m --dp 3 --tp 8 --enable-dp-attention", "dp_size"),
        ("python -m sglang.launch_server --model-path m --page-size 0", "argument 5 '--page-size'"),
        ("python -m sglang.launch_server --model-path m --swa-full-tokens-ratio 0", "argument 5"),
        ("python -m sglang.launch_server --model-path m --swa-full-tokens-ratio 1.5", "argument 5"),
        ("python -m sglang.launch_server --model-path m --max-total-tokens -4", "argument 5"),
    ],
)
def test_bad_commands_are_one_error_naming_the_position(command, where) -> None:
    with pytest.raises(GpumemInputError) as e:
        run = import_command(command).run
        estimate_inference(LLAMA70, run, capacity=H200)
    assert where in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {
            "tp": 2,
            "mem_fraction_static": 0.8,
            "max_model_len": 32768,
            "kv_dtype": "fp8_e4m3",
            "weights": "fp8",
        },
        {
            "tp": 8,
            "dp_size": 4,
            "enable_dp_attention": True,
            "chunked_prefill_size": 4096,
            "max_running_requests": 128,
        },
        {"tp": 2, "pp": 2, "cuda_graph_max_bs": 64, "disable_radix_cache": True, "compute_dtype": "fp16"},
        {"disable_cuda_graph": True, "weights": "nf4", "max_model_len": 4096},
        {"page_size": 32, "max_total_tokens": 100_000, "swa_full_tokens_ratio": 0.5},
    ],
)
def test_command_round_trip_gives_the_same_estimate(fields) -> None:
    spec = LLAMA70
    run = make_run(engine="sglang", **fields)
    est = estimate_inference(spec, run, capacity=H200)
    command = runtime("sglang").command("meta-llama/Llama-3.3-70B-Instruct", run, est)
    back = import_command(command)
    again = estimate_inference(spec, back.run, capacity=H200)
    assert back.model == "meta-llama/Llama-3.3-70B-Instruct" and not back.warnings
    assert again.facts["max_total_num_tokens"] == est.facts["max_total_num_tokens"]
    assert again.total_bytes == est.total_bytes


def test_no_chunking_reads_as_max_prefill_tokens() -> None:
    run = import_command("python -m sglang.launch_server --model-path m --chunked-prefill-size -1").run
    assert run.chunked_prefill_size == 16384
    run = import_command(
        "python -m sglang.launch_server --model-path m --max-prefill-tokens 32768 --chunked-prefill-size -1"
    ).run
    assert run.chunked_prefill_size == 32768


def test_docker_and_sglang_serve_forms() -> None:
    docker = import_command(
        "docker run --gpus all --shm-size 32g -p 30000:30000 lmsysorg/sglang:latest "
        "python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B --tp 2"
    )
    serve = import_command("CUDA_VISIBLE_DEVICES=0,1 sglang serve --model-path Qwen/Qwen3-8B --tp-size 2")
    assert docker.run.tp == serve.run.tp == 2 and docker.model == serve.model == "Qwen/Qwen3-8B"


# ------------------------------------------------------------------------------------------------ fuzz

_OPTIONS = [
    "--tp", "--tp-size", "--dp", "--pp-size", "--ep-size", "--mem-fraction-static", "--context-length",
    "--chunked-prefill-size", "--max-running-requests", "--cuda-graph-max-bs", "--cuda-graph-bs",
    "--kv-cache-dtype", "--quantization", "--dtype", "--max-prefill-tokens", "--disable-cuda-graph",
    "--disable-radix-cache", "--enable-dp-attention", "--host", "--page-size", "--speculative-algorithm",
    "--unknown-option", "--max-total-tokens", "--swa-full-tokens-ratio", "--disable-hybrid-swa-memory",
]  # fmt: skip
_VALUES = st.one_of(
    st.integers(min_value=-(1 << 40), max_value=1 << 40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(
        ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "fp4_e2m1", "fp8", "awq", "half", "", "-1", "1e9"]
    ),
    st.text(max_size=30),
)


@fuzz_settings(150)
@given(st.lists(st.tuples(st.sampled_from(_OPTIONS), _VALUES), max_size=8))
def test_fuzz_parser_reads_or_refuses_in_one_line(pairs) -> None:
    words = ["python", "-m", "sglang.launch_server", "--model-path", "m"]
    for option, value in pairs:
        words += [option, value]
    try:
        imported = import_command(" ".join(__import__("shlex").quote(w) for w in words))
    except GpumemInputError as e:
        assert "\n" not in str(e) and len(str(e)) < 400
        return
    assert imported.run.engine == "sglang"
    try:
        estimate_inference(LLAMA8, imported.run, capacity=H100)
    except GpumemInputError as e:
        assert "\n" not in str(e)
