"""Every run field is declared once (issue 12): the window's forms, the CLI's flags, the copied command line
and the README's flag table all come from the run models' declarations, so a run survives
form -> copied command -> CLI parser unchanged, and so does its estimate."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumem_gui.cli import build_parser, run_from_args
from gpumem_gui.cli.flags import flag_table
from gpumem_gui.core import (
    GpumemInputError,
    InferenceRun,
    RunField,
    TrainingRun,
    command_args,
    estimate_any,
    load_model,
    run_fields,
)
from gpumem_gui.ui.report import cli_command
from gpumem_gui.ui.run_form import RunForm
from gpumem_gui.ui.train_form import TrainingForm
from tests.conftest import REPO

INFERENCE_RUNS = [
    InferenceRun(),
    InferenceRun(
        batch=3,
        seq=1500,
        new_tokens=77,
        weights="nf4",
        compute_dtype="fp32",
        kv_dtype="int8",
        attn="eager",
        logits="all",
        tp=2,
        cuda_context_mib=350,
    ),
    InferenceRun(
        engine="transformers", weights="fp8", compute_dtype="fp16", attn="flash", pp=2, kv_dtype="fp16"
    ),
    InferenceRun(
        engine="vllm",
        batch=16,
        seq=2048,
        new_tokens=512,
        weights="awq-4",
        kv_dtype="fp8",
        tp=2,
        gpu_memory_utilization=0.85,
        max_num_seqs=64,
        max_model_len=32768,
        max_num_batched_tokens=4096,
        enforce_eager=True,
    ),
    InferenceRun(
        engine="llama.cpp",
        weights="gguf-Q4_K_M",
        seq=8192,
        kv_dtype="q8_0",
        n_gpu_layers=10,
        n_batch=4096,
        n_ubatch=1024,
        flash_attn=False,
    ),
    InferenceRun(engine="llama.cpp", weights="gguf-Q8_0", n_ubatch=4096, n_batch=4096, n_gpu_layers=0),
]

TRAINING_RUNS = [
    TrainingRun(),
    *(TrainingRun(precision=p) for p in ("amp-fp16", "bf16", "fp32", "megatron-bf16")),
    *(
        TrainingRun(optimizer=o, precision="bf16")
        for o in (
            "adamw-fused",
            "adamw-foreach",
            "adamw-for-loop",
            "adamw-8bit",
            "paged-adamw-8bit",
            "adafactor",
            "sgd",
            "sgd-momentum",
            "lion",
        )
    ),
    TrainingRun(
        method="lora",
        lora_rank=8,
        lora_alpha=16.5,
        lora_targets=("q_proj", "v_proj"),
        lora_dropout=0.05,
        precision="bf16",
        grad_ckpt=True,
        frozen_layers=4,
    ),
    TrainingRun(
        method="qlora",
        qlora_base="nf4-dq",
        optimizer="paged-adamw-8bit",
        precision="bf16",
        grad_ckpt=True,
        seq=4096,
        first_step=True,
        dropout=0.1,
    ),
    TrainingRun(zero=1, dp=4, offload="optimizer", grad_accum=4),
    TrainingRun(zero=2, dp=8, tp=2, batch=2, seq=1024),
    TrainingRun(zero=3, dp=8, offload="optimizer+params", grad_ckpt=True),
    TrainingRun(fsdp="full_shard", dp=8, attn="eager", seq=512),
    TrainingRun(fsdp="shard_grad_op", dp=4, pp=2, grad_accum=8, cuda_context_mib=0),
    TrainingRun(fsdp="hybrid_shard", dp=16, gpus_per_node=4, cp=2, seq=8192),
]


@pytest.fixture(scope="module")
def llama():
    return load_model("Llama-3.2-1B")


def _through_the_cli(line: str, model) -> InferenceRun | TrainingRun:
    argv = shlex.split(line)
    assert argv[:2] == ["gpumem", "estimate"]
    return run_from_args(build_parser().parse_args(argv[1:]), model)


def _same_estimate(model, a, b) -> None:
    try:
        ea = estimate_any(model.spec, a, 80 << 30, model.weights)
    except GpumemInputError as e:
        with pytest.raises(GpumemInputError, match=str(e.message)[:40]):
            estimate_any(model.spec, b, 80 << 30, model.weights)
        return
    assert estimate_any(model.spec, b, 80 << 30, model.weights).model_dump() == ea.model_dump()


@pytest.mark.parametrize(
    "run", INFERENCE_RUNS + TRAINING_RUNS, ids=lambda r: " ".join(command_args(r)) or "default"
)
def test_form_copied_command_and_cli_give_the_same_run_and_estimate(qtbot, llama, run) -> None:
    form = TrainingForm() if isinstance(run, TrainingRun) else RunForm()
    qtbot.addWidget(form)
    form.set_value(run)
    from_form = form.value()
    assert from_form == run
    line = cli_command(llama.source, from_form, "H100-SXM-80GB", 2, margin_bytes=512 << 20)
    assert _through_the_cli(line, llama) == run
    args = build_parser().parse_args(shlex.split(line)[1:])
    assert args.gpu == "H100-SXM-80GB:2" and args.margin_mib == 512
    _same_estimate(llama, run, _through_the_cli(line, llama))


def _value(f: RunField) -> st.SearchStrategy:
    if f.kind == "bool":
        return st.booleans()
    if f.values:
        return st.sampled_from(f.values)
    if f.ui.choices:
        return st.sampled_from([v for _, v in f.ui.choices])
    if f.kind == "int":
        lo = int(f.lo if f.lo is not None else 0)
        hi = min(int(f.hi if f.hi is not None else 1 << 20), lo + 9000)
        base = st.integers(lo, hi)
        return st.one_of(st.none(), base) if f.optional else base
    if f.kind == "float":
        lo = (f.lo or 0) + (0.01 if f.lo_open else 0)
        hi = min(f.hi if f.hi is not None else 100, 100) - (0.01 if f.hi_open else 0)
        base = st.floats(lo, hi).map(lambda x: round(x, 4))
        return st.one_of(st.none(), base) if f.optional else base
    return {"weights": st.sampled_from(["bf16", "fp8", "nf4", "gptq-4", "gguf-Q4_K_M", "gguf-Q8_0"])}.get(
        f.name, st.sampled_from(["auto", "fp16", "fp8", "q8_0", "int4"])
    )


def _runs(model: type) -> st.SearchStrategy:
    fields = {f.name: _value(f) for f in run_fields(model)}

    def build(values: dict) -> object:
        try:
            return model(**values)
        except ValueError:
            return None

    return st.fixed_dictionaries({}, optional=fields).map(build).filter(lambda r: r is not None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(run=st.one_of(_runs(InferenceRun), _runs(TrainingRun)))
def test_any_valid_run_survives_its_command_line(llama, run) -> None:
    """Generated from the declarations themselves: every field, any valid value, any combination."""
    rebuilt = _through_the_cli(cli_command(llama.source, run), llama)
    assert rebuilt == run


def test_a_flag_of_the_other_mode_is_refused_by_name(llama) -> None:
    args = build_parser().parse_args(["estimate", "x", "--mode", "train", "--enforce-eager"])
    with pytest.raises(GpumemInputError, match="--enforce-eager belongs to --mode inference"):
        run_from_args(args, llama)


def test_every_declared_field_has_a_flag_and_a_form_row(qtbot) -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser_flags = {o for a in sub.choices["estimate"]._actions for o in a.option_strings}
    forms = {InferenceRun: RunForm(), TrainingRun: TrainingForm()}
    for model, form in forms.items():
        qtbot.addWidget(form)
        for f in run_fields(model):
            assert f.flag in parser_flags, f.name
            assert form.widget(f.name).toolTip(), f.name


def test_readme_flag_table_is_generated_from_the_declarations() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    begin, end = "<!-- flags:begin -->\n", "<!-- flags:end -->"
    assert begin in readme and end in readme, "README.md lacks the generated flag table markers"
    block = readme.split(begin, 1)[1].split(end, 1)[0].strip("\n") + "\n"
    assert block == flag_table(), "run `make readme` to regenerate the flag table"


def test_readme_markers_exist_once() -> None:
    text = Path(REPO / "README.md").read_text(encoding="utf-8")
    assert text.count("<!-- flags:begin -->") == 1 and text.count("<!-- flags:end -->") == 1


def test_a_precision_at_its_default_is_written_where_the_framework_would_choose_another(llama) -> None:
    """Megatron's profile trains in megatron-bf16 when the run names no precision: an amp-bf16 Megatron run
    (the declared default) must say so on its command line, or it comes back as megatron-bf16 (found by
    test_any_valid_run_survives_its_command_line)."""
    run = TrainingRun(precision="amp-bf16", framework="megatron")
    command = cli_command(llama.source, run)
    assert "--precision amp-bf16" in command
    assert _through_the_cli(command, llama) == run
    plain = TrainingRun(framework="megatron")  # megatron-bf16, the profile's own
    assert _through_the_cli(cli_command(llama.source, plain), llama) == plain
