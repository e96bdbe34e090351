"""Framework profiles: what each training framework does by default and which of the memory tricks and
sharding setups it offers, each default with its source; :func:`resolve` turns a run into the
:class:`ResolvedTricks` the replay takes, so nothing else branches on a framework's name.

A profile's defaults apply where the run leaves the choice to the framework (``loss = auto``) or where the
framework does something the run has no field for (unsloth's offloaded gradient checkpointing); the
applied ones come back as :attr:`ResolvedTricks.applied`, one line each, for the estimate to show. The
other trick fields are the user's (their defaults are off, as in every framework's default config).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.training.profile_table import ALL_LOSSES, LIGER_SOURCE, PROFILES, TRICKS, Profile
from gpumem_gui.core.training.run import TrainingRun

# the replay's losses (replay/loss.py LOSSES) that split the tokens into loss_chunks pieces
CHUNKED_LOSSES = ("chunked", "chunked-linear", "chunked-trainer")
# the replay's losses with a compiled form (replay/logits.py compiled_cross_entropy; chunked-trainer is
# compiled always)
COMPILED_LOSSES = ("standard", "chunked", "chunked-linear")
__all__ = [
    "ALL_LOSSES",
    "CHUNKED_LOSSES",
    "COMPILED_LOSSES",
    "PROFILES",
    "TRICKS",
    "Profile",
    "ResolvedTricks",
    "check",
    "fsdp2_units",
    "holds_unsynced_gradients",
    "profile",
    "resolve",
    "unsynced_accumulation",
]


@dataclass(frozen=True)
class ResolvedTricks:
    """What the replay runs for a run: the loss implementation (replay/loss.py LOSSES, or standard), the
    tricks, and the framework defaults that were applied (one line each, with the source)."""

    framework: str
    loss: str
    loss_chunks: int
    optimizer_in_backward: bool
    activation_offload: bool
    ckpt_offload: bool
    ckpt_every: int
    ckpt_policy: str
    float8: bool
    compile: bool
    compile_loss: bool  # compile on and the framework compiles this loss (Profile.compiled_losses)
    applied: tuple[str, ...]
    lora_model_dtype: bool = False  # LoRA adapters built in the model's dtype (Profile.lora_model_dtype)
    fsdp_units: str = "layers"  # the modules FSDP2 shards apart (fsdp2_units)


def profile(run: TrainingRun) -> Profile:
    return PROFILES[run.framework]


def resolve(run: TrainingRun) -> ResolvedTricks:
    """The framework's defaults applied to ``run`` (after :func:`check` accepted it)."""
    p = profile(run)
    applied = []
    chosen = run.loss
    if chosen == "auto":
        chosen = p.loss
        applied.append(f"framework default ({p.name}): loss = {p.loss} ({p.loss_source})")
    impl = dict(p.loss_impl).get(chosen, chosen)
    if run.tp > 1:
        impl = dict(p.tp_loss_impl).get(impl, impl)
    ckpt_offload = p.ckpt_offload and run.grad_ckpt and not run.activation_offload
    if ckpt_offload:
        applied.append(
            f"framework default ({p.name}): checkpointed layer inputs in CPU RAM ({p.ckpt_offload_source})"
        )
    if run.grad_sync == "auto" and unsynced_accumulation(run):
        applied.append(
            f"framework default ({p.name}): gradients reduced on the last micro-batch only "
            f"({p.grad_sync_source})"
        )
    compiled = p.compiled_losses if run.tp == 1 or p.compiled_losses_tp is None else p.compiled_losses_tp
    chosen_compile = impl in compiled if run.compile_loss == "auto" else run.compile_loss == "on"
    compile_loss = run.compile and chosen_compile and impl in COMPILED_LOSSES
    if compile_loss and run.compile_loss == "auto":
        applied.append(
            f"framework default ({p.name}): with compile, the loss compiled too ({p.compiled_loss_source})"
        )
    return ResolvedTricks(
        framework=p.name,
        loss=impl,
        loss_chunks=run.loss_chunks,
        optimizer_in_backward=run.optimizer_in_backward,
        activation_offload=run.activation_offload,
        ckpt_offload=ckpt_offload,
        ckpt_every=run.ckpt_every if run.grad_ckpt else 1,
        ckpt_policy=run.ckpt_policy if run.grad_ckpt else "full",
        float8=run.float8,
        compile=run.compile,
        compile_loss=compile_loss,
        applied=tuple(applied),
        lora_model_dtype=p.lora_model_dtype and run.method != "full",
        fsdp_units=fsdp2_units(run),
    )


def fsdp2_units(run: TrainingRun) -> str:
    """The modules FSDP2 makes units (run_fsdp.py FsdpUnits): the run's; "layers" for ``auto`` and without
    FSDP2. ``auto`` is the layers under every framework: torchtune's recipes read
    ``cfg.get("custom_sharded_layers", None)`` (full_finetune_distributed.py ``_setup_model``, torchtune
    bd2a0fc), so only a config that names modules shards them apart. Its Llama 3 / 3.1 / 3.3 full configs set
    ['tok_embeddings', 'output'] (llama3_1/70B_full.yaml; since afd23fd0b, 2024-08): ``embedding+head``; the
    other full configs and the LoRA configs set none (llama4/scout_17B_16E_lora.yaml: ['tok_embeddings']). A
    default by model family would be a name test; the recipe's default is the higher estimate."""
    if run.fsdp == "none" or run.fsdp_version != 2 or run.fsdp_units == "auto":
        return "layers"
    return run.fsdp_units


def unsynced_accumulation(run: TrainingRun) -> bool:
    """Gradients accumulate without a data-parallel sync until the last micro-batch (FSDP1 and DDP
    ``no_sync()``, FSDP2 ``set_requires_gradient_sync(False)``): ``grad_sync`` (or the framework's default)
    is 'last' and there is something to accumulate over more than one data-parallel rank (accelerate/
    accelerator.py no_sync: FSDP1's and DDP's only when use_distributed, num_processes > 1). Pipelining
    defers the sync on its own (frameworks/fsdp.py); ZeRO does not take it (:func:`_check_tricks`)."""
    chosen = profile(run).grad_sync if run.grad_sync == "auto" else run.grad_sync
    return chosen == "last" and run.grad_accum > 1 and run.dp > 1 and run.pp == 1 and not run.zero


def holds_unsynced_gradients(run: TrainingRun) -> bool:
    """:func:`unsynced_accumulation` where it costs memory: FSDP keeps every unit's unsharded gradients
    instead of their shards; DDP with ``gradient_as_bucket_view`` keeps each ``.grad`` beside its bucket
    (zero_grad set it to None; only the sync points it back at its bucket view: reducer.cpp
    mark_variable_ready_dense). DDP's own buckets are a second copy either way (training/buckets.py)."""
    return unsynced_accumulation(run) and (run.fsdp != "none" or run.bucket_view)


def _off(run: TrainingRun, field: str) -> bool:
    default = TrainingRun.model_fields[field].default
    return getattr(run, field) == default


def check(run: TrainingRun) -> list[str]:
    """Refuse what the framework does not offer (one line naming the field); return soft notes."""
    p = profile(run)
    chosen = p.loss if run.loss == "auto" else run.loss
    if chosen not in p.losses:
        raise GpumemInputError(
            f"loss {chosen!r} is not available with framework {p.name!r} (use one of: auto, "
            f"{', '.join(p.losses)})",
            field="loss",
        )
    for name in TRICKS:
        if name not in p.tricks and not _off(run, name):
            raise GpumemInputError(
                f"{name} is not available with framework {p.name!r} (it offers: "
                f"{', '.join(sorted(p.tricks)) or 'none of the tricks'})",
                field=name,
            )
    if p.precisions is not None and run.precision not in p.precisions:
        raise GpumemInputError(
            f"framework {p.name!r} trains in {', '.join(p.precisions)}, not {run.precision!r}",
            field="precision",
        )
    if run.zero not in p.zero:
        raise GpumemInputError(
            f"ZeRO stage {run.zero} is not available with framework {p.name!r} (allowed: "
            f"{', '.join(map(str, p.zero))})",
            field="zero",
        )
    if run.fsdp != "none" and not p.fsdp:
        raise GpumemInputError(f"framework {p.name!r} does not run FSDP", field="fsdp")
    if run.fsdp != "none" and run.fsdp_version not in p.fsdp_versions:
        raise GpumemInputError(
            f"framework {p.name!r} runs FSDP version {', '.join(map(str, p.fsdp_versions))} only",
            field="fsdp_version",
        )
    if run.fsdp_units not in ("auto", "layers") and (run.fsdp == "none" or run.fsdp_version != 2):
        raise GpumemInputError(
            "fsdp_units shards modules apart with FSDP2's fully_shard: it needs fsdp and fsdp_version 2",
            field="fsdp_units",
        )
    _check_tricks(run)
    impl = resolve(run).loss
    if run.compile and run.compile_loss == "on" and impl not in COMPILED_LOSSES:
        raise GpumemInputError(
            f"compile_loss 'on': the loss {impl!r} has no compiled form here (compiled: "
            f"{', '.join(COMPILED_LOSSES)}; chunked-trainer is compiled always)",
            field="compile_loss",
        )
    return []


def _check_tricks(run: TrainingRun) -> None:
    """Cross-field limits of the tricks themselves, whatever the framework."""
    if run.optimizer_in_backward:
        if run.grad_accum > 1:
            raise GpumemInputError(
                "optimizer_in_backward steps each parameter as its gradient arrives, so there is nothing to "
                "accumulate: grad_accum must be 1 (torchtune refuses gradient_accumulation_steps > 1)",
                field="optimizer_in_backward",
            )
        if run.zero or run.offload != "none":
            raise GpumemInputError(
                "optimizer_in_backward runs torch optimizers per parameter: not with ZeRO or offloaded "
                "states",
                field="optimizer_in_backward",
            )
        if run.precision == "megatron-bf16":
            raise GpumemInputError(
                "optimizer_in_backward is not available with Megatron's optimizer",
                field="optimizer_in_backward",
            )
    if run.grad_sync == "last" and run.zero:
        # transformers trainer.py _inner_training_loop never enters no_sync under DeepSpeed
        raise GpumemInputError(
            "grad_sync 'last' is FSDP's / DDP's no_sync(): DeepSpeed ZeRO accumulates gradients its own way "
            "(use grad_sync auto or each)",
            field="grad_sync",
        )
    if not run.grad_ckpt and (run.ckpt_every != 1 or run.ckpt_policy != "full"):
        field = "ckpt_every" if run.ckpt_every != 1 else "ckpt_policy"
        raise GpumemInputError(f"{field} needs gradient checkpointing (grad_ckpt)", field=field)


def facts(run: TrainingRun) -> dict[str, str]:
    """The framework and the defaults it applied, for the estimate's facts."""
    r = resolve(run)
    return {"framework": r.framework, "framework_defaults": "; ".join(r.applied) or "none"}


def trick_fields(run: TrainingRun) -> dict[str, object]:
    """The replay's trick fields (:class:`~gpumem_gui.core.replay.config.ReplayConfig`) for ``run``."""
    r = resolve(run)
    return {
        "loss": r.loss,
        "loss_chunks": r.loss_chunks,
        "ckpt_every": r.ckpt_every,
        "ckpt_policy": r.ckpt_policy,
        "activation_offload": r.activation_offload,
        "offload_ckpt_inputs": r.ckpt_offload,
        "float8": r.float8,
        "compile": r.compile,
        "compile_loss": r.compile_loss,
    }


def profile_facts(run: TrainingRun, host_bytes: int) -> dict[str, str | int]:
    """:func:`facts` and the CPU RAM the offloaded activations take at their most (0 without offload). The
    plain-PyTorch run with its standard loss (every estimate before framework profiles) adds none."""
    plain = run.framework == "pytorch" and run.loss in ("auto", "standard")
    out: dict[str, str | int] = {} if plain else dict(facts(run))
    if host_bytes:
        out["activation_offload_host_bytes"] = host_bytes
    return out


_TRICK_SOURCES = {
    "chunked": "loss: torchtune CEWithChunkedOutputLoss + TransformerDecoder.chunked_output "
    "(torchtune/modules/loss/ce_chunked_output_loss.py, modules/transformer.py); traced",
    "fp32-shift": "loss: torchtune v0.1 / v0.2 (TransformerDecoder.forward self.output(h).float(); recipe "
    "logits[..., :-1, :].contiguous(), nn.CrossEntropyLoss); modelled from the source, not traced",
    "chunked-linear": "loss: torchtune LinearCrossEntropyLoss "
    "(torchtune/modules/loss/cross_entropy_loss.py); traced",
    "chunked-trainer": "loss: Axolotl chunked_cross_entropy (src/axolotl/monkeypatch/loss/chunked.py "
    "patch_chunked_ce_loss_fn: a compiled cross-entropy per chunk of the logits); modelled, not traced",
    "fused-linear": "loss: " + LIGER_SOURCE + "; modelled from the source, not traced",
    "vocab-parallel": "loss: Megatron-LM VocabParallelCrossEntropy (megatron/core/tensor_parallel/"
    "cross_entropy.py); modelled from the source, not traced",
    "loss-parallel": "loss: torch loss_parallel() (torch/distributed/tensor/parallel/loss.py _log_softmax, "
    "_nll_loss_and_log_softmax_backward); traced",
    "activation_offload": "activation offload: torchtune OffloadActivations (torchtune/training/"
    "_activation_offloading.py: >= 1024 B, not nn.Parameter, 5-pack forward stash, copies freed after the "
    "next node); traced (device side)",
    "ckpt_offload": "checkpointed layer inputs in CPU RAM: unsloth_zoo "
    "Unsloth_Offloaded_Gradient_Checkpointer; modelled",
    "ckpt_every": "checkpointing every N-th layer: torchtitan _apply_layer_sac ((layer + 1) % N == 0); "
    "traced",
    "selective-op": "op-level selective checkpointing: torchtitan SelectiveAC policy (mm outputs except "
    "every second one, addmm and SDPA outputs saved); traced",
    "float8": "float8 linears: torchao Float8Linear, tensorwise (matmul_with_hp_or_float8_args saves the "
    "high-precision input and weight; fp8 copies transient); modelled, not traced",
    "compile": "torch.compile'd decoder layers: RMSNorm, gated activation and rotary fused by Inductor, "
    "the min-cut partitioner keeping the norm's input and fp32 rstd, the gate and up projections "
    "(torch/_functorch/partitioners.py min_cut_rematerialization_partition); traced with Inductor on the CPU "
    "(tests/reference/distributed/compile.json)",
    "optimizer_in_backward": "optimizer in backward: torchtune register_optim_in_bwd_hooks "
    "(torch register_post_accumulate_grad_hook); traced",
}


def trick_sources(run: TrainingRun) -> str:
    """``; ``-joined sources of the tricks the run uses (empty without any), for the explanations."""
    r = resolve(run)
    keys = [r.loss] if r.loss != "standard" else []
    keys += [
        k
        for k in ("activation_offload", "ckpt_offload", "float8", "compile", "optimizer_in_backward")
        if getattr(r, k)
    ]
    why = profile(run).compiled_loss_source if run.compile_loss == "auto" else "compile_loss on"
    compiled_loss = (
        f"; compiled loss ({why}): Inductor's fused cross-entropy, no fp32 logits" if r.compile_loss else ""
    )
    if r.ckpt_every > 1:
        keys.append("ckpt_every")
    if r.ckpt_policy == "selective-op":
        keys.append("selective-op")
    return "".join(f"; {_TRICK_SOURCES[k]}" for k in keys) + compiled_loss
