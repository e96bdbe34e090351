"""Bring your own config: every published training config under tests/data/imports (SOURCES.md names each
one's origin) parses to the run the forms would build, keys not modelled are named in warnings, and a
malformed file is one line naming the key (or the line and column a YAML/JSON/TOML parser gives)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumem_gui.core import GpumemInputError, import_file
from gpumem_gui.core.imports import file_parsers

DATA = Path(__file__).parent / "data" / "imports"


def _f(name: str) -> str:
    return str(DATA / name)


# ---------------------------------------------------------------------------------------------- files

FILES = {
    "torchtune_llama3_1_8B_lora_single_device.yaml": (
        "meta-llama/Llama-3.1-8B",
        {
            "framework": "torchtune",
            "method": "lora",
            "lora_rank": 8,
            "lora_alpha": 16.0,
            "batch": 2,
            "grad_accum": 8,
            "grad_ckpt": True,
            "activation_offload": False,
            "loss": "chunked",
            "precision": "bf16",
            "optimizer": "adamw-fused",
            "fsdp": "none",
            "lora_targets": ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        },
    ),
    "torchtune_llama3_1_8B_qlora_single_device.yaml": (
        "meta-llama/Llama-3.1-8B",
        {"framework": "torchtune", "method": "qlora", "lora_rank": 8},
    ),
    "torchtune_llama3_1_8B_full.yaml": (
        "meta-llama/Llama-3.1-8B",
        {
            "framework": "torchtune",
            "method": "full",
            "fsdp": "full_shard",
            "optimizer_in_backward": False,
            "dp": 4,
        },
    ),
    "torchtune_llama3_1_70B_full.yaml": (
        "meta-llama/Llama-3.1-70B-Instruct",
        {"framework": "torchtune", "offload": "optimizer+params", "fsdp": "full_shard", "dp": 8},
    ),
    "torchtitan_llama3_8b.toml": (
        "meta-llama/Llama-3.1-8B",
        {
            "framework": "torchtitan",
            "precision": "mp-bf16",
            "batch": 1,
            "seq": 8192,
            "grad_ckpt": True,
            "ckpt_policy": "selective-op",
            "fsdp": "full_shard",
            "optimizer": "adamw-fused",
        },
    ),
    "torchtitan_llama3_70b.toml": (
        "meta-llama/Llama-3.1-70B-Instruct",
        {"framework": "torchtitan", "tp": 8, "batch": 8, "sequence_parallel": True, "ckpt_policy": "full"},
    ),
    "axolotl_llama3_lora-8b.yml": (
        "NousResearch/Meta-Llama-3-8B",
        {
            "framework": "axolotl",
            "method": "qlora",
            "qlora_base": "int8",  # load_in_8bit: true
            "lora_rank": 32,
            "lora_targets": "all-linear",
            "batch": 2,
            "grad_accum": 4,
            "seq": 4096,
            "grad_ckpt": True,
            "precision": "bf16",
            "optimizer": "adamw-8bit",
            "attn": "flash",
        },
    ),
    # optimizer: paged_adamw_32bit (bnb AdamW, optim_bits 32, is_paged)
    "axolotl_llama3_qlora.yml": (
        "NousResearch/Meta-Llama-3-8B",
        {"method": "qlora", "optimizer": "paged-adamw-32bit"},
    ),
    "axolotl_llama3_fft-8b-liger-fsdp.yaml": (
        "NousResearch/Meta-Llama-3.1-8B",
        {"method": "full", "fsdp": "full_shard", "offload": "optimizer+params", "loss": "fused-linear"},
    ),
    "axolotl_llama3-8b-deepspeed-alst.yaml": (
        "meta-llama/Llama-3.1-8B",
        {"framework": "axolotl", "zero": 3, "cp": 8, "seq": 500000, "activation_offload": True},
    ),
    "llamafactory_qwen3_lora_sft.yaml": (
        "Qwen/Qwen3-4B-Instruct-2507",
        {
            "framework": "llama-factory",
            "method": "lora",
            "lora_rank": 8,
            "lora_alpha": 16.0,
            "lora_targets": "all-linear",
            "seq": 2048,
            "grad_accum": 8,
            "grad_ckpt": True,
            "precision": "amp-bf16",
        },
    ),
    "llamafactory_qwen3_lora_sft_otfq.yaml": (
        "Qwen/Qwen3-4B-Instruct-2507",
        {"method": "qlora", "qlora_base": "nf4-dq"},
    ),
    "llamafactory_qwen3_full_sft.yaml": (
        "Qwen/Qwen3-4B-Instruct-2507",
        {"framework": "llama-factory", "method": "full", "zero": 3, "grad_accum": 2},
    ),
    "deepspeed_llamafactory_ds_z3_offload_config.json": (
        None,
        {"framework": "deepspeed", "zero": 3, "offload": "optimizer+params", "offload_device": "cpu"},
    ),
    "deepspeed_llamafactory_ds_z2_config.json": (
        None,
        {"framework": "deepspeed", "zero": 2, "reduce_bucket": 500_000_000, "allgather_bucket": 500_000_000},
    ),
    "deepspeed_axolotl_zero3_bf16_cpuoffload_all.json": (
        None,
        {"zero": 3, "offload": "optimizer+params", "precision": "amp-bf16"},
    ),
    "deepspeed_accelerate_zero_stage3_offload_config.json": (
        None,
        {"zero": 3, "precision": "amp-fp16", "max_live_params": 1_000_000_000},
    ),
    "accelerate_fsdp.yaml": (
        None,
        {"dp": 2, "fsdp": "full_shard", "fsdp_version": 1, "precision": "mp-bf16"},
    ),
    "accelerate_llamafactory_fsdp2_config.yaml": (None, {"fsdp": "full_shard", "fsdp_version": 2}),
    "accelerate_multi_gpu.yaml": (None, {"dp": 2, "fsdp": "none", "precision": "amp-bf16"}),
    "accelerate_deepspeed.yaml": (None, {"framework": "deepspeed", "dp": 2, "zero": 1}),
    "hf_args_firefly_minicpm-2b-sft-full.json": (
        "openbmb/MiniCPM-2B-dpo-fp16",
        {
            "framework": "hf-trainer",
            "method": "full",
            "batch": 1,
            "grad_accum": 16,
            "seq": 1024,
            "grad_ckpt": True,
            "precision": "amp-fp16",
            "zero": 3,
            "optimizer": "adamw",
        },
    ),
    "hf_args_firefly_llama3-8b-sft-qlora.json": (
        "NousResearch/Meta-Llama-3-8B-Instruct",
        {"framework": "hf-trainer", "method": "lora", "lora_rank": 64},
    ),
    "trl_alignment-handbook_zephyr-7b-beta_sft_config_qlora.yaml": (
        "mistralai/Mistral-7B-v0.1",
        {
            "framework": "trl",
            "method": "qlora",
            "lora_rank": 16,
            "precision": "bf16",
            "batch": 4,
            "grad_accum": 2,
            "seq": 2048,
            "attn": "flash",
        },
    ),
}


def test_every_fixture_has_a_case_and_a_source() -> None:
    fixtures = {p.name for p in DATA.iterdir() if p.suffix in (".yaml", ".yml", ".json", ".toml")}
    fixtures.discard("commands.json")
    assert fixtures == set(FILES)
    sources = (DATA / "SOURCES.md").read_text(encoding="utf-8")
    for name in fixtures:
        assert name in sources, name


@pytest.mark.parametrize("name", sorted(FILES))
def test_published_configs(name: str) -> None:
    model, fields = FILES[name]
    imp = import_file(_f(name))
    assert imp.model == model
    assert imp.mode == "train"
    for field, value in fields.items():
        assert getattr(imp.run, field) == value, field
    assert imp.read_as


def test_unmodelled_keys_are_named() -> None:
    imp = import_file(_f("axolotl_llama3_lora-8b.yml"))
    text = " | ".join(imp.warnings)
    assert "load_in_8bit" not in text and "lora_modules_to_save" in text  # the 8-bit base is read
    imp = import_file(_f("axolotl_llama3_fft-8b-liger-fsdp.yaml"))
    assert any(w.startswith("liger_rope") for w in imp.warnings)


def test_unknown_key_becomes_a_warning(tmp_path: Path) -> None:
    p = tmp_path / "ds.json"
    p.write_text(
        '{"zero_optimization": {"stage": 2, "shiny_new_knob": 7}, "train_micro_batch_size_per_gpu": 4}'
    )
    imp = import_file(str(p))
    assert imp.run.zero == 2 and imp.run.batch == 4
    assert any("zero_optimization.shiny_new_knob: 7" in w for w in imp.warnings)


def test_trainer_sync_each_batch_is_read_as_grad_sync(tmp_path: Path) -> None:
    """accelerator_config.gradient_accumulation_kwargs.sync_each_batch (transformers AcceleratorConfig):
    a gradient sync on every micro-batch instead of the Trainer's no_sync; a file path is named, not read."""
    p = tmp_path / "args.json"
    base = '"per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "fsdp": "full_shard"'
    p.write_text(
        "{" + base + ', "accelerator_config": {"gradient_accumulation_kwargs": {"sync_each_batch": true}, '
        '"split_batches": true}}'
    )
    imp = import_file(str(p))
    assert imp.run.grad_sync == "each" and imp.run.framework == "hf-trainer" and imp.run.grad_accum == 8
    assert not any("split_batches" in w for w in imp.warnings)
    p.write_text("{" + base + ', "accelerator_config": "accel.json"}')
    imp = import_file(str(p))
    assert imp.run.grad_sync == "auto" and any(
        w.startswith("accelerator_config: 'accel.json'") for w in imp.warnings
    )


@pytest.mark.parametrize(
    ("name", "text", "start"),
    [
        (
            "ds.json",
            '{"zero_optimization": {"stage": 5}}',
            "key 'zero_optimization.stage': 5 is out of range",
        ),
        ("ds.json", '{"zero_optimization": {"stage": 1,}}', "line 1, column"),
        (
            "ax.yaml",
            "base_model: m\nmicro_batch_size: two\n",
            "key 'micro_batch_size': expected a whole number",
        ),
        ("ax.yaml", "base_model: m\nlora_r: [1\n", "line 3, column 1: not YAML"),
        (
            "tt.yaml",
            "model:\n  _component_: torchtune.models.llama3_1.llama3_1_8b\ndtype: fp8\n",
            "key 'dtype'",
        ),
        (
            "t.toml",
            "[model]\nname = 'llama3'\nflavor = '8B'\n[training]\nseq_len = -4\n",
            "key 'training.seq_len'",
        ),
        ("t.toml", "[model\n", "not TOML"),
        ("x.yaml", "- just\n- a list\n", "expected a mapping of settings"),
        ("x.yaml", "hello: world\n", "not a config gpumem reads"),
        ("lf.yaml", "model_name_or_path: m\nstage: sft\nper_device_train_batch_size: 0\n", "key 'per_device"),
    ],
)
def test_bad_files_name_the_key(tmp_path: Path, name: str, text: str, start: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(GpumemInputError) as e:
        import_file(str(p))
    message = str(e.value)
    assert message.startswith(f"{p}: {start}"), message
    assert "\n" not in message


def test_every_framework_has_a_parser() -> None:
    names = {p.name for p in file_parsers()}
    assert len(names) == 7
