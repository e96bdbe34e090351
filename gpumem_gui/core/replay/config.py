"""What one replayed forward is: its shapes, dtypes and options (:class:`ReplayConfig`), and which decoder
layers an inference replay runs (:class:`LayerPlan`: the last layer of each kind stands for its kind)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from gpumem_gui.core.spec.model import ModelSpec


@dataclass(frozen=True)
class ReplayConfig:
    """One forward (and, in training, its backward): shapes, dtypes and the model's options."""

    batch: int
    q: int  # new tokens per sequence in this forward
    param_dt: str  # dtype of the model's float weights
    autocast: str | None = None  # lower-precision dtype of torch.autocast, None without autocast
    past: int = 0  # tokens already cached (inference decode)
    attn: str = "sdpa"
    logits_to_keep: int = 0  # 0: logits for every position; 1: the last one (generate)
    kv_bytes: float = 2  # bytes per cached element
    grad_ckpt: bool = False
    method: str = "full"  # full | lora | qlora
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ()
    lora_dropout: float = 0.0
    adapter_dt: str = "f32"
    quant_bytes: int = 0  # qlora: bytes of the 4-bit linears (packed weights + quantization state)
    quant_experts: bool = False  # qlora: the routed expert stacks are 4-bit too (run field qlora_experts)
    # the routed experts as transformers 4.x builds them: one nn.Linear (Linear4bit) per expert projection,
    # looped over (replay/moe_per_expert.py; qlora_experts 4bit-linear)
    expert_linears: bool = False
    quant_base: str = (
        "nf4"  # qlora: the base's bitsandbytes format (nf4, nf4-dq: Linear4bit; int8: Linear8bitLt)
    )
    frozen_layers: int = 0
    # inference on a bitsandbytes 4-bit model: its Linear4bit layers' compute dtype (bnb_4bit_compute_dtype);
    # None: the linears are not bitsandbytes 4-bit (replay/adapters.py linear4bit)
    bnb4_compute: str | None = None
    lm_head: bool = True  # this rank holds the head (and the loss)
    embedding: bool = True  # this rank holds the token embedding
    weights_counted: bool = True  # False: the weights are accounted elsewhere (inference's load phase)
    dropout: float = (
        0.0  # hidden-state dropout (residual and embedding dropouts where the architecture has them)
    )
    attn_dropout: float = 0.0  # attention-probability dropout (kept by eager attention only)
    cpu_dropout: bool = False  # replay the CPU dropout kernel (a full-dtype noise tensor) instead of CUDA's
    # tensor parallelism (replay/block.py): sequence parallelism splits the residual stream, norms and
    # dropout over this many TP ranks (1: every TP rank holds all ``q`` tokens of them)
    sequence_shards: int = 1
    # sequence parallelism as Megatron-LM runs it: the column-parallel linears save their local input shard
    # and all-gather into one persistent buffer (forward and again in backward); False: DTensor (torchtitan),
    # where the linears save the all-gathered input
    sp_saves_shard: bool = False
    # the logits and the loss are vocab-parallel over this many TP ranks: the rank's spec already holds
    # vocab_size / vocab_shards rows of the embedding and the head (spec/parallel.rank_spec), the logits stay
    # sharded (Megatron vocab_parallel_cross_entropy, torchtitan loss_parallel); 1: not vocab-parallel
    vocab_shards: int = 1
    # the head's local logits are all-gathered from this many TP ranks into the full vocabulary before the
    # loss (transformers' tp_plan "colwise_gather_output", torchtitan without loss_parallel); 1: no gather
    logits_gather: int = 1
    # framework memory tricks (training/profiles.py resolves them from the run; replay/loss.py, tricks.py)
    loss: str = "standard"  # standard | chunked | fused-linear | vocab-parallel | loss-parallel (loss.py)
    loss_chunks: int = 8  # chunked: torchtune CEWithChunkedOutputLoss num_output_chunks
    ckpt_every: int = 1  # with grad_ckpt: layer i is checkpointed when (i + 1) % ckpt_every == 0
    ckpt_policy: str = "full"  # full | selective-op (torchtitan op-level SAC)
    activation_offload: bool = False  # torchtune OffloadActivations around the decoder (not the head)
    offload_ckpt_inputs: bool = False  # unsloth: only the checkpointed layers' inputs go to CPU RAM
    float8: bool = False  # torchao Float8Linear (tensorwise) on the decoder's linears
    # torch.compile'd decoder layers: fused RMSNorm, gated activation and rotary (replay/tricks.py)
    compile: bool = False
    # the framework compiles its loss too: Inductor's fused cross-entropy (replay/logits.py)
    compile_loss: bool = False
    # inference with a pre-allocated cache (StaticCache, generate(cache_implementation="static")):
    # every layer's keys and values hold this many tokens and the attention reads all of them
    # (cache_utils.py StaticLayer.update returns the whole static tensors, get_mask_sizes = max_cache_len);
    # 0: DynamicCache (replay/static_cache.py)
    static_len: int = 0
    images: int = 0  # images in each sequence's prompt, run through the vision tower (replay/vision.py)
    image_size: int = 0  # their side in pixels
    train_tower: bool = False  # the vision tower trains on the images (replay/vision_train.py)
    # how far the LoRA targets reach into the vision tower (run field lora_vision_tower; vision_train.py)
    tower_targets: str = "excluded"

    @property
    def kv_len(self) -> int:
        """Keys the attention reads: the cached and the new tokens, or a static cache's whole length."""
        return self.static_len or self.past + self.q

    @property
    def tokens(self) -> int:
        return self.batch * self.q


@dataclass(frozen=True)
class LayerPlan:
    """The layers a forward replays op by op: ``segments`` holds one ``(first, layer)`` per replayed layer in
    order, layers ``first`` to ``layer - 1`` run without a replay before it (inference only: a skipped layer's
    transient peak is dominated by the last layer of its kind, which has more cache below it)."""

    segments: tuple[tuple[int, int], ...]

    @property
    def replayed(self) -> frozenset[int]:
        return frozenset(layer for _, layer in self.segments)


def layer_kind(spec: ModelSpec, i: int) -> tuple[str, bool, bool, bool, bool]:
    """Attention type, MoE or dense, whether the layer skips the rotary embedding (NoPE), whether it
    reuses an earlier layer's keys and values (Gemma 3n), and whether it reuses the previous layer's DSA
    top-k instead of running an indexer (GLM-5's shared layers)."""
    types = spec.resolved_layer_types
    ix = spec.mla.indexer if spec.mla is not None else None
    shares_topk = ix is not None and not ix.has_indexer(i)
    return types[i], spec.is_moe_layer(i), i in spec.nope_layers, i in spec.kv_shared_layers, shares_topk


@lru_cache(maxsize=256)
def last_of_each_kind(spec: ModelSpec) -> LayerPlan:
    """Replay the last layer of each kind (attention type x dense/MoE); skip the rest (and every
    cross-attention layer, which a text-only forward skips: replay/cross_attention.py)."""
    types = spec.resolved_layer_types
    last = {layer_kind(spec, i): i for i in range(spec.num_layers) if types[i] != "cross_attention"}
    first, segments = 0, []
    for layer in sorted(last.values()):
        segments.append((first, layer))
        first = layer + 1
    return LayerPlan(tuple(segments))


def attn_as_run(spec: ModelSpec, cfg: ReplayConfig) -> ReplayConfig:
    """The run as transformers runs it: ``sdpa`` is eager for an architecture without an SDPA path
    (PreTrainedModel.get_correct_attn_implementation falls back when the implementation was not named)."""
    if cfg.attn == "sdpa" and not spec.traits.sdpa_supported:
        return replace(cfg, attn="eager")
    return cfg


def every_layer(layers: Sequence[int]) -> LayerPlan:
    return LayerPlan(tuple((i, i) for i in layers))
