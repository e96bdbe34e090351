"""The SGLang engine (gpumem_gui/core/runtimes/sglang*.py) and its launch-command parser
(gpumem_gui/core/imports/sglang.py): pool sizing from mem_fraction_static, SGLang's GPU-dependent defaults,
TP / DP attention, the reserve check, fit levers, the command round trip and bad input."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpumem_gui.cli import main
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.imports import import_command
from gpumem_gui.core.readers.catalog import load_gpu_catalog
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run, runtime
from gpumem_gui.core.runtimes.sglang_defaults import capture_sizes, server_defaults
from gpumem_gui.core.runtimes.sglang_pool import SGLANG_GRAPH_BYTES_PER_SIZE_LAYER, preload_bytes
from gpumem_gui.core.units import GiB
from tests.conftest import REPO
from tests.fuzz_strategies import fuzz_settings
from validation.validate_report.common import spec_for

GPUS = {g.id: g.memory_bytes for g in load_gpu_catalog()}
H100, H200, L4 = GPUS["H100-SXM-80GB"], GPUS["H200-SXM-141GB"], GPUS["L4"]
LLAMA8 = spec_for("meta-llama/Llama-3.1-8B")
LLAMA70 = spec_for("meta-llama/Llama-3.3-70B-Instruct")


def _est(spec, capacity=H100, **fields):
    return estimate_inference(spec, make_run(engine="sglang", **fields), capacity=capacity)


def _comp(est, key):
    return next(c.bytes for c in est.components if c.key == key)


# ------------------------------------------------------------------------------------------------ pool


def test_pool_is_the_static_fraction_of_free_memory_minus_the_weights_in_whole_tokens() -> None:
    est = _est(LLAMA8, mem_fraction_static=0.88)
    free = est.facts["pre_load_free_bytes"]
    cell = est.facts["kv_bytes_per_token"]
    assert cell == 32 * 8 * 2 * 128 * 2  # layers x KV heads x (K, V) x head_dim x bf16
    weights = _comp(est, "weights")
    tokens = int((free * 0.88 - weights) // cell)
    assert est.facts["max_total_num_tokens"] == tokens
    assert _comp(est, "kv_cache") == (tokens + 1) * cell  # the pool holds one page more
    assert free == H100 - preload_bytes(make_run(engine="sglang"), H100)
    assert est.facts["reserve_bytes"] == int(free * 0.12)


def test_a_default_fraction_below_zero_says_the_reserve_is_larger_than_the_gpu() -> None:
    """SGLang's default reserve grows with the prefill chunk (server_args.py _handle_gpu_memory_settings):
    a 16,384-token chunk on a 24 GB card leaves a negative mem_fraction_static, which the warning names as
    such instead of "the weights take more than -0.028 of the free memory"."""
    est = _est(LLAMA8, capacity=GPUS["RTX-4090"], chunked_prefill_size=16384)
    assert est.facts["mem_fraction_static"] < 0 and est.facts["max_total_num_tokens"] == 0
    (line,) = [w for w in est.warnings if w.startswith("mem_fraction_static")]
    assert "comes out at -0.028" in line and "larger than the GPU" in line and "take more than" not in line


def test_request_pool_and_max_running_requests_follow_sglang() -> None:
    est = _est(LLAMA8, mem_fraction_static=0.88, max_model_len=8192)
    tokens = est.facts["max_total_num_tokens"]
    reqs = min(max(min(int(tokens / 8192 * 512), 4096), 2048), tokens // 2)
    assert est.facts["max_running_requests"] == reqs == 4096
    assert _comp(est, "req_to_token") == reqs * (8192 + 4) * 4 + tokens * 8
    capped = _est(LLAMA8, mem_fraction_static=0.88, max_model_len=8192, max_running_requests=64)
    assert capped.facts["max_running_requests"] == 64
    assert _comp(capped, "req_to_token") < _comp(est, "req_to_token") / 10


def test_a_larger_fraction_gives_a_larger_pool_and_a_smaller_reserve() -> None:
    lo, hi = _est(LLAMA8, mem_fraction_static=0.8), _est(LLAMA8, mem_fraction_static=0.9)
    assert hi.facts["max_total_num_tokens"] > lo.facts["max_total_num_tokens"]
    assert hi.facts["reserve_bytes"] < lo.facts["reserve_bytes"]
    assert hi.total_bytes > lo.total_bytes


def test_fp8_kv_doubles_the_tokens_and_mla_stores_the_latent() -> None:
    bf16 = _est(LLAMA8, mem_fraction_static=0.88)
    fp8 = _est(LLAMA8, mem_fraction_static=0.88, kv_dtype="fp8_e5m2")
    assert fp8.facts["kv_bytes_per_token"] * 2 == bf16.facts["kv_bytes_per_token"]
    assert fp8.facts["max_total_num_tokens"] == pytest.approx(2 * bf16.facts["max_total_num_tokens"], abs=2)
    lite = spec_for("deepseek-ai/DeepSeek-V2-Lite")
    one, two = _est(lite, mem_fraction_static=0.88), _est(lite, mem_fraction_static=0.88, tp=2)
    latent = lite.num_layers * (lite.mla.kv_lora_rank + lite.mla.qk_rope_head_dim) * 2
    assert one.facts["kv_bytes_per_token"] == two.facts["kv_bytes_per_token"] == latent  # replicated


def test_tensor_parallel_splits_kv_heads_until_one_is_left() -> None:
    cells = {tp: _est(LLAMA70, H200, tp=tp).facts["kv_bytes_per_token"] for tp in (1, 2, 8, 16)}
    assert cells[1] == 2 * cells[2] == 8 * cells[8]
    assert cells[16] == cells[8]  # 8 KV heads over 16 ranks: one head each, replicated


def test_without_a_gpu_the_pool_holds_the_batch_and_the_fraction_falls_back() -> None:
    est = _est(LLAMA8, capacity=None, batch=4, seq=1000, new_tokens=24)
    assert est.facts["max_total_num_tokens"] == 4 * 1024
    assert est.facts["mem_fraction_static"] == 0.88
    assert "pre_load_free_bytes" not in est.facts
    assert runtime("sglang").admits(est)


# ------------------------------------------------------------------------------------------------ defaults


@pytest.mark.parametrize(
    ("gpu", "tp", "chunk", "max_bs", "fraction"),
    [
        ("H100-SXM-80GB", 1, 8192, 256, round((81559 - 13440) / 81559, 3)),  # 512 + 8192 x 1.5 + 512 + 128
        ("H100-SXM-80GB", 8, 8192, 512, round((81559 - 14848) / 81559, 3)),
        ("L4", 4, 2048, 80, round((23034 - 4256) / 23034, 3)),  # below 60 GiB: no 10 GiB floor
        ("T4", 1, 2048, 8, round((15360 - 3728) / 15360, 3)),
        ("B200-180GB", 8, 16384, 512, round((183360 - 27136) / 183360, 3)),
    ],
)
def test_sglang_defaults_by_gpu_memory_and_tp(gpu, tp, chunk, max_bs, fraction) -> None:
    sd = server_defaults(make_run(engine="sglang", tp=tp), GPUS[gpu])
    assert (sd.chunked_prefill_size, sd.cuda_graph_max_bs) == (chunk, max_bs)
    assert sd.mem_fraction_static == pytest.approx(fraction, abs=0.0015)
    assert sd.fraction_is_default and "reserved" in sd.explain()


def test_capture_sizes_and_graph_memory() -> None:
    assert capture_sizes(8, False) == (1, 2, 4, 8)
    assert len(capture_sizes(256, False)) == 36
    assert len(capture_sizes(512, False)) == 52
    assert capture_sizes(512, True) == ()
    est = _est(LLAMA8, mem_fraction_static=0.88, cuda_graph_max_bs=256)
    assert _comp(est, "cudagraph") == 36 * 32 * SGLANG_GRAPH_BYTES_PER_SIZE_LAYER
    off = _est(LLAMA8, mem_fraction_static=0.88, disable_cuda_graph=True)
    assert _comp(off, "cudagraph") == 0
    # graphs live in the reserve: the pool does not change
    assert off.facts["max_total_num_tokens"] == est.facts["max_total_num_tokens"]


def test_radix_cache_is_memory_neutral() -> None:
    on, off = _est(LLAMA8), _est(LLAMA8, disable_radix_cache=True)
    assert on.total_bytes == off.total_bytes
    assert "no memory of its own" in on.facts["radix_cache"]


def test_chunked_prefill_sizes_the_activations() -> None:
    small, big = _est(LLAMA8, chunked_prefill_size=2048), _est(LLAMA8, chunked_prefill_size=16384)
    assert _comp(big, "activations") > 6 * _comp(small, "activations")


# ------------------------------------------------------------------------------------------------ DP, PP


def test_dp_attention_splits_attention_tp_and_the_requests() -> None:
    tp8 = _est(LLAMA70, H200, tp=8, max_running_requests=64)
    dp4 = _est(LLAMA70, H200, tp=8, dp_size=4, enable_dp_attention=True, max_running_requests=64)
    assert dp4.facts["kv_bytes_per_token"] == 4 * tp8.facts["kv_bytes_per_token"]  # attention tp 2
    assert dp4.facts["max_running_requests"] == 16 and tp8.facts["max_running_requests"] == 64
    assert len(dp4.per_gpu) == 8


def test_dp_replicas_warn_and_keep_one_replicas_gpus() -> None:
    est = _est(LLAMA8, tp=2, dp_size=2, batch=8)
    assert len(est.per_gpu) == 2 and est.facts["sequences_per_pool"] == 4
    assert any(w.startswith("dp_size: 2 replicas") for w in est.warnings)


def test_pipeline_stages_share_the_smallest_pool() -> None:
    est = _est(LLAMA70, H100, tp=2, pp=2)
    assert len(est.per_gpu) == 4
    assert {s.role for s in est.per_gpu} >= {"TP rank 0, PP stage 0", "TP rank 1, PP stage 1"}


# ------------------------------------------------------------------------------------------------ checks


def test_the_reserve_check_and_a_pool_that_cannot_start() -> None:
    tight = _est(LLAMA70, H100, tp=2, mem_fraction_static=0.99)
    assert any("reserve" in w for w in tight.warnings)
    assert tight.total_bytes > H100
    none = _est(LLAMA70, H100, tp=2, mem_fraction_static=0.3)
    assert none.facts["max_total_num_tokens"] == 0
    assert any("refuse to start" in w for w in none.warnings)
    assert not runtime("sglang").admits(none)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"dp_size": 1, "enable_dp_attention": True}, "dp_size"),
        ({"tp": 8, "dp_size": 3, "enable_dp_attention": True}, "dp_size"),
        ({"kv_dtype": "q8_0"}, "kv_dtype"),
        ({"kv_dtype": "fp16"}, "kv_dtype"),  # fp16 KV only with an fp16 model
    ],
)
def test_bad_runs_are_one_error_naming_the_field(fields, field) -> None:
    with pytest.raises(GpumemInputError) as e:
        _est(LLAMA70, H200, **fields)
    assert e.value.field == field


def test_cli_bad_value_exits_2_with_one_line(capsys) -> None:
    code = main(["estimate", "meta-llama/Llama-3.1-8B", "--engine", "sglang", "--mem-fraction-static", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "mem_fraction_static" in err


def test_cli_estimate_json_carries_sglangs_facts(capsys) -> None:
    code = main(
        ["estimate", "meta-llama/Llama-3.1-8B", "--engine", "sglang", "--gpu", "H100-SXM-80GB", "--json"]
    )
    assert code == 0
    facts = json.loads(capsys.readouterr().out)["facts"]
    assert facts["max_total_num_tokens"] > 400_000 and facts["mem_fraction_static"] == 0.835


# ------------------------------------------------------------------------------------------------ levers


def test_fit_levers_lower_the_fraction_for_a_run_over_the_card() -> None:
    def fits_for(run):
        def fits(**update) -> bool:
            est = estimate_inference(LLAMA70, run.model_copy(update=update), capacity=H100)
            return est.total_bytes <= H100 - GiB and runtime("sglang").admits(est)

        return fits

    run = make_run(engine="sglang", tp=2, mem_fraction_static=0.99)
    levers = runtime("sglang").fit_levers(LLAMA70, run, fits_for(run))
    kinds = {k: upd for _, k, _, upd in levers}
    assert 0.3 < kinds["mem_fraction_static"]["mem_fraction_static"] < 0.99
    assert fits_for(run)(**kinds["mem_fraction_static"])
    fitting = run.model_copy(update={"mem_fraction_static": 0.85})
    assert runtime("sglang").fit_levers(LLAMA70, fitting, fits_for(fitting)) == []


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
