"""bitsandbytes' paged AdamW, 8- and 32-bit (replay/optim.py): which states go to CUDA unified memory
(``Optimizer8bit.get_state_buffer``: ``state1`` / ``state2`` of parameters of 1e5 elements or more through
``F.get_paged``) and which stay in the torch allocator (smaller parameters' states, the 8-bit ``absmax``), at
the byte; the optimizer read from HF Trainer names and bitsandbytes classes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumem_gui.core import estimate_training, import_file, make_training_run
from gpumem_gui.core.readers.catalog import find_model
from gpumem_gui.core.replay.optim import paged_state_bytes, state_bytes_of
from gpumem_gui.core.training.command import HF_OPTIM


@pytest.mark.parametrize(
    ("opt", "numel", "paged", "total"),
    [
        ("paged-adamw-32bit", 99_999, 0, 8 * 99_999),  # under 1e5: torch.zeros_like
        ("paged-adamw-32bit", 100_000, 800_000, 800_000),  # F.get_paged, two fp32 states
        ("paged-adamw-8bit", 200_000, 400_000, 400_000 + 8 * 782),  # uint8 states paged, fp32 absmax not
        ("paged-adamw-8bit", 5_000, 0, 10_000 + 8 * 20),  # 8-bit (>= 4096) but under 1e5: not paged
        ("paged-adamw-8bit", 4_000, 0, 8 * 4_000),  # under min_8bit_size: fp32 states
        ("adamw-8bit", 200_000, 0, 400_000 + 8 * 782),  # not paged at all
    ],
)
def test_paged_split_per_parameter(opt: str, numel: int, paged: int, total: int) -> None:
    assert paged_state_bytes(opt, numel) == paged
    assert state_bytes_of(opt, numel, (numel,), "bf16") == total


def test_qlora_states_split_between_unified_memory_and_the_allocator() -> None:
    """Llama-3-8B QLoRA, all-linear r=16: only gate/up lora_B [14336, 16] and down lora_A [16, 14336]
    (229,376 elements) reach 1e5; every other adapter matrix (65,536 or 16,384) keeps its states in the torch
    allocator. 32-bit: 8 B per element either way."""
    spec = find_model("meta-llama/Meta-Llama-3-8B").spec
    run = make_training_run(method="qlora", optimizer="paged-adamw-32bit", grad_ckpt=True, seq=1024)
    est = estimate_training(spec, run)
    paged = 32 * 3 * 16 * 14336 * 8
    assert est.facts["paged_optimizer_state_bytes"] == paged
    in_torch = next(c.bytes for c in est.components if c.key == "optimizer_states")
    assert in_torch + paged == 8 * est.facts["trainable_params"]
    assert any("nvidia-smi" in w for w in est.warnings)
    eight = estimate_training(spec, run.model_copy(update={"optimizer": "paged-adamw-8bit"}))
    assert eight.facts["paged_optimizer_state_bytes"] == paged // 4  # uint8 instead of fp32


@pytest.mark.parametrize("name", ["paged_adamw_32bit", "paged_adamw"])
def test_hf_trainer_names_read_as_paged_32bit(name: str, tmp_path: Path) -> None:
    """transformers trainer_optimizer.py: is_paged = "paged" in optim, optim_bits = 8 if "8bit" else 32."""
    p = tmp_path / "args.json"
    p.write_text(json.dumps({"per_device_train_batch_size": 1, "optim": name}))
    assert import_file(str(p)).run.optimizer == "paged-adamw-32bit"
    assert HF_OPTIM["paged-adamw-32bit"] == "paged_adamw_32bit"
