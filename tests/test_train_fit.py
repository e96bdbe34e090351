"""Training fit: verdicts, maxima (galloping search) and ranked changes; the CLI's --mode train."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.cli import main
from gpumem_gui.core.fit import GpuTarget
from gpumem_gui.core.fit.training import fit_training
from gpumem_gui.core.monotone import gallop
from gpumem_gui.core.readers.catalog import find_gpu
from gpumem_gui.core.readers.hf_config import load_config_file
from gpumem_gui.core.training import make_training_run
from tests.conftest import reference_dir

SPEC = load_config_file(reference_dir() / "configs" / "meta-llama__Llama-3.2-1B.json")


def target(name: str, count: int = 1) -> GpuTarget:
    g = find_gpu(name)
    return GpuTarget(name=g.id, capacity_bytes=g.memory_bytes, count=count)


@pytest.mark.parametrize("start", [1, 5, 40, 99, 100, 1000])
def test_gallop_finds_the_edge_from_anywhere(start: int) -> None:
    calls: list[int] = []

    def pred(n: int) -> bool:
        calls.append(n)
        return n <= 77

    assert gallop(pred, start, 1, 1 << 14) == 77
    assert len(calls) < 32
    assert gallop(lambda n: False, start, 1, 100) is None
    assert gallop(lambda n: True, start, 1, 100) == 100


def test_full_fine_tune_on_a_small_card_gets_working_changes() -> None:
    run = make_training_run(seq=512)
    rep = fit_training(SPEC, run, target("T4"))
    assert not rep.fits
    fitting = [c for c in rep.changes if c.fits]
    assert fitting and {c.kind for c in fitting} & {"method", "recipe"}
    for c in fitting:
        upd = {**run.model_dump(), **c.update}
        r = make_training_run(**upd)
        n = max(1, r.dp * r.tp * r.pp * r.cp)
        assert fit_training(SPEC, r, target("T4", n)).fits, c.description


def test_maxima_are_the_edge() -> None:
    run = make_training_run(method="lora", seq=1024, grad_ckpt=True)
    t = target("T4")
    rep = fit_training(SPEC, run, t)
    assert rep.fits and rep.max_batch is not None and rep.max_context is not None
    assert fit_training(SPEC, run.model_copy(update={"batch": rep.max_batch}), t).fits
    assert not fit_training(SPEC, run.model_copy(update={"batch": rep.max_batch + 1}), t).fits


def test_cli_train_estimate_fit_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["estimate", "Llama-3.2-1B", "--mode", "train", "--seq", "512", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["mode"] == "train"
    assert set(doc["phases"]) == {"forward", "backward", "optimizer"}
    assert doc["per_rank"] == doc["per_gpu"] and doc["cpu_bytes"] == 0
    assert doc["run"]["method"] == "full"
    rc = main(
        [
            "fit",
            "Llama-3.2-1B",
            "--mode",
            "train",
            "--method",
            "qlora",
            "--grad-ckpt",
            "--gpu",
            "T4",
            "--json",
        ]
    )
    fit = json.loads(capsys.readouterr().out)
    assert rc == 0 and fit["fits"]
    rc = main(["estimate", "Llama-3.2-1B", "--mode", "train", "--lora-rank", "0", "--method", "lora"])
    err = capsys.readouterr().err
    assert rc == 2 and "lora_rank" in err
    # int8 (LLM.int8) is a QLoRA base since issue 33; a GPTQ checkpoint is not a bitsandbytes base
    rc = main(["estimate", "Llama-3.2-1B", "--mode", "train", "--method", "qlora", "--qlora-base", "gptq-4"])
    err = capsys.readouterr().err
    assert rc == 2 and "qlora_base" in err and err.count("\n") == 1


def test_training_command_names_each_framework() -> None:
    """Each framework module writes its own part of the launch configuration."""
    from gpumem_gui.core import training_command

    ds = training_command(
        "m", make_training_run(zero=3, dp=8, offload="optimizer+params", precision="amp-bf16")
    )
    assert "deepspeed='ds_zero3.json'" in ds and "offload_optimizer+param=cpu" in ds and "bf16=True" in ds
    fsdp = training_command("m", make_training_run(fsdp="full_shard", dp=8))
    assert "fsdp='full_shard'" in fsdp and "deepspeed" not in fsdp
    plain = training_command("m", make_training_run(method="qlora", qlora_base="nf4-dq", precision="bf16"))
    assert "bnb_4bit_use_double_quant=True" in plain and "LoraConfig(r=16" in plain and "fsdp" not in plain
