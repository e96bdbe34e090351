"""Fuzz: the training flags of ``gpumem estimate / fit / sweep --mode train`` and the training run model.

Two properties:

* every command line built from the training options of the CLI's own parser (the ``[train]`` flags, with
  the shape, parallel and GPU flags), each with a value from its choices, its field's suggested values, or an
  extreme or wrong value, exits 0 or 2 with one ``gpumem...: error:`` line (``tests/test_fuzz_cli.py``'s
  check), never a traceback;
* no wrong number the solvers would trip on: for a valid training run, memory never falls as the
  micro-batch or the sequence grows (``core/monotone.py``'s bisections and gallops for the largest batch and
  the longest sequence rely on it), and the peak is at least the parameters the rank holds.

``make test`` runs a few dozen examples each; ``make fuzz`` (``GPUMEM_FUZZ=long``) 40 times as many.
"""

from __future__ import annotations

import argparse
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpumem_gui.core import GpumemInputError, estimate_training, find_model, make_training_run
from tests.fuzz_strategies import fuzz_settings, passing_over_known_bugs
from tests.test_fuzz_cli import MODELS, NUMBERS, SUBPARSERS, TEXTS, check_cli

# the catalog models whose layers differ in every way a training replay branches on: dense GQA, MoE, MLA,
# a vision-language model, a learned-position MHA model, a Mamba-2 hybrid, gated DeltaNet + attention, an
# encoder with its task head
TRAIN_MODELS = [
    "meta-llama/Llama-3.2-1B",
    "Qwen3-30B-A3B",
    "deepseek-ai/DeepSeek-V2-Lite",
    "google/gemma-3-4b-it",
    "openai-community/gpt2",
    "tiiuae/Falcon-H1-0.5B-Instruct",
    "Qwen/Qwen3-Next-80B-A3B-Instruct",
    "google-bert/bert-base-uncased",
]
SHAPE_FLAGS = ("--batch", "--seq", "--tp", "--pp", "--ep", "--gpu", "--json", "--task", "--num-labels")


def _train_options(command: str) -> list[argparse.Action]:
    """The ``[train]`` options of ``command`` and the shape / parallel / GPU ones a training run reads."""
    return [
        a
        for a in SUBPARSERS[command]._actions
        if a.option_strings and ((a.help or "").startswith("[train]") or a.option_strings[0] in SHAPE_FLAGS)
    ]


@st.composite
def _value(draw: st.DrawFn, action: argparse.Action) -> str:
    if action.choices and draw(st.integers(0, 3)):
        return str(draw(st.sampled_from(list(action.choices))))
    field = getattr(action.type, "field", None)
    if field is not None and field.values and draw(st.integers(0, 2)):
        return str(draw(st.sampled_from(list(field.values))))
    if action.dest == "gpu":
        return draw(st.sampled_from(["H100-SXM-80GB:8", "RTX-4090", "A100-80GB:64", "24GiB:2", "0GiB", "x"]))
    if action.dest == "seq":  # a long sequence is a real case, but keep each example quick
        return draw(st.sampled_from(["1", "2", "511", "4096", "8193", "0", "-1", "x", "1e9"]))
    return draw(st.sampled_from(NUMBERS) | st.integers(-3, 5000).map(str) | TEXTS)


@st.composite
def training_command_lines(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(["estimate", "fit"]))
    argv = [command, draw(st.sampled_from(TRAIN_MODELS) | st.sampled_from(MODELS[:8])), "--mode", "train"]
    if command == "fit":
        argv += ["--gpu", draw(st.sampled_from(["H100-SXM-80GB:8", "RTX-4090", "A100-80GB:2"]))]
    options = _train_options(command)
    for action in draw(st.lists(st.sampled_from(options), min_size=1, max_size=8)):
        flag = draw(st.sampled_from(action.option_strings))
        if action.nargs == 0:
            argv.append(flag)
        else:
            argv += [flag, draw(_value(action))]
    return argv


@fuzz_settings(60)
@given(argv=training_command_lines())
def test_training_flags_exit_0_or_2_with_one_line(argv: list[str]) -> None:
    with passing_over_known_bugs():
        check_cli(argv)


# ---- the numbers: monotone in batch and sequence ----------------------------------------------------------

_SPECS: dict[str, Any] = {}


def _spec(model: str) -> Any:
    if model not in _SPECS:
        entry = find_model(model)
        assert entry is not None, model
        _SPECS[model] = entry.spec
    return _SPECS[model]


@st.composite
def training_runs(draw: st.DrawFn) -> dict[str, object]:
    """A training run from the run fields' own choices (valid, or refused as a whole, never malformed)."""
    method = draw(st.sampled_from(["full", "lora", "qlora"]))
    run: dict[str, object] = {
        "method": method,
        "precision": draw(st.sampled_from(["amp-bf16", "bf16", "fp32", "amp-fp16"])),
        "optimizer": draw(st.sampled_from(["adamw", "adamw-8bit", "sgd", "adafactor", "lion"])),
        "grad_ckpt": draw(st.booleans()),
        "batch": draw(st.integers(1, 4)),
        "seq": draw(st.sampled_from([1, 7, 128, 512, 1024, 2048])),
    }
    if draw(st.booleans()):
        run["dp"] = draw(st.sampled_from([2, 4, 8]))
        sharding = draw(st.sampled_from(["zero", "fsdp", "ddp"]))
        if sharding == "zero":
            run["zero"] = draw(st.integers(1, 3))
        elif sharding == "fsdp":
            run["fsdp"] = "full_shard"
    if draw(st.integers(0, 3)) == 0:
        run["tp"] = 2
    if draw(st.integers(0, 4)) == 0:
        run["pp"] = 2
    if draw(st.integers(0, 3)) == 0:
        run["framework"] = draw(
            st.sampled_from(["hf-trainer", "torchtune", "torchtitan", "deepspeed", "axolotl", "unsloth"])
        )
    if draw(st.integers(0, 3)) == 0:
        run["loss"] = draw(st.sampled_from(["standard", "chunked", "fused-linear"]))
    return run


def _peak(spec: Any, fields: dict[str, object]) -> int | str:
    """The peak, or the refusal's text."""
    try:
        return estimate_training(spec, make_training_run(**fields)).peak_bytes
    except GpumemInputError as e:
        return str(e)


@fuzz_settings(50)
@given(model=st.sampled_from(TRAIN_MODELS), fields=training_runs(), grow=st.sampled_from(["batch", "seq"]))
def test_training_memory_never_falls_as_batch_or_sequence_grows(
    model: str, fields: dict[str, object], grow: str
) -> None:
    spec = _spec(model)
    small = _peak(spec, fields)
    if isinstance(small, str):
        return  # refused as a whole (a method or layout this model does not take): the CLI tests that line
    bigger = {**fields, grow: int(fields[grow]) * 2}  # type: ignore[call-overload]
    large = _peak(spec, bigger)
    if isinstance(large, str):  # only a bound on the grown field itself (an encoder's positions) may refuse
        assert f"'{grow}'" in large, f"{model} {fields}: {grow} x2 refused for another reason: {large}"
        return
    assert large >= small, f"{model} {fields}: peak falls from {small:,} to {large:,} B as {grow} doubles"
