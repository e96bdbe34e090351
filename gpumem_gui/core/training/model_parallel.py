"""Model parallelism per rank: what tensor, sequence, context, pipeline and expert parallelism change in one
rank's step beyond its slice of the model (:func:`gpumem_gui.core.spec.parallel.rank_spec`).

* Tensor parallelism: heads, MLP width and vocabulary are split; without sequence parallelism every TP rank
  holds the whole residual stream, norms and dropout masks (the row-parallel outputs are all-reduced), with it
  those hold ``seq / tp`` tokens and the column-parallel linears read an all-gathered input
  (:mod:`gpumem_gui.core.replay.block`). The head is vocab-parallel with a vocab-parallel loss in Megatron-LM
  (``ColumnParallelLinear(gather_output=False)`` + ``vocab_parallel_cross_entropy``) and torchtitan
  (``loss_parallel``); transformers' own TP plan (``"lm_head": "colwise_gather_output"``), DeepSpeed AutoTP
  and torchtune gather the full-vocabulary logits on every rank.
* Context parallelism: ``seq / cp`` tokens per rank; FSDP / ZeRO shard over the ``dp x cp`` ranks
  (torchtitan's ``dp_shard_cp`` mesh, Megatron's ``get_data_parallel_group(with_context_parallel=True)``);
  the attention exchanges K/V (:func:`cp_buffers`).
* Pipeline parallelism: micro-batches in flight per stage and schedule (:func:`in_flight`).
* Expert parallelism: the all-to-all dispatch and combine buffers (:func:`ep_buffers`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.memory import DT_BYTES
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training.frameworks import Sharding, framework
from gpumem_gui.core.training.precision import dtypes
from gpumem_gui.core.training.run import TrainingRun

# frameworks whose TP head keeps its vocabulary shard and computes a vocab-parallel loss: Megatron-LM
# (megatron/core/models/gpt/gpt_model.py output_layer: ColumnParallelLinear(gather_output=not
# parallel_output), tensor_parallel/cross_entropy.py) and torchtitan (models/llama3/infra/parallelize.py
# apply_tp: "output": ColwiseParallel(output_layouts=Shard(-1)) under loss_parallel, on unless
# --parallelism.disable_loss_parallel)
VOCAB_PARALLEL = frozenset({"megatron", "torchtitan"})


def megatron(run: TrainingRun) -> bool:
    """Megatron-LM's own layers (its framework, or its distributed-optimizer precision)."""
    return run.framework == "megatron" or run.precision == "megatron-bf16"


def vocab_parallel(run: TrainingRun) -> bool:
    return run.tp > 1 and (run.framework in VOCAB_PARALLEL or megatron(run))


def tp_fields(run: TrainingRun) -> dict[str, int | bool]:
    """The replay's tensor-parallel options (:class:`ReplayConfig`): sequence shards, Megatron's persistent
    gather buffer, a vocab-parallel or a gathered head."""
    if run.tp == 1:
        return {}
    vp = vocab_parallel(run)
    return {
        "sequence_shards": run.tp if run.sequence_parallel else 1,
        "sp_saves_shard": megatron(run),
        "vocab_shards": run.tp if vp else 1,
        "logits_gather": 1 if vp else run.tp,
    }


def shard_run(run: TrainingRun) -> TrainingRun:
    """The run as its data-parallel sharding sees it: FSDP and ZeRO shard over the ``dp x cp`` ranks, as
    every CP rank holds the same parameters (torchtitan parallel_dims.py ``dp_shard_cp``; Megatron
    distributed optimizer over ``data_parallel_group_with_cp``; DeepSpeed Ulysses ``seq_data_parallel``)."""
    if run.cp == 1:
        return run
    return run.model_copy(update={"dp": run.dp * run.cp})


def rank_sharding(run: TrainingRun) -> Sharding:
    """The framework's :class:`Sharding` of one rank, over the ``dp x cp`` ranks."""
    return framework(shard_run(run)).sharding(shard_run(run))


@dataclass(frozen=True)
class Extra:
    """Bytes a rank holds beside its replayed micro-batch, with the formula, inputs and source."""

    key: str
    label: str
    bytes: int
    formula: str
    inputs: dict[str, int | float | str]
    source: str
    phases: tuple[str, ...] = ("forward", "backward")  # the phases whose peak it joins


def _act_bytes(run: TrainingRun, cfg: ReplayConfig) -> int:
    return 2 if cfg.autocast or cfg.param_dt != "f32" else 4


def cp_buffers(run: TrainingRun, cfg: ReplayConfig, rspec: ModelSpec) -> Extra | None:
    """K/V exchanged by one layer's context-parallel attention. Megatron-LM (TransformerEngine
    ``AttnFuncWithCPAndKVP2P``): a ring, double-buffered send and receive of the K/V chunk. torch's
    ``context_parallel`` (torchtitan; rotate method ``allgather``, the default): ``cat(k, v)`` of the local
    chunk all-gathered once into the K/V of the whole sequence, and the output merged in fp32
    (``_SDPAMerger``, ``convert_to_f32=True``)."""
    if run.cp == 1:
        return None
    dt = _act_bytes(run, cfg)
    chunk = run.batch * cfg.q * rspec.num_kv_heads * rspec.head_dim  # K (or V) elements of one chunk
    inputs: dict[str, int | float | str] = {"cp": run.cp, "seq_per_rank": cfg.q, "kv_chunk_elements": chunk}
    if megatron(run):
        return Extra(
            "context_parallel",
            "context-parallel K/V ring buffers",
            2 * 2 * chunk * dt,
            "2 (send, receive) x (K + V) x batch x seq/cp x kv heads x head_dim x dtype",
            inputs,
            "TransformerEngine attention AttnFuncWithCPAndKVP2P (Megatron-LM context parallelism)",
        )
    merged = run.batch * cfg.q * rspec.num_attention_heads * rspec.head_dim * 4
    return Extra(
        "context_parallel",
        "context-parallel all-gathered K/V",
        (run.cp + 1) * 2 * chunk * dt + merged,
        "(cp + 1) x (K + V) chunk (the local cat and the all-gathered sequence) x batch x seq/cp x kv "
        "heads x head_dim x dtype + fp32 merged output (batch x seq/cp x heads x head_dim x 4 B)",
        {**inputs, "merged_output": merged},
        "torch/distributed/tensor/experimental/_context_parallel/_attention.py (_AllGatherRotater, "
        "_SDPAMerger; rotate_method ALL_GATHER default), torchtitan context_parallel_rotate_method",
    )


def ep_buffers(run: TrainingRun, cfg: ReplayConfig, rspec: ModelSpec) -> Extra | None:
    """The all-to-all of one MoE layer under expert parallelism: the tokens routed to other ranks'
    experts are received into a new buffer (dispatch) and the expert outputs sent back into another
    (combine), each ``tokens x top_k x hidden`` with balanced routing (Megatron-LM
    ``MoEAlltoAllTokenDispatcher.token_permutation`` / ``token_unpermutation``)."""
    moe = rspec.moe
    if run.ep == 1 or moe is None:
        return None
    rows = cfg.tokens * moe.experts_per_token
    n = 2 * rows * rspec.hidden_size * _act_bytes(run, cfg)
    return Extra(
        "expert_parallel",
        "expert-parallel all-to-all buffers",
        n,
        "2 (dispatched tokens in, expert outputs back) x tokens x top_k x hidden x dtype",
        {"ep": run.ep, "tokens": cfg.tokens, "top_k": moe.experts_per_token, "hidden": rspec.hidden_size},
        "Megatron-LM megatron/core/transformer/moe/token_dispatcher.py (MoEAlltoAllTokenDispatcher)",
    )


def in_flight(run: TrainingRun, stage: int) -> tuple[float, Extra | None]:
    """Micro-batches whose activations pipeline stage ``stage`` holds at its peak, in units of one
    micro-batch through all of the stage's layers, with its explanation (None without pipelining).

    * GPipe: every micro-batch's forward runs before any backward: ``m`` (Huang et al. 2019;
      torch.distributed.pipelining ScheduleGPipe).
    * 1F1B: ``pp - stage - 1`` warm-up forwards plus the one in steady state: ``min(pp - stage, m)``
      (Narayanan et al. 2021; Megatron-LM schedules.py forward_backward_pipelining_without_interleaving).
    * interleaved 1F1B, ``v`` model chunks of ``layers / v`` each: ``(pp - stage - 1) x 2 + (v - 1) x pp``
      warm-up chunk forwards plus one, at most ``m x v`` (Megatron-LM schedules.py
      forward_backward_pipelining_with_interleaving, num_warmup_microbatches): that many / v micro-batches.
    * zero bubble ZB-H1: as 1F1B (Qi et al. 2023, sec. 3.1: the same in-flight micro-batches); the deferred
      weight-gradient pass adds :func:`zb_weight_inputs`."""
    m, p = run.grad_accum, run.pp
    if p == 1:
        return 1.0, None
    schedule = run.pp_schedule
    inputs: dict[str, int | float | str] = {"pp": p, "stage": stage, "micro_batches": m, "schedule": schedule}
    if schedule == "gpipe":
        n: float = m
        formula, source = "every micro-batch: m", "Huang et al. 2019 (GPipe); torch.distributed.pipelining"
    elif schedule == "interleaved-1f1b":
        v = run.pp_virtual
        # with exactly pp micro-batches every rank runs all its forwards first (all_warmup_microbatches);
        # newer Megatron-LM writes (v - 1) x microbatch_group_size_per_vp_stage, whose default is pp
        chunks = m * v if m == p else min((p - stage - 1) * 2 + (v - 1) * p + 1, m * v)
        n = chunks / v
        inputs |= {"virtual_stages": v, "chunk_microbatches": chunks}
        formula = (
            "min((pp - stage - 1) x 2 + (v - 1) x pp + 1, m x v) chunk micro-batches / v (m x v if m = pp)"
        )
        source = (
            "Megatron-LM schedules.py forward_backward_pipelining_with_interleaving (num_warmup_microbatches)"
        )
    else:
        n = min(p - stage, m)
        formula = "min(pp - stage, m)"
        source = (
            "Qi et al. 2023 (Zero Bubble Pipeline Parallelism, ZB-H1: the in-flight micro-batches of 1F1B)"
            if schedule == "zero-bubble"
            else "Narayanan et al. 2021 (1F1B); Megatron-LM schedules.py "
            "forward_backward_pipelining_without_interleaving"
        )
    inputs["in_flight"] = n
    return n, Extra(
        "pipeline_inflight", "activations of other in-flight micro-batches", 0, formula, inputs, source
    )


def zb_weight_inputs(run: TrainingRun, cfg: ReplayConfig, rspec: ModelSpec) -> Extra | None:
    """Zero bubble (ZB-H1): the weight-gradient pass W of a micro-batch runs after its input-gradient pass
    B, so the gradients of its linears' outputs wait for W beside the activations of 1F1B (Qi et al. 2023,
    sec. 2: W needs the layer input and the output gradient); one micro-batch's worth."""
    if run.pp == 1 or run.pp_schedule != "zero-bubble":
        return None
    a, kvh, d, h = rspec.num_attention_heads, rspec.num_kv_heads, rspec.head_dim, rspec.hidden_size
    ff = rspec.intermediate_size
    per_token = a * d + 2 * kvh * d + h + (2 * ff if rspec.mlp_gated else ff) + h
    n = cfg.tokens * per_token * rspec.num_layers * _act_bytes(run, cfg)
    return Extra(
        "zero_bubble_w",
        "output gradients held for the deferred weight-gradient pass",
        n,
        "tokens x (q + k + v + o + MLP in/out widths of this rank) x layers x dtype: one micro-batch",
        {"tokens": cfg.tokens, "per_token": per_token, "layers": rspec.num_layers},
        "Qi et al. 2023, Zero Bubble Pipeline Parallelism (B/W split; ZB-H1 schedule)",
    )


def tp_embedding_grad(run: TrainingRun, cfg: ReplayConfig, spec: ModelSpec) -> Extra | None:
    """DTensor tensor parallelism (torchtitan, torchtune, transformers' TP plan): the vocab-sharded token
    embedding (``RowwiseParallel``, weight ``Shard(0)``) gets a ``Replicate()`` gradient of the whole
    vocabulary on every TP rank, as the only strategy for ``embedding_dense_backward`` with an unsharded
    vocabulary output is a ``Partial`` full-size weight gradient (torch/distributed/tensor/_ops/
    _embedding_ops.py ``embedding_dense_backward_strategy``; measured: validation/truth_tp.py). It lives
    from the end of backward to ``zero_grad``; with gradient accumulation through the next micro-batches.
    Megatron-LM's ``VocabParallelEmbedding`` keeps a gradient of its shard; DeepSpeed's AutoTP is not DTensor.
    """
    deepspeed = run.framework == "deepspeed" or (run.zero > 0 and run.zero_impl == "deepspeed")
    if run.tp == 1 or megatron(run) or deepspeed or not cfg.embedding or run.method != "full":
        return None
    local = -(-spec.vocab_size // run.tp)
    param_dt, _ = dtypes(run)
    n = (spec.vocab_size - local) * spec.token_embedding_dim * DT_BYTES[param_dt]
    return Extra(
        "tp_embedding_grad",
        "replicated embedding gradient (DTensor TP)",
        round(n),
        "(vocab - vocab / tp) x embedding width x gradient dtype: the full-vocabulary gradient beyond the "
        "rank's shard",
        {"vocab": spec.vocab_size, "tp": run.tp, "width": spec.token_embedding_dim, "dtype": param_dt},
        "torch/distributed/tensor/_ops/_embedding_ops.py embedding_dense_backward_strategy",
        ("forward", "backward", "optimizer") if run.grad_accum > 1 else ("optimizer",),
    )
