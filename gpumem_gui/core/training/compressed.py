"""What a fine-tuning run of DeepSeek-V4 (:attr:`ModelSpec.deepseek_v4`: compressed attention) can be.

The step replays DeepSeek-V4's forward (:mod:`gpumem_gui.core.replay.dsv4`) for full fine-tuning and for
LoRA as PEFT 0.21 resolves the targets on transformers 5.24: ``all-linear`` and module names adapt the
``nn.Linear`` modules (the compressors' and the indexer's projections and the shared expert's included);
the router is no ``nn.Linear`` and DeepSeek-V4 is not among the types PEFT converts onto the fused expert
stacks (``peft/utils/transformers_weight_conversion.py`` ``_MOE_TARGET_MODULE_MAPPING``), so the routed
experts stay frozen. Measured: tests/reference/extra/deepseek_v4_trace.json and deepseek_v4_lora_storage.json.
What it does not model, and what PEFT cannot run, is refused here in one line naming the field.
"""

from __future__ import annotations

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.replay.model import lora_weights
from gpumem_gui.core.spec.compressed import GROUPED_LINEAR, INDEXER, NOT_REPLAYED
from gpumem_gui.core.spec.kinds import CompressedAttention
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training.run import TrainingRun


def check_compressed_training(spec: ModelSpec, run: TrainingRun, targets: tuple[str, ...]) -> None:
    """Refuse, in one line naming the field, what DeepSeek-V4's step does not model or PEFT cannot run
    (``targets``: the run's LoRA targets as PEFT takes them)."""
    if not model_kinds(spec).of(CompressedAttention):
        return
    unsupported = {
        "method": run.method == "qlora",
        "tp": run.tp > 1,
        "pp": run.pp > 1,
        "cp": run.cp > 1,
        "compile": run.compile,
        "float8": run.float8,
    }
    for field, bad in unsupported.items():
        if bad:
            raise GpumemInputError(f"training: {NOT_REPLAYED} ({field} {getattr(run, field)})", field=field)
    if run.method == "full":
        return
    v4 = spec.deepseek_v4
    assert v4 is not None
    chosen = lora_weights(spec, targets, run.lora_vision_tower)
    if all(f".{INDEXER}." in name for name in chosen):
        raise GpumemInputError(
            "LoRA on DeepSeek-V4's indexer alone trains nothing: its integer top-k passes no gradient, so "
            "loss.backward() fails (measured: gpumem trace); name linears outside compressor.indexer too",
            field="lora_targets",
        )
    if not any(name.endswith(f".{GROUPED_LINEAR}.weight") for name in chosen):
        return
    if v4.o_groups == 1:
        why = "with one group is not modelled"
    else:
        # peft 0.21 tuners/lora/model.py dispatch_default wraps any nn.Linear (isinstance) in lora.Linear,
        # whose forward adds lora_B(lora_A(x)) ([..., groups, groups x o_lora_rank]) to the grouped output
        # ([..., groups, o_lora_rank]): measured, the first forward fails to broadcast (gpumem trace)
        why = (
            f"fails in PEFT 0.21: it wraps that nn.Linear subclass as a plain Linear, whose adapter adds "
            f"{v4.o_groups * v4.o_lora_rank} outputs per group to the {v4.o_lora_rank} of each of the "
            f"{v4.o_groups} groups"
        )
    raise GpumemInputError(
        f"LoRA on DeepSeek-V4's grouped {GROUPED_LINEAR} (all-linear includes it) {why}; name the other "
        "linears (q_a_proj, q_b_proj, kv_proj, o_b_proj, gate_proj, up_proj, down_proj, weights_proj)",
        field="lora_targets",
    )
