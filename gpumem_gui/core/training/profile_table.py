"""The framework profiles as data: what each training framework does by default and which of the memory
tricks, losses, precisions and sharding setups it offers, each default with its source. :mod:`.profiles`
applies them to a run; :mod:`.run` reads a framework's own precision from here (this module imports no run).
"""

from __future__ import annotations

from dataclasses import dataclass

ALL_LOSSES = ("standard", "chunked", "fused-linear")
TRICKS = (
    "optimizer_in_backward",
    "activation_offload",
    "ckpt_every",
    "ckpt_policy",
    "float8",
    "compile",
)
LIGER_SOURCE = (
    "Liger LigerFusedLinearCrossEntropyFunction (liger_kernel/ops/fused_linear_cross_entropy.py), enabled "
    "by TrainingArguments(use_liger_kernel=True) (transformers/trainer.py _apply_liger_kernel)"
)


@dataclass(frozen=True)
class Profile:
    """One framework: ``loss`` is what ``loss = auto`` means (``loss_impl`` maps a chosen loss to the
    replay's implementation where the framework has its own), ``losses`` the ones it offers; ``tricks`` the
    trick fields it has; ``precisions`` / ``zero`` / ``fsdp`` what sharding and precision it runs (None:
    any); ``precision``: the one it trains in when the run names none (None: the run's default, which it
    offers); ``ckpt_offload``: checkpointed layer inputs live in CPU RAM whenever checkpointing is on."""

    name: str
    label: str
    loss: str
    loss_source: str
    losses: tuple[str, ...] = ALL_LOSSES
    loss_impl: tuple[tuple[str, str], ...] = ()
    tp_loss_impl: tuple[tuple[str, str], ...] = ()  # as loss_impl, with tensor parallelism (tp > 1)
    tricks: frozenset[str] = frozenset(TRICKS)
    precisions: tuple[str, ...] | None = None
    precision: str | None = None
    precision_source: str = ""
    zero: tuple[int, ...] = (0, 1, 2, 3)
    fsdp: bool = True
    fsdp_versions: tuple[int, ...] = (1, 2)
    ckpt_offload: bool = False
    ckpt_offload_source: str = ""
    notes: tuple[str, ...] = ()
    # grad_sync = auto: 'each' (gradients reduced every micro-batch) or 'last' (no_sync until the last one)
    grad_sync: str = "each"
    grad_sync_source: str = "a training loop calling backward() on every micro-batch without no_sync()"
    # chunks split unevenly, embedding / head as a layer each (torchtitan generate_llm_fqn_per_model_part)
    uneven_pp_split: bool = False
    # compile = on: the replay's losses (replay/loss.py) the framework then runs compiled (Inductor's fused
    # cross-entropy, replay/logits.py), with tensor parallelism (None: the same), and where it says so
    compiled_losses: tuple[str, ...] = ()
    compiled_losses_tp: tuple[str, ...] | None = None
    compiled_loss_source: str = ""
    # FSDP2 full_shard: the root unit (embeddings, final norm, head) resharded after forward and regathered
    # at the loss (fully_shard(model, reshard_after_forward=True) on torch >= 2.8); False: kept unsharded
    # from its forward all-gather to its post-backward
    fsdp2_root_reshard: bool = True
    fsdp2_root_reshard_source: str = ""
    # LoRA adapters in the model's dtype (the model built under a default dtype) instead of PEFT's fp32
    # (autocast_adapter_dtype); a precision that casts the model (DeepSpeed) or FSDP mixed precision decides
    # either way
    lora_model_dtype: bool = False
    lora_model_dtype_source: str = ""


_HF_CE = (
    "transformers loss/loss_utils.py ForCausalLMLoss: logits.float() then cross_entropy over the full "
    "logits (HF Trainer compute_loss calls the model's loss)"
)
# transformers trainer.py _inner_training_loop: every micro-batch but the last runs under
# accelerator.no_sync(model) unless sync_each_batch or DeepSpeed (accelerate/accelerator.py no_sync: FSDP1 and
# DDP model.no_sync(), FSDP2 set_requires_gradient_sync(False); GradientAccumulationPlugin.sync_each_batch
# defaults to False); transformers 5.24 / accelerate 1.16, and model.no_sync() in the Trainer before
# accelerate (transformers 4.28 trainer.py: TrainingArguments._no_sync_in_gradient_accumulation)
_TRAINER_SYNC = (
    "transformers trainer.py _inner_training_loop: accelerator.no_sync for every micro-batch "
    "but the last (FSDP1 no_sync(), FSDP2 set_requires_gradient_sync(False)); accelerate "
    "GradientAccumulationPlugin(sync_each_batch=False) by default"
)
_TRAINER_TRICKS = frozenset({"compile", "float8"})  # torch_compile=True; accelerate's torchao float8 recipe
# torch.compile(model) compiles the model's forward, and transformers computes the loss inside it
# (modeling_llama.py LlamaForCausalLM.forward: self.loss_function(logits, labels, ...))
_MODEL_LOSS = "the loss is part of the compiled forward (LlamaForCausalLM.forward calls self.loss_function)"
_TRAINER_COMPILE = (
    "TrainingArguments(torch_compile=True): accelerate Accelerator.prepare_model torch.compile(model); "
    + _MODEL_LOSS
)

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "pytorch",
            "plain PyTorch",
            "standard",
            _HF_CE + "; a plain training loop calling model(input_ids, labels=...)",
            compiled_losses=("standard",),
            compiled_loss_source="torch.compile(model); " + _MODEL_LOSS,
        ),
        Profile(
            "hf-trainer",
            "Hugging Face Trainer",
            "standard",
            _HF_CE,
            grad_sync="last",
            grad_sync_source=_TRAINER_SYNC,
            losses=("standard", "fused-linear"),
            tricks=_TRAINER_TRICKS,
            notes=("loss fused-linear: " + LIGER_SOURCE,),
            compiled_losses=("standard",),
            compiled_loss_source=_TRAINER_COMPILE,
        ),
        Profile(
            "trl",
            "TRL SFTTrainer",
            "standard",
            _HF_CE + "; trl/trainer/sft_trainer.py compute_loss",
            grad_sync="last",
            grad_sync_source=_TRAINER_SYNC,
            losses=("standard", "fused-linear"),
            tricks=_TRAINER_TRICKS | {"activation_offload"},
            notes=(
                "loss fused-linear: SFTConfig(use_liger_kernel=True): " + LIGER_SOURCE,
                "activation_offload: SFTConfig(activation_offloading=True), "
                "trl/models/activation_offloading.py "
                "(torchtune's OffloadActivations)",
            ),
            compiled_losses=("standard",),
            compiled_loss_source=_TRAINER_COMPILE,
        ),
        Profile(
            "axolotl",
            "Axolotl",
            "standard",
            _HF_CE + " (axolotl trains through the HF Trainer)",
            grad_sync="last",
            grad_sync_source=_TRAINER_SYNC,
            loss_impl=(("chunked", "chunked-trainer"),),
            tricks=_TRAINER_TRICKS | {"activation_offload"},
            notes=(
                "loss fused-linear: Liger (liger_fused_linear_cross_entropy); chunked: chunked_cross_entropy",
            ),
            compiled_losses=("standard",),
            compiled_loss_source=_TRAINER_COMPILE,
        ),
        Profile(
            "llama-factory",
            "LLaMA-Factory",
            "standard",
            _HF_CE + " (LLaMA-Factory trains through the HF Trainer)",
            grad_sync="last",
            grad_sync_source=_TRAINER_SYNC,
            losses=("standard", "fused-linear"),
            tricks=_TRAINER_TRICKS,
            notes=(
                "loss fused-linear: enable_liger_kernel: true "
                "(llamafactory/model/model_utils/liger_kernel.py)",
            ),
            compiled_losses=("standard",),
            compiled_loss_source=_TRAINER_COMPILE,
        ),
        Profile(
            "torchtune",
            "torchtune",
            "chunked",
            "torchtune recipes/configs/*/*.yaml loss: torchtune.modules.loss.LinearCrossEntropyLoss "
            "(num_output_chunks=8; 162 of the 172 configs naming a loss, torchtune bd2a0fc), "
            "torchtune/modules/loss/cross_entropy_loss.py",
            # chunked-output: the replay's CEWithChunkedOutputLoss (replay/loss.py chunked, torchtune v0.3 to
            # v0.5); fp32-shift: v0.1 / v0.2's fp32 logits and shifted copy (replay/loss.py fp32_shift)
            loss_impl=(("chunked", "chunked-linear"), ("chunked-output", "chunked")),
            losses=(*ALL_LOSSES, "chunked-output", "fp32-shift"),
            tricks=frozenset(TRICKS) - {"ckpt_every", "ckpt_policy", "float8"},
            zero=(0,),
            # FSDP1 (FullyShardedDataParallel, ModuleWrapPolicy({TransformerDecoderLayer}), FULL_SHARD,
            # mixed_precision None) in the distributed recipes up to v0.2
            # (recipes/full_finetune_distributed.py of torchtune 4c19547); fully_shard (FSDP2) since
            fsdp_versions=(2, 1),
            grad_sync_source="torchtune recipes/full_finetune_distributed.py train: current_loss.backward() "
            "on every micro-batch, no set_requires_gradient_sync (torchtune 015b39c)",
            notes=(
                "optimizer_in_backward: recipe optimizer_in_bwd (torchtune/training/memory.py "
                "register_optim_in_bwd_hooks), off in the distributed configs, on in most single-device ones",
                "activation_offload: enable_activation_offloading "
                "(torchtune/training/_activation_offloading.py)",
                "FSDP: fully_shard (FSDP2) in every distributed recipe since v0.3; FullyShardedDataParallel "
                "(FSDP1) up to v0.2 (--fsdp-version 1)",
            ),
            # recipes: training.compile_loss(self._loss_fn) when compile (torchtune/training/_compile.py):
            # apply_compile_strategy compiles compute_cross_entropy of CEWithChunkedOutputLoss and of
            # LinearCrossEntropyLoss in place (the latter not with tensor parallelism and masked tokens, its
            # default); any other loss module is returned as torch.compile(loss), which every recipe but
            # lora_finetune_single_device discards (full_finetune_single_device.py and
            # full_finetune_distributed.py call compile_loss without assigning it, torchtune bd2a0fc and
            # 1814feb17): left eager here
            compiled_losses=("chunked", "chunked-linear"),
            compiled_losses_tp=("chunked",),
            compiled_loss_source="torchtune training.compile_loss (torchtune/training/_compile.py): "
            "compute_cross_entropy of CEWithChunkedOutputLoss / LinearCrossEntropyLoss compiled per chunk "
            "(modules/loss/ce_chunked_output_loss.py, cross_entropy_loss.py apply_compile_strategy)",
            fsdp2_root_reshard=False,
            fsdp2_root_reshard_source="torchtune training.shard_model (torchtune/training/_distributed.py): "
            "the root fully_shard(model) with reshard_after_forward=False since torchtune cdde80e74 "
            "(2025-06-06); before, the layers' reshard_after_forward=True reached the root too, and torch up "
            "to 2.7 kept a root unsharded after forward whatever it was given (torch/distributed/fsdp/"
            "_fully_shard/_fsdp_state.py FSDPState._lazy_init: post_forward_mesh_info = None; changed by "
            "pytorch/pytorch #154704, #155319)",
            lora_model_dtype=True,
            lora_model_dtype_source="torchtune recipes build the model under "
            "training.set_default_dtype(dtype) (recipes/lora_finetune_single_device.py, "
            "lora_finetune_distributed.py _setup_model, torchtune 30b8519e8 and bd2a0fc), so LoRALinear's "
            "lora_a / lora_b nn.Linear are made in it "
            "(torchtune/modules/peft/lora.py LoRALinear.__init__)",
        ),
        Profile(
            "torchtitan",
            "torchtitan",
            "standard",
            "torchtitan/components/loss.py cross_entropy_loss: pred.float() then cross_entropy over the full "
            "logits",
            losses=("standard",),
            # under TP the loss runs in torch's loss_parallel() (train.py loss_parallel_enabled, on unless
            # --parallelism.disable_loss_parallel; the head keeps its vocabulary shard, model_parallel.py)
            tp_loss_impl=(("standard", "loss-parallel"),),
            tricks=frozenset({"ckpt_every", "ckpt_policy", "float8", "compile"}),
            precisions=("mp-bf16", "amp-bf16", "fp32", "bf16"),
            zero=(0,),
            fsdp_versions=(2,),
            uneven_pp_split=True,
            grad_sync_source="torchtitan/train.py train_step: forward_backward_step (loss.backward()) on "
            "every micro-batch, no set_requires_gradient_sync (torchtitan 000204a)",
            notes=(
                "FSDP2 fully_shard with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) "
                "(torchtitan/distributed/utils.py, parallelize.py apply_fsdp): precision mp-bf16",
                "ckpt_every: activation_checkpoint selective_ac_option = N (layer SAC, torchtitan before "
                "114151ad); ckpt_policy selective-op: op SAC",
            ),
            # torchtitan/components/loss.py build_cross_entropy_loss: torch.compile(loss_fn) with compile on
            # (since bbb1b616e, 2025-04; before, "compiling loss function causes CUDA errors" kept it eager);
            # [compile] components defaults to ["model", "loss"] (torchtitan/config/configs.py CompileConfig).
            # Under loss_parallel() the DTensor loss is left eager here
            compiled_losses=("standard",),
            compiled_loss_source="torchtitan components/loss.py: cross_entropy_loss under torch.compile "
            "([compile] components model + loss, CompileConfig)",
        ),
        Profile(
            "deepspeed",
            "DeepSpeed",
            "standard",
            _HF_CE + " (the model's own loss under the DeepSpeed engine)",
            losses=("standard", "fused-linear"),
            tricks=frozenset({"compile"}),
            fsdp=False,
        ),
        Profile(
            "megatron",
            "Megatron-LM",
            "standard",
            "megatron/core/tensor_parallel/cross_entropy.py VocabParallelCrossEntropy: an fp32 copy of the "
            "(vocabulary-shard) logits, softmax in place and saved, gradient in place",
            losses=("standard",),
            loss_impl=(("standard", "vocab-parallel"),),
            tricks=frozenset(),
            precisions=("megatron-bf16", "fp32"),
            # Megatron-LM's example training scripts (examples/) pass --bf16: bf16 weights with fp32 main
            # grads (megatron/training/arguments.py validate_args: --bf16 turns on
            # accumulate_allreduce_grads_in_fp32)
            precision="megatron-bf16",
            precision_source="--bf16 (megatron/training/arguments.py), as Megatron-LM's examples/ pass it",
            zero=(0, 1),
            fsdp=False,
            notes=(
                "ZeRO-1 = --use-distributed-optimizer (megatron/core/optimizer/distrib_optimizer.py)",
                "sequence_parallel: --sequence-parallel (recommended with TP; set it on the run)",
            ),
        ),
        Profile(
            "unsloth",
            "unsloth",
            "fused-linear",
            "unsloth's fused cross-entropy (unsloth_zoo fused_ce / fast_cross_entropy_loss), modelled as "
            "Liger's fused linear cross-entropy (liger_kernel/ops/fused_linear_cross_entropy.py)",
            grad_sync="last",
            grad_sync_source=_TRAINER_SYNC,
            losses=("standard", "fused-linear"),
            tricks=frozenset({"compile"}),
            zero=(0,),
            fsdp=False,
            ckpt_offload=True,
            ckpt_offload_source="unsloth use_gradient_checkpointing='unsloth' "
            "(FastLanguageModel.get_peft_model default; unsloth_zoo gradient_checkpointing.py "
            "Unsloth_Offloaded_Gradient_Checkpointer: the layer "
            "input to CPU in forward, back for the recomputation)",
        ),
    )
}
