"""Trace mode against PyTorch's own reference measurements, in-process and in a subprocess, with its cache,
its refusals and its failures (torch from the ``trace`` extra, which ``make test`` installs)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gpumem_gui.core import GpumemInputError, load_model, make_run, make_training_run, traced_categories
from gpumem_gui.core.reference_points import run_for_point
from tests.conftest import REPO, reference_dir

if os.environ.get("GPUMEM_REQUIRE_TRACE") != "1":
    pytest.importorskip("torch", reason="trace mode needs torch (make test installs the trace extra)")
    pytest.importorskip("transformers")

from gpumem_gui.trace import TraceFailure, trace, trace_document

UNSUPPORTED = REPO / "tests" / "reference" / "unsupported"


def _points(path: Path, n: int) -> list[dict]:
    """Every ``n``-th point of a reference grid (the smallest shapes: a few seconds each)."""
    grid = json.loads(path.read_text())["grid"]
    small = [p for p in grid if p["batch"] * p["seq"] <= 2048]
    return small[::n]


@pytest.mark.parametrize(
    "point",
    _points(reference_dir() / "groundtruth.json", 6),
    ids=lambda p: f"{p['model']}-{p['mode']}-{p['attn_implementation']}",
)
def test_trace_equals_pytorch_reference(point: dict) -> None:
    """Same numbers as the reference measurements (groundtruth.json), to the byte."""
    model = load_model(str(reference_dir() / "configs" / f"{point['model']}.json"))
    rep = trace(model, run_for_point(point), use_cache=False)
    assert rep.result.peak_bytes == point["peak_bytes"]


def test_a_model_type_the_core_does_not_describe() -> None:
    """A pure Mamba-2 model (tests/reference/unsupported/configs/synthetic__mamba2-tiny.json): the readers
    refuse it, even as a generic decoder, naming the field and pointing to trace mode; transformers builds it
    and the trace measures it (its bf16 weights and more), saying there is no analytic estimate."""
    config = UNSUPPORTED / "configs" / "synthetic__mamba2-tiny.json"
    with pytest.raises(GpumemInputError, match="not modelled") as e:
        load_model(str(config))
    assert e.value.field == "intermediate_size" and "gpumem trace" in str(e.value)
    model = load_model(str(config), unknown_architecture_ok=True)
    assert model.spec is None and model.config["model_type"] == "mamba2"
    run = make_run(batch=1, seq=128)
    rep = trace(model, run, use_cache=False)
    doc = trace_document(model, run, rep)
    assert rep.estimate is None and doc["analytic"] is None
    # Mamba2ForCausalLM: embeddings and lm_head 1024 x 256, two mixers of in_proj 256 x 1104 and out_proj
    # 512 x 256 (plus the small conv, norm and per-head tensors), bf16: over 2.2 MB of weights alone
    assert rep.result.peak_bytes > 2 * (2 * 1024 * 256 + 2 * (256 * 1104 + 512 * 256))


def test_nemotron_h_trace_equals_the_reference_and_the_estimate() -> None:
    """Nemotron-H (Mamba-2 layers among attention and MLP layers, read since issue 14): the trace equals the
    reference script's measurement (tests/reference/unsupported/groundtruth.json), and so does the analytic
    estimate beside it."""
    key = "nvidia__Nemotron-H-8B-Base-8K"
    grid = json.loads((UNSUPPORTED / "groundtruth.json").read_text())["grid"]
    point = next(
        p
        for p in grid
        if (p["model"], p["mode"], p["attn_implementation"]) == (key, "infer_prefill_last_logit", "sdpa")
    )
    model = load_model(str(UNSUPPORTED / "configs" / f"{key}.json"))
    assert model.spec is not None and model.spec.mamba is not None and model.spec.approximate is None
    rep = trace(model, make_run(batch=point["batch"], seq=point["seq"]), use_cache=False)
    assert rep.result.peak_bytes == point["peak_bytes"]
    assert rep.estimate is not None and rep.estimate.peak_bytes == point["peak_bytes"]


def test_an_approximate_model_is_traced_beside_its_generic_estimate() -> None:
    """A model type neither gpumem nor transformers knows (tests/reference/remote_code/tiny_custom: Llama's
    classes renamed, run with its own code): the generic decoder estimates it, flagged approximate; trace
    mode runs the real code, says the trace is the answer, and the generic estimate is close (a Llama)."""
    folder = REPO / "tests" / "reference" / "remote_code" / "tiny_custom"
    model = load_model(str(folder))
    assert model.spec is not None and model.spec.approximate
    run = make_run(seq=64)
    rep = trace(model, run, trust_remote_code=True, use_cache=False)
    assert rep.estimate is not None and rep.approximate == model.spec.approximate
    assert any("trace is the answer" in n and "approximate" in n for n in rep.notes)
    doc = trace_document(model, run, rep)
    assert doc["approximate"] == model.spec.approximate
    assert rep.peak.estimated_bytes == pytest.approx(rep.peak.traced_bytes, rel=0.01)


def test_subprocess_equals_in_process_and_the_cache_answers_again(tmp_path: Path) -> None:
    model = load_model("Llama-3.2-1B")
    run = make_run(batch=1, seq=256, new_tokens=4)
    here = trace(model, run, use_cache=False)
    there = trace(model, run, python=sys.executable)
    assert there.result.phases == here.result.phases and not there.result.cached
    again = trace(model, run, python=sys.executable)
    assert again.result.cached and again.result.phases == here.result.phases
    assert not trace(model, run.model_copy(update={"seq": 257}), python=sys.executable).result.cached
    doc = trace_document(model, run, again)
    assert doc["source"] == "trace" and doc["analytic"]["relative_difference_at_peak"] == pytest.approx(
        0, abs=1e-4
    )


def test_lora_and_data_parallel_steps_run() -> None:
    model = load_model(
        str(REPO / "tests" / "reference" / "extra" / "configs" / "synthetic__llama-bias-tiny.json")
    )
    lora = trace(
        model, make_training_run(method="lora", precision="bf16", seq=64, lora_rank=4), use_cache=False
    )
    assert lora.estimate is not None
    assert lora.result.trainable_params == lora.estimate.facts["trainable_params"]  # PEFT's count
    full = trace(model, make_training_run(seq=64), use_cache=False).result
    ranks = {}
    for kw in ({"dp": 4}, {"dp": 4, "zero": 1, "zero_impl": "torch"}, {"dp": 4, "fsdp": "full_shard"}):
        rank = ranks[tuple(kw)] = trace(model, make_training_run(seq=64, **kw), use_cache=False).result
        assert rank.world_size == 4 and any("fake process group" in n for n in rank.notes)
    fsdp = ranks[("dp", "fsdp")]
    assert fsdp.phases["optimizer"]["Total"] < full.phases["optimizer"]["Total"]  # states and grads sharded
    # every tracker category (FSDPMemTracker's own names included) lands in one of ours
    for result in (lora.result, full, *ranks.values()):
        for snap in result.phases.values():
            assert sum(traced_categories(snap).values()) == snap["Total"]


@pytest.mark.parametrize(
    ("run", "field"),
    [
        (make_run(engine="vllm"), "engine"),
        (make_run(tp=2), "tp"),
        (make_run(weights="nf4"), "weights"),
        (make_training_run(method="qlora"), "method"),
        (make_training_run(optimizer="adamw-8bit"), "optimizer"),
        (make_training_run(zero=3, dp=2), "zero"),
        (make_training_run(tp=2), "tp"),
    ],
)
def test_runs_a_trace_cannot_do_are_refused_by_field(run, field: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        trace(load_model("Llama-3.2-1B"), run)
    assert e.value.field == field and "\n" not in str(e.value)


def test_failures_are_one_line(tmp_path: Path) -> None:
    model = load_model("Llama-3.2-1B")
    with pytest.raises(TraceFailure, match="cannot run the Python"):
        trace(model, make_run(seq=64), python=str(tmp_path / "no-such-python"))
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "no_such_architecture", "hidden_size": 8}))
    odd = load_model(str(bad), unknown_architecture_ok=True)
    with pytest.raises(TraceFailure, match="transformers rejects the config") as e:
        trace(odd, make_run(seq=64), use_cache=False)
    assert "\n" not in str(e.value)
    with pytest.raises(TraceFailure, match="longer than 1 s"):
        trace(
            load_model("Qwen3-30B-A3B"), make_run(seq=64), python=sys.executable, timeout=1, use_cache=False
        )


def test_cli_trace_json_and_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    from gpumem_gui.cli import main

    assert main(["trace", "Llama-3.2-1B", "--seq", "128", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "trace" and doc["peak_phase"] == "prefill" and doc["versions"]["torch"]
    assert main(["trace", "Llama-3.2-1B", "--engine", "vllm"]) == 2
    err = capsys.readouterr().err
    assert "engine" in err and err.count("\n") == 1


def test_flash_attention_is_traced_as_sdpa_and_says_so() -> None:
    """flash_attention_2 needs CUDA; the sdpa path runs the same fused kernel on a GPU."""
    model = load_model(
        str(REPO / "tests" / "reference" / "extra" / "configs" / "synthetic__llama-bias-tiny.json")
    )
    flash = trace(model, make_run(seq=64, attn="flash"), use_cache=False).result
    sdpa = trace(model, make_run(seq=64, attn="sdpa"), use_cache=False).result
    assert flash.phases == sdpa.phases
    assert any("flash-attention needs CUDA" in n for n in flash.notes)
    assert not any("flash" in n for n in sdpa.notes)


def test_model_code_from_the_checkpoint_runs_only_when_trusted() -> None:
    """A folder whose config.json names its own classes (auto_map): refused until trusted, then traced with
    that code, which the result names (tests/reference/remote_code/tiny_custom: Llama's classes renamed)."""
    folder = REPO / "tests" / "reference" / "remote_code" / "tiny_custom"
    model = load_model(str(folder), unknown_architecture_ok=True)
    run = make_run(seq=64)
    with pytest.raises(TraceFailure, match="--trust-remote-code"):
        trace(model, run, use_cache=False)
    trusted = trace(model, run, trust_remote_code=True, use_cache=False).result
    plain = load_model(
        str(REPO / "tests" / "reference" / "extra" / "configs" / "synthetic__llama-bias-tiny.json")
    )
    assert trusted.phases == trace(plain, run, use_cache=False).result.phases
    assert any("modeling_tiny.py" in n and str(folder) in n for n in trusted.notes)
    # the catalog and the Hub have no local folder to run code from
    hub_like = model.model_copy(update={"source": "someorg/tiny-custom"})
    with pytest.raises(TraceFailure, match="local folder"):
        trace(hub_like, run, trust_remote_code=True, use_cache=False)


def test_multimodal_model_traces_its_language_model_and_adds_the_vision_tower() -> None:
    """A Gemma-3 config with a SigLIP tower: text-only forward; the tower and projector's parameters (as
    transformers builds them) are added to every phase; a text step gives them no optimizer state."""
    model = load_model(
        str(REPO / "tests" / "reference" / "extra" / "configs" / "synthetic__gemma3-vision-tiny.json")
    )
    assert model.params is not None
    for run in (make_run(seq=64), make_training_run(seq=64)):
        rep = trace(model, run, use_cache=False)
        assert rep.result.vision_params == model.params.vision
        assert any("multimodal" in n for n in rep.result.notes)
        peak = rep.peak
        assert peak.estimated_bytes == pytest.approx(peak.traced_bytes, rel=0.01)


def test_lora_on_fused_moe_experts_matches_the_trace() -> None:
    """PEFT 0.21 on transformers 5 puts LoRA on the fused expert stacks and the router (target_parameters,
    ParamWrapper merging each MoE layer's experts in the forward) and takes it off the dense MLPs: the replay
    does the same (replay/moe_lora.py; it was -21 % when it adapted linears only)."""
    model = load_model(
        str(REPO / "tests" / "reference" / "extra" / "configs" / "synthetic__qwen3_moe-sparse-step2.json")
    )
    rep = trace(model, make_training_run(method="lora", seq=64), use_cache=False)
    assert rep.peak.estimated_bytes == pytest.approx(rep.peak.traced_bytes, rel=0.01)


def test_the_product_refuses_exactly_the_optimizers_the_worker_cannot_trace() -> None:
    from gpumem_gui.trace.gpumem_trace_worker.training import OPTIMIZERS
    from gpumem_gui.trace.request import TRACED_OPTIMIZERS

    assert set(TRACED_OPTIMIZERS) == set(OPTIMIZERS)
