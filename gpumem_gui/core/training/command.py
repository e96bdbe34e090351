"""The launch configuration a training run corresponds to: the Hugging Face ``TrainingArguments`` (with the
PEFT / bitsandbytes configs of LoRA and QLoRA), the framework's own part from its module
(:meth:`~gpumem_gui.core.training.frameworks.base.Framework.trainer_args`), and the model load call."""

from __future__ import annotations

from gpumem_gui.core.replay.adapters import REGEX
from gpumem_gui.core.training.frameworks import framework
from gpumem_gui.core.training.run import TrainingRun

# gpumem optimizer -> TrainingArguments.optim (transformers training_args.py OptimizerNames)
HF_OPTIM = {
    "adamw": "adamw_torch",
    "adamw-fused": "adamw_torch_fused",
    "adamw-foreach": "adamw_torch",
    "adamw-for-loop": "adamw_torch",
    "adamw-8bit": "adamw_bnb_8bit",
    "paged-adamw-8bit": "paged_adamw_8bit",
    "paged-adamw-32bit": "paged_adamw_32bit",
    "adafactor": "adafactor",
    "sgd": "sgd",
    "sgd-momentum": "sgd",
    "lion": "lion_32bit",
}
# precision -> the TrainingArguments flag that turns autocast on (the pure-dtype precisions set none)
_AMP_FLAGS = {"amp-bf16": "bf16=True", "amp-fp16": "fp16=True"}


def _adapter_configs(run: TrainingRun) -> list[str]:
    lines = []
    if run.method == "qlora" and run.qlora_base == "int8":
        lines.append("BitsAndBytesConfig(load_in_8bit=True)  # LLM.int8, llm_int8_threshold=6.0")
    elif run.method == "qlora":
        lines.append(
            "BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', "
            f"bnb_4bit_use_double_quant={run.qlora_base == 'nf4-dq'}, bnb_4bit_compute_dtype=torch.bfloat16)"
        )
    if run.method != "full":
        targets: object = run.lora_targets if isinstance(run.lora_targets, str) else list(run.lora_targets)
        if isinstance(targets, list) and len(targets) == 1 and targets[0].startswith(REGEX):
            targets = targets[0][len(REGEX) :]  # PEFT: a regex is target_modules as one string
        lines.append(
            f"LoraConfig(r={run.lora_rank}, lora_alpha={run.lora_alpha:g}, "
            f"lora_dropout={run.lora_dropout:g}, "
            f"target_modules={targets!r})"
        )
    return lines


def training_command(model: str, run: TrainingRun) -> str:
    """The ``TrainingArguments`` (and PEFT / bitsandbytes configs) of this run, and the load call."""
    args = [
        f"per_device_train_batch_size={run.batch}",
        f"gradient_accumulation_steps={run.grad_accum}",
        f"gradient_checkpointing={run.grad_ckpt}",
        f"optim={HF_OPTIM.get(run.optimizer, run.optimizer)!r}",
    ]
    if run.precision in _AMP_FLAGS:
        args.append(_AMP_FLAGS[run.precision])
    if run.optimizer == "sgd-momentum":
        args.append("optim_args='momentum=0.9'")
    args += framework(run).trainer_args(run)
    if run.grad_sync == "each" and run.grad_accum > 1 and run.dp > 1:
        # transformers AcceleratorConfig -> accelerate GradientAccumulationPlugin(sync_each_batch=True)
        args.append("accelerator_config={'gradient_accumulation_kwargs': {'sync_each_batch': True}}")
    lines = [*_adapter_configs(run), "TrainingArguments(" + ", ".join(args) + ")"]
    lines.append(
        f"model = AutoModelForCausalLM.from_pretrained({model!r}, attn_implementation={run.attn!r})"
        f"  # seq {run.seq} tokens; {run.world} GPU(s): dp {run.dp} x tp {run.tp} x pp {run.pp} x cp {run.cp}"
    )
    return "\n".join(lines)
