"""Issue 33 item 9: corners of the CLI and the core a user meets in an ordinary flow. A framework's own
precision as its default, fit's longest context capped at the model's context window, Ollama's batch bounded
by OLLAMA_NUM_PARALLEL, the KV type the header states being the engine's own, no "give a model" warning once
a model is given, and context parallelism counted as a sharding dimension of torchtitan's FSDP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumem_gui.cli import main
from gpumem_gui.core import (
    GpumemInputError,
    GpuTarget,
    estimate_inference,
    fit_report,
    fit_training,
    load_model,
    make_run,
    maxima_phrases,
)
from gpumem_gui.core.training import estimate_training, make_training_run
from gpumem_gui.core.training.profiles import PROFILES
from gpumem_gui.core.units import GiB
from tests.conftest import reference_dir

QWEN = str(reference_dir() / "configs" / "Qwen__Qwen2.5-0.5B.json")
IMPORTS = Path(__file__).parent / "data" / "imports"


@pytest.fixture(scope="module")
def qwen():
    return load_model(QWEN).spec


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ---- (a) a framework's own precision is its default --------------------------------------------------------


def test_every_profile_default_precision_is_one_it_offers() -> None:
    owned = [p for p in PROFILES.values() if p.precision is not None]
    assert owned, "Megatron-LM trains in its own precision"
    for p in owned:
        assert p.precisions is not None and p.precision in p.precisions and p.precision_source


def test_megatron_alone_trains_in_megatron_bf16(qwen, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_training_run(framework="megatron")
    assert run.precision == "megatron-bf16"
    estimate_training(qwen, run)  # accepted as it stands
    assert make_training_run(framework="megatron", precision="fp32").precision == "fp32"  # given stays
    assert make_training_run().precision == "amp-bf16"  # a framework without one keeps the run's default
    with pytest.raises(GpumemInputError) as e:  # a precision the framework does not run is still refused
        estimate_training(qwen, make_training_run(framework="megatron", precision="amp-bf16"))
    assert e.value.field == "precision"
    rc, out, err = _run(capsys, "estimate", QWEN, "--mode", "train", "--framework", "megatron")
    assert rc == 0, err
    assert ", megatron-bf16, " in out.splitlines()[0]


# ---- (b) fit's longest context stops at the model's context window ----------------------------------------


def test_inference_fit_caps_the_context_at_the_window(qwen) -> None:
    window = qwen.max_position_embeddings
    rep = fit_report(qwen, make_run(seq=1024), GpuTarget(name="big", capacity_bytes=80 * GiB))
    assert rep.max_context == window and rep.context_window == window
    assert f"max context {window:,} tokens (the model's context window)" in maxima_phrases(rep)
    small = fit_report(qwen, make_run(seq=1024), GpuTarget(name="small", capacity_bytes=3 * GiB))
    assert small.max_context is not None and small.max_context < window and small.context_window is None


def test_new_tokens_filling_the_window_leave_no_context(qwen) -> None:
    window = qwen.max_position_embeddings
    run = make_run(seq=16, new_tokens=window)
    rep = fit_report(qwen, run, GpuTarget(name="big", capacity_bytes=80 * GiB))
    # no prompt fits, and the report names the window as the reason (not memory)
    assert rep.max_context is None and rep.context_window == window
    assert f"no context length fits (the model's context window is {window:,} tokens)" in maxima_phrases(rep)


def test_training_fit_caps_the_sequence_at_the_window(qwen) -> None:
    window = qwen.max_position_embeddings
    rep = fit_training(
        qwen, make_training_run(method="lora", seq=16384), GpuTarget(name="b", capacity_bytes=1 << 50)
    )
    assert rep.max_context == window and rep.context_window == window
    assert any("(the model's context window)" in p for p in maxima_phrases(rep))


# ---- (c) Ollama's batch: OLLAMA_NUM_PARALLEL requests at once, the rest queue ---------------------------


def test_readme_ollama_fit_bounds_the_batch_by_num_parallel(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(
        capsys,
        "fit",
        "--from",
        "OLLAMA_NUM_PARALLEL=4 OLLAMA_FLASH_ATTENTION=1 ollama run llama3.1:8b",
        "--gpu",
        "RTX-4090",
    )
    assert rc == 0, err
    assert "max batch 4 (OLLAMA_NUM_PARALLEL=4: Ollama queues more requests)" in out
    assert "65536" not in out


def test_ollama_without_num_parallel_is_bounded_by_memory() -> None:
    spec = load_model("Llama-3.1-8B").spec
    run = make_run(engine="ollama", weights="gguf-Q4_K_M", seq=8192)
    rep = fit_report(spec, run, GpuTarget(name="24", capacity_bytes=24 * GiB))
    # every parallel request gets its own num_ctx cells: memory, not a setting, bounds the batch
    assert rep.max_batch is not None and 1 < rep.max_batch < 64 and rep.batch_limit is None


# ---- (d) the header states the KV type the engine really uses ----------------------------------------------


def _header(capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    rc, out, err = _run(capsys, "estimate", "Llama-3.1-8B", *flags)
    assert rc == 0, err
    return out.splitlines()[0]


def test_llamacpp_header_says_its_f16_cache_and_the_ctk_ctv_types(capsys: pytest.CaptureFixture[str]) -> None:
    base = ("--engine", "llama.cpp", "--weights", "gguf-Q4_K_M")
    assert ", KV f16, " in _header(capsys, *base)
    assert ", KV K q8_0, V f16, " in _header(capsys, *base, "-ctk", "q8_0", "--flash-attn")
    assert ", KV q8_0, " in _header(capsys, *base, "-ctk", "q8_0", "-ctv", "q8_0", "--flash-attn")


def test_llamacpp_default_cache_is_f16_whatever_the_compute_dtype() -> None:
    """common/common.h: cache_type_k = cache_type_v = GGML_TYPE_F16 unless -ctk / -ctv say otherwise."""
    spec = load_model("Llama-3.1-8B").spec
    kv = {
        dt: estimate_inference(
            spec, make_run(engine="llama.cpp", weights="gguf-Q4_K_M", compute_dtype=dt)
        ).kv_cache_bytes
        for dt in ("bf16", "fp32")
    }
    assert kv["fp32"] == kv["bf16"] == 32 * 2048 * 2 * 1024 * 2  # layers x cells x (K + V) x width x f16


def test_ollama_header_says_the_type_ollama_keeps(capsys: pytest.CaptureFixture[str]) -> None:
    base = (
        "--engine",
        "ollama",
        "--ollama-version",
        "0.12.10",
        "--weights",
        "gguf-Q4_K_M",
        "--kv-dtype",
        "q8_0",
    )
    assert ", KV f16, " in _header(capsys, *base, "--flash-attention", "off")  # q8_0 needs flash attention
    assert ", KV q8_0, " in _header(capsys, *base, "--flash-attention", "on")


# ---- (e) an imported config without a model, with the model given -----------------------------------------


@pytest.mark.parametrize("name", ["accelerate_multi_gpu.yaml", "deepspeed_llamafactory_ds_z2_config.json"])
def test_a_config_without_a_model_warns_nothing_once_one_is_given(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(IMPORTS / name)
    rc, out, err = _run(capsys, "estimate", QWEN, "--from-file", path, "--json")
    assert rc == 0, err
    warnings = json.loads(out)["imported"]["warnings"]
    assert not [w for w in warnings if "model" in w.split(":")[0]], warnings
    rc, _, err = _run(capsys, "estimate", "--from-file", path)
    assert rc == 2 and "names no model (model: " in err and "give one" in err


# ---- (f) torchtitan shards over dp x cp --------------------------------------------------------------------


def test_torchtitan_fsdp_shards_over_context_parallel_ranks(qwen) -> None:
    """torchtitan parallel_dims.py: fsdp_enabled = dp_shard > 1 or cp > 1, and FSDP's mesh is dp_shard_cp."""
    kw = {"framework": "torchtitan", "precision": "mp-bf16", "fsdp": "full_shard", "seq": 4096}
    cp8 = estimate_training(qwen, make_training_run(**kw, cp=8))
    assert not [w for w in cp8.warnings if "nothing to shard" in w], cp8.warnings
    alone = estimate_training(qwen, make_training_run(**kw))
    assert [w for w in alone.warnings if "nothing to shard" in w]  # one rank: still said
