"""DeepSeek-V4's compressed attention: what its cache holds after ``tokens`` tokens, a rule of the length.

transformers 5.24 (``models/deepseek_v4/modeling_deepseek_v4.py``) gives every layer a sliding-window K=V
branch (one shared-KV head of ``head_dim``) and, on ``compressed_sparse_attention`` (CSA, rate m = 4) and
``heavily_compressed_attention`` (HCA, rate m' = 128) layers, a compressor that turns each closed window of
m source tokens into one ``head_dim`` entry. The cache layers:

* ``DynamicSlidingWindowLayer`` (``sliding_attention``): keys and values, two tensors, ``window - 1`` tokens
  at most.
* ``DeepseekV4HCACache``: the same window, but ``values`` is ``keys`` (one tensor); ``buffer_kv`` /
  ``buffer_gate`` hold the ``tokens mod m`` projected tokens not yet compressed (``kv_proj`` / ``gate_proj``,
  ``head_dim`` each, activation dtype); ``compressed_kv`` the ``tokens // m`` entries.
* ``DeepseekV4CSACache``: an HCA cache whose compressor projects ``2 x head_dim`` per token (the overlapping
  series Ca / Cb) and a second entry, the indexer's own compressor (``2 x index_head_dim``, entries of
  ``index_head_dim``); once a window has closed, ``update_overlap_state`` keeps the last window's Ca slice:
  ``overlap_kv`` [m, dim] in the activation dtype and ``overlap_gate`` [m, dim] in fp32 (the gate plus the
  fp32 ``position_bias``), for each of the two.

The state is the same after one prefill of L tokens as after any prefill / decode split of them (measured:
tests/reference/extra/compressed_cache.json). Its bytes grow by (head_dim + index_head_dim) x 2 / 4 per
token on each CSA layer and head_dim x 2 / 128 on each HCA layer (DeepSeek-V4-Flash: 6,880 B per token),
while the first ``window - 1`` tokens also fill the window (1,024 B per token and layer, 2,048 on the
sliding-only layers): no per-token figure describes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from gpumem_gui.core.spec.base import Frozen, NonNegInt, PositiveInt

if TYPE_CHECKING:  # params.Tensor is passed in to keep spec.params -> spec.compressed one-way at import
    from gpumem_gui.core.spec.model import ModelSpec
    from gpumem_gui.core.spec.params import Tensor

# why a DeepSeek-V4 training run is refused: full fine-tuning and LoRA on data-parallel ranks are replayed
# and measured (replay/dsv4.py, tests/reference/extra/deepseek_v4_trace.json); QLoRA is not
NOT_REPLAYED = (
    "DeepSeek-V4 is replayed for full fine-tuning and LoRA on a 16-bit base without tensor, pipeline or "
    "context parallelism, compiled layers or float8 linears only; `gpumem trace` measures the run"
)
# DeepseekV4Attention.o_a_proj (modeling_deepseek_v4.py): a DeepseekV4GroupedLinear, the nn.Linear subclass
# whose forward is one bmm per head group
GROUPED_LINEAR = "o_a_proj"
# DeepseekV4CSACompressor.indexer (DeepseekV4Indexer): the module path of the indexer within an attention
INDEXER = "compressor.indexer"
CompressedLayer = Literal["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
# DeepseekV4CSACache.update_overlap_state: overlap_gate is chunk_gate (+ the fp32 position_bias), fp32
_FP32 = 4


class CompressedAttentionSpec(Frozen):
    """DeepseekV4Config's attention fields (configuration_deepseek_v4.py)."""

    layer_types: tuple[CompressedLayer, ...] = Field(description="layer_types (or legacy compress_ratios)")
    head_dim: PositiveInt = Field(description="head_dim (DeepseekV4Config: 512), the one shared-KV head")
    index_head_dim: PositiveInt = Field(description="index_head_dim (128): the indexer's compressed entries")
    sliding_window: PositiveInt = Field(
        description="sliding_window (128): the window branch keeps window - 1"
    )
    csa_rate: PositiveInt = Field(4, description="compress_rates['compressed_sparse_attention']")
    hca_rate: PositiveInt = Field(128, description="compress_rates['heavily_compressed_attention']")


def _compressor(tokens: int, rate: int, dim: int, width: int, dt: int) -> int:
    """One compressor entry: the buffered projections (kv and gate, ``width`` each) of the tokens after the
    last closed window, and one ``dim`` entry per closed window."""
    return 2 * (tokens % rate) * width * dt + (tokens // rate) * dim * dt


def layer_cache_bytes(spec: CompressedAttentionSpec, kind: str, tokens: int, dt: int = 2) -> int:
    """Bytes of one sequence's cache layer of ``kind`` after ``tokens`` tokens (activation dtype ``dt``)."""
    d, di = spec.head_dim, spec.index_head_dim
    window = min(tokens, spec.sliding_window - 1) * d * dt
    if kind == "sliding_attention":
        return 2 * window  # DynamicSlidingWindowLayer: keys and values are two tensors
    if kind == "heavily_compressed_attention":
        return window + _compressor(tokens, spec.hca_rate, d, d, dt)
    m = spec.csa_rate
    overlap = m * (d + di) * (dt + _FP32) if tokens >= m else 0
    return window + _compressor(tokens, m, d, 2 * d, dt) + _compressor(tokens, m, di, 2 * di, dt) + overlap


def cache_bytes(spec: CompressedAttentionSpec, tokens: int, batch: int = 1, dt: int = 2) -> tuple[int, ...]:
    """Per-layer bytes of transformers' DeepSeek-V4 cache for ``batch`` sequences of ``tokens`` tokens."""
    return tuple(batch * layer_cache_bytes(spec, k, tokens, dt) for k in spec.layer_types)


class DeepseekV4Spec(Frozen):
    """What DeepseekV4Config adds to a decoder (``ModelSpec.deepseek_v4``; the MoE sizes: ``ModelSpec.moe``,
    the shared expert's width: ``intermediate_size``, which the config's attribute_map reads from
    ``moe_intermediate_size``)."""

    attention: CompressedAttentionSpec
    q_lora_rank: PositiveInt
    o_groups: PositiveInt = Field(description="o_groups: head groups of the grouped output projection")
    o_lora_rank: PositiveInt = Field(description="o_lora_rank: each group's intermediate width")
    index_n_heads: PositiveInt
    index_topk: PositiveInt = Field(description="index_topk: compressed entries each query keeps")
    hc_mult: PositiveInt = Field(description="hc_mult: the residual streams of the hyper-connections")
    hc_sinkhorn_iters: PositiveInt = Field(description="hc_sinkhorn_iters: Sinkhorn-Knopp iterations")
    hash_layers: tuple[NonNegInt, ...] = Field(
        (), description="the hash_moe layers (mlp_layer_types): DeepseekV4HashRouter, a tid2eid buffer"
    )


def shape_of(spec: ModelSpec) -> DeepseekV4Shape:
    """The parameter-count view of a DeepSeek-V4 ``spec`` (its ``deepseek_v4`` and ``moe`` set)."""
    v, moe = spec.deepseek_v4, spec.moe
    assert v is not None and moe is not None
    return DeepseekV4Shape(
        attention=v.attention,
        hidden_size=spec.hidden_size,
        vocab_size=spec.vocab_size,
        num_attention_heads=spec.num_attention_heads,
        q_lora_rank=v.q_lora_rank,
        o_groups=v.o_groups,
        o_lora_rank=v.o_lora_rank,
        index_n_heads=v.index_n_heads,
        moe_intermediate_size=moe.expert_intermediate_size,
        n_routed_experts=moe.num_experts,
        hc_mult=v.hc_mult,
        tie_word_embeddings=spec.tie_word_embeddings,
    )


class DeepseekV4Shape(Frozen):
    """The DeepseekV4Config fields its parameter count reads (configuration_deepseek_v4.py)."""

    attention: CompressedAttentionSpec
    hidden_size: PositiveInt
    vocab_size: PositiveInt
    num_attention_heads: PositiveInt
    q_lora_rank: PositiveInt
    o_groups: PositiveInt
    o_lora_rank: PositiveInt
    index_n_heads: PositiveInt
    moe_intermediate_size: PositiveInt = Field(description="the experts' and the shared MLP's width")
    n_routed_experts: PositiveInt
    hc_mult: PositiveInt = Field(description="hc_mult: the residual streams of the hyper-connections")
    tie_word_embeddings: bool = False


def _attention_params(s: DeepseekV4Shape, kind: str) -> tuple[int, int]:
    """(parameters, of which fp32) of a DeepseekV4Attention: q_a_proj, q_a_norm (fp32), q_b_proj, kv_proj,
    kv_norm (fp32), o_a_proj (DeepseekV4GroupedLinear: o_groups x o_lora_rank rows of heads x head_dim /
    o_groups), o_b_proj, sinks (fp32); its compressor: kv_proj / gate_proj (2 x head_dim on CSA),
    position_bias [rate, width] (fp32), kv_norm (fp32); CSA's DeepseekV4Indexer the same at index_head_dim
    plus q_b_proj and the scorer's weights_proj."""
    at, h, q = s.attention, s.hidden_size, s.q_lora_rank
    d, di, a = at.head_dim, at.index_head_dim, s.num_attention_heads
    n = h * q + q * a * d + h * d + s.o_lora_rank * a * d + s.o_groups * s.o_lora_rank * h
    f32 = q + d + a
    if kind == "heavily_compressed_attention":
        n, f32 = n + 2 * h * d, f32 + at.hca_rate * d + d
    elif kind == "compressed_sparse_attention":
        n += 4 * h * d + 4 * h * di + q * s.index_n_heads * di + h * s.index_n_heads
        f32 += at.csa_rate * 2 * (d + di) + d + di
    return n + f32, f32


def deepseek_v4_params(s: DeepseekV4Shape) -> tuple[int, int]:
    """(parameters, of which fp32) of DeepseekV4ForCausalLM: per layer the attention, two fp32 RMSNorms, two
    fp32 DeepseekV4HyperConnection (fn [(2 + n) n, n h], base, 3 scales), the MoE block (router weight
    [experts, h], DeepseekV4Experts gate_up / down, one DeepseekV4MLP of moe_intermediate_size: the config's
    attribute_map reads intermediate_size from it); the embedding, the fp32 final norm and
    DeepseekV4HyperHead (hc_fn [n, n h], hc_base, hc_scale), lm_head. The routers' e_score_correction_bias and
    the hash layers' tid2eid table are buffers."""
    h, f, e, nh = s.hidden_size, s.moe_intermediate_size, s.n_routed_experts, s.hc_mult
    hc = (2 + nh) * nh * (nh * h + 1) + 3
    total = fp32 = 0
    for kind in s.attention.layer_types:
        n, f32 = _attention_params(s, kind)
        total += n + 2 * h + 2 * hc + e * h + 3 * e * h * f + 3 * h * f
        fp32 += f32 + 2 * h + 2 * hc
    head = nh * nh * h + nh + 1
    embed = s.vocab_size * h * (1 if s.tie_word_embeddings else 2)
    return total + embed + h + head, fp32 + h + head


def _compressor_tensors(
    pre: str, s: DeepseekV4Shape, rate: int, width: int, dim: int
) -> list[tuple[str, tuple[int, ...]]]:
    """A compressor's (or the indexer's) own weights, in DeepseekV4HCACompressor / CSACompressor /
    DeepseekV4Indexer order: position_bias [rate, width] (fp32), kv_proj and gate_proj (width rows),
    kv_norm."""
    h = s.hidden_size
    return [
        (f"{pre}.position_bias", (rate, width)),
        (f"{pre}.kv_proj.weight", (width, h)),
        (f"{pre}.gate_proj.weight", (width, h)),
        (f"{pre}.kv_norm.weight", (dim,)),
    ]


def _attention_tensors(s: DeepseekV4Shape, i: int, kind: str) -> list[tuple[str, tuple[int, ...]]]:
    """DeepseekV4Attention's parameters as named_parameters() lists them (see :func:`_attention_params`)."""
    at, h, q, a = s.attention, s.hidden_size, s.q_lora_rank, s.num_attention_heads
    d, di, pre = at.head_dim, at.index_head_dim, f"layers.{i}.self_attn"
    out: list[tuple[str, tuple[int, ...]]] = [
        (f"{pre}.sinks", (a,)),
        (f"{pre}.q_a_proj.weight", (q, h)),
        (f"{pre}.q_a_norm.weight", (q,)),
        (f"{pre}.q_b_proj.weight", (a * d, q)),
        (f"{pre}.kv_proj.weight", (d, h)),
        (f"{pre}.kv_norm.weight", (d,)),
        (f"{pre}.o_a_proj.weight", (s.o_groups * s.o_lora_rank, a * d // s.o_groups)),
        (f"{pre}.o_b_proj.weight", (h, s.o_groups * s.o_lora_rank)),
    ]
    if kind == "heavily_compressed_attention":
        out += _compressor_tensors(f"{pre}.compressor", s, at.hca_rate, d, d)
    elif kind == "compressed_sparse_attention":
        out += _compressor_tensors(f"{pre}.compressor", s, at.csa_rate, 2 * d, d)
        ix = f"{pre}.{INDEXER}"
        out += _compressor_tensors(ix, s, at.csa_rate, 2 * di, di)
        out += [(f"{ix}.q_b_proj.weight", (s.index_n_heads * di, q))]
        out += [(f"{ix}.scorer.weights_proj.weight", (s.index_n_heads, h))]
    return out


def deepseek_v4_tensors(spec: ModelSpec, tensor: type[Tensor]) -> Iterator[Tensor]:
    """Every parameter of DeepseekV4ForCausalLM (named as ``named_parameters()`` without ``model.``): per
    layer the attention, the MoE block (the router's ``gate``, the fused experts, the shared MLP), the two
    fp32 norms and the two hyper-connections (``fn``, ``base``, ``scale``); the final norm, the hyper head
    and lm_head. They sum to :func:`deepseek_v4_params`."""
    s = shape_of(spec)
    h, f, e, n = s.hidden_size, s.moe_intermediate_size, s.n_routed_experts, s.hc_mult
    yield tensor("embed_tokens.weight", (s.vocab_size, h), "embedding")
    for i, kind in enumerate(s.attention.layer_types):
        for name, shape in _attention_tensors(s, i, kind):
            is_norm = name.endswith("norm.weight")
            yield tensor(name, shape, "norms" if is_norm else "attention", i, is_fp32(name))
        pre = f"layers.{i}"
        yield tensor(f"{pre}.mlp.gate.weight", (e, h), "router", i)
        yield tensor(f"{pre}.mlp.experts.gate_up_proj", (e, 2 * f, h), "routed_experts", i)
        yield tensor(f"{pre}.mlp.experts.down_proj", (e, h, f), "routed_experts", i)
        for proj, shape in (("gate_proj", (f, h)), ("up_proj", (f, h)), ("down_proj", (h, f))):
            yield tensor(f"{pre}.mlp.shared_experts.{proj}.weight", shape, "shared_experts", i)
        yield tensor(f"{pre}.input_layernorm.weight", (h,), "norms", i, True)
        yield tensor(f"{pre}.post_attention_layernorm.weight", (h,), "norms", i, True)
        for hc, component in (("attn_hc", "attention"), ("ffn_hc", "mlp")):
            yield tensor(f"{pre}.{hc}.fn", ((2 + n) * n, n * h), component, i, True)
            yield tensor(f"{pre}.{hc}.base", ((2 + n) * n,), component, i, True)
            yield tensor(f"{pre}.{hc}.scale", (3,), component, i, True)
    yield tensor("norm.weight", (h,), "norms", None, True)
    yield tensor("hc_head.hc_fn", (n, n * h), "norms", None, True)
    yield tensor("hc_head.hc_base", (n,), "norms", None, True)
    yield tensor("hc_head.hc_scale", (1,), "norms", None, True)
    if not s.tie_word_embeddings:
        yield tensor("lm_head.weight", (s.vocab_size, h), "lm_head")


def describe_compressed(spec: ModelSpec) -> str:
    """One line on a DeepSeek-V4 model's attention layers for the CLI and the window."""
    v = spec.deepseek_v4
    assert v is not None
    at, types = v.attention, v.attention.layer_types
    csa, hca = types.count("compressed_sparse_attention"), types.count("heavily_compressed_attention")
    return (
        f"CSA on {csa} layers (1 entry per {at.csa_rate} tokens, indexer {v.index_n_heads} x "
        f"{at.index_head_dim}, top-{v.index_topk}), HCA on {hca} (1 per {at.hca_rate}), window "
        f"{at.sliding_window} on every layer; "
        f"{v.hc_mult} hyper-connection streams"
    )


# DeepseekV4PreTrainedModel._keep_in_fp32_modules_strict and the modules built .to(float32): the sinks, every
# RMSNorm's weight, the compressors' position_bias, the hyper-connections and the hyper head
_FP32_SUFFIXES = ("sinks", "norm.weight", "position_bias")
_FP32_PARTS = ("_hc.", "hc_head.")
_I64 = 8  # DeepseekV4HashRouter.tid2eid: torch.long


def is_fp32(name: str) -> bool:
    """Whether transformers keeps DeepSeek-V4 parameter ``name`` in fp32 whatever the model's dtype."""
    return name.endswith(_FP32_SUFFIXES) or any(p in name for p in _FP32_PARTS)


def deepseek_v4_buffer_bytes(spec: ModelSpec) -> int:
    """Bytes of DeepseekV4ForCausalLM's buffers: each hash layer's ``tid2eid`` [vocab, top-k] int64, each
    other layer's fp32 ``e_score_correction_bias``, and every DeepseekV4RotaryEmbedding (the model's, each
    compressor's and each indexer's) with ``inv_freq`` and ``original_inv_freq`` for ``main`` and
    ``compress`` (rotary_dim / 2 fp32 entries each)."""
    v, moe = spec.deepseek_v4, spec.moe
    assert v is not None and moe is not None
    hashed = len(v.hash_layers)
    routers = hashed * spec.vocab_size * moe.experts_per_token * _I64
    routers += (spec.num_layers - hashed) * moe.num_experts * _FP32
    types = v.attention.layer_types
    rotaries = (
        1 + types.count("heavily_compressed_attention") + 2 * types.count("compressed_sparse_attention")
    )
    rotary_dim = spec.rotary_dim or spec.head_dim
    return routers + rotaries * 2 * 2 * (rotary_dim // 2) * _FP32


def deepseek_v4_held_bytes(spec: ModelSpec, param_bytes: int = 2) -> int:
    """What DeepseekV4ForCausalLM holds once built in a ``param_bytes`` dtype, before any input: its
    parameters (the fp32 ones at 4 B) and its buffers (measured: the load phase of `gpumem trace`)."""
    from gpumem_gui.core.spec.params import text_tensors

    total = sum(t.numel * (_FP32 if is_fp32(t.name) else param_bytes) for t in text_tensors(spec))
    return total + deepseek_v4_buffer_bytes(spec)
