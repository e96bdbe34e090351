"""Exact parameter accounting from a :class:`~gpumem_gui.core.spec.model.ModelSpec`.

Counts what ``transformers`` builds, tensor by tensor, so that the totals equal
``sum(p.numel() for p in model.parameters())`` of the real model (tied weights once). Each component is
the sum of named tensors; :func:`tensor_shapes` lists them so that tests can compare shapes one by one
with a model's own ``named_parameters()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from pydantic import Field

from gpumem_gui.core.spec.altup import altup_tensors
from gpumem_gui.core.spec.compressed import deepseek_v4_tensors
from gpumem_gui.core.spec.dsa import IndexerSpec
from gpumem_gui.core.spec.gemma4 import gemma4_tensors
from gpumem_gui.core.spec.mamba import mamba_tensors, single_layer_tensors
from gpumem_gui.core.spec.model import Frozen, ModelSpec

COMPONENTS = (
    "embedding",
    "position_embedding",
    "embedding_extra",
    "attention",
    "mlp",
    "routed_experts",
    "shared_experts",
    "router",
    "norms",
    "lm_head",
    "vision",
)


@dataclass(frozen=True, slots=True)
class Tensor:
    """One parameter tensor: a transformers-style name, its shape and the component it belongs to.

    ``layer`` is the decoder layer index (None outside the layer stack).
    """

    name: str
    shape: tuple[int, ...]
    component: str
    layer: int | None = None
    # kept in fp32 whatever the model's dtype (DeepseekV4PreTrainedModel._keep_in_fp32_modules_strict and
    # its modules built .to(float32): spec/compressed.py is_fp32)
    fp32: bool = False

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class ParamCounts(Frozen):
    """Parameter counts of a model, split by component; every figure is an exact element count."""

    total: int = Field(ge=0)
    text: int = Field(ge=0, description="total without the vision tower and projector")
    embedding: int = Field(ge=0, description="input token embedding")
    position_embedding: int = Field(ge=0, description="learned absolute position tables (GPT-2, OPT)")
    lm_head: int = Field(ge=0, description="output projection (0 when tied to the input embedding)")
    lm_head_tied: bool
    routed_experts: int = Field(ge=0)
    active_per_token: int = Field(ge=0, description="total minus the routed experts a token does not use")
    vision: int = Field(ge=0)
    by_component: dict[str, int]
    per_layer: tuple[int, ...] = Field(description="parameters in each decoder layer")


def _norm_tensors(spec: ModelSpec, prefix: str, width: int, layer: int | None) -> Iterator[Tensor]:
    yield Tensor(f"{prefix}.weight", (width,), "norms", layer)
    if spec.norm == "layernorm" and spec.norm_bias:
        yield Tensor(f"{prefix}.bias", (width,), "norms", layer)


def _linear(
    name: str, n_in: int, n_out: int, bias: bool, component: str, layer: int | None
) -> Iterator[Tensor]:
    yield Tensor(f"{name}.weight", (n_out, n_in), component, layer)
    if bias:
        yield Tensor(f"{name}.bias", (n_out,), component, layer)


def _dsa_indexer(ix: IndexerSpec, q_rank: int, h: int, p: str, i: int) -> Iterator[Tensor]:
    """DeepseekV32Indexer.__init__: wq_b, wk, k_norm (nn.LayerNorm: weight and bias), weights_proj."""
    yield from _linear(f"{p}.wq_b", q_rank, ix.n_heads * ix.head_dim, False, "attention", i)
    yield from _linear(f"{p}.wk", h, ix.head_dim, False, "attention", i)
    yield Tensor(f"{p}.k_norm.weight", (ix.head_dim,), "norms", i)
    yield Tensor(f"{p}.k_norm.bias", (ix.head_dim,), "norms", i)
    yield from _linear(f"{p}.weights_proj", h, ix.n_heads, False, "attention", i)


def _kda(spec: ModelSpec, i: int) -> Iterator[Tensor]:
    """KimiLinearDeltaAttention.__init__ (BailingHybridDeltaAttention's where ``kda_gates`` is full): q/k/v
    projections, the depthwise conv1d (no bias), the forget gate (f_a_proj/f_b_proj or f_proj, dt_bias,
    A_log [1, 1, H, 1] or [H]), b_proj, the output gate (g_a_proj/g_b_proj or g_proj), o_norm, o_proj."""
    la, h, p = spec.linear_attention, spec.hidden_size, f"layers.{i}.self_attn"
    assert la is not None
    hd, heads, w = la.key_head_dim, la.key_heads, la.key_dim
    for name in ("q_proj", "k_proj", "v_proj"):
        yield from _linear(f"{p}.{name}", h, w, False, "attention", i)
    yield Tensor(f"{p}.conv1d.weight", (la.conv_dim, 1, la.conv_kernel), "attention", i)
    if la.kda_gates == "low_rank":
        yield from _linear(f"{p}.forget_gate.f_a_proj", h, hd, False, "attention", i)
        yield from _linear(f"{p}.forget_gate.f_b_proj", hd, w, False, "attention", i)
        yield Tensor(f"{p}.forget_gate.A_log", (1, 1, heads, 1), "attention", i)
    else:
        yield from _linear(f"{p}.forget_gate.f_proj", h, w, False, "attention", i)
        yield Tensor(f"{p}.forget_gate.A_log", (heads,), "attention", i)
    yield Tensor(f"{p}.forget_gate.dt_bias", (w,), "attention", i)
    yield from _linear(f"{p}.b_proj", h, heads, False, "attention", i)
    if la.kda_gates == "low_rank":
        yield from _linear(f"{p}.g_a_proj", h, hd, False, "attention", i)
        yield from _linear(f"{p}.g_b_proj", hd, w, False, "attention", i)
    else:
        yield from _linear(f"{p}.g_proj", h, w, False, "attention", i)
    yield Tensor(f"{p}.o_norm.weight", (hd,), "norms", i)
    yield from _linear(f"{p}.o_proj", w, h, False, "attention", i)


def _linear_attention(spec: ModelSpec, i: int) -> Iterator[Tensor]:
    """Qwen3NextGatedDeltaNet.__init__: in_proj_qkvz, in_proj_ba, the depthwise conv1d (no bias), dt_bias,
    A_log, the gated RMSNorm over one value head, out_proj."""
    la, h, p = spec.linear_attention, spec.hidden_size, f"layers.{i}.linear_attn"
    assert la is not None
    if la.kind == "kda":
        yield from _kda(spec, i)
        return
    if la.kind == "lightning":  # MiniMaxLightningAttention.__init__: norm, qkv_proj, out_proj, output_gate
        p, w = f"layers.{i}.self_attn", la.key_heads * la.key_head_dim
        yield Tensor(f"{p}.norm.weight", (w,), "norms", i)
        yield from _linear(f"{p}.qkv_proj", h, 3 * w, False, "attention", i)
        yield from _linear(f"{p}.out_proj", w, h, False, "attention", i)
        yield from _linear(f"{p}.output_gate", h, w, False, "attention", i)
        return
    if la.split_projections:  # Qwen3_5GatedDeltaNet
        yield from _linear(f"{p}.in_proj_qkv", h, 2 * la.key_dim + la.value_dim, False, "attention", i)
        yield from _linear(f"{p}.in_proj_z", h, la.value_dim, False, "attention", i)
        yield from _linear(f"{p}.in_proj_b", h, la.value_heads, False, "attention", i)
        yield from _linear(f"{p}.in_proj_a", h, la.value_heads, False, "attention", i)
    else:
        yield from _linear(f"{p}.in_proj_qkvz", h, 2 * la.key_dim + 2 * la.value_dim, False, "attention", i)
        yield from _linear(f"{p}.in_proj_ba", h, 2 * la.value_heads, False, "attention", i)
    yield Tensor(f"{p}.conv1d.weight", (la.conv_dim, 1, la.conv_kernel), "attention", i)
    yield Tensor(f"{p}.dt_bias", (la.value_heads,), "attention", i)
    yield Tensor(f"{p}.A_log", (la.value_heads,), "attention", i)
    yield Tensor(f"{p}.norm.weight", (la.value_head_dim,), "norms", i)
    yield from _linear(f"{p}.out_proj", la.value_dim, h, False, "attention", i)


def _short_conv(spec: ModelSpec, i: int) -> Iterator[Tensor]:
    """Lfm2ShortConv.__init__: the depthwise conv (bias with conv_bias), in_proj to B, C, x, out_proj."""
    sc, h, p = spec.short_conv, spec.hidden_size, f"layers.{i}.conv"
    assert sc is not None
    yield Tensor(f"{p}.conv.weight", (h, 1, sc.kernel), "attention", i)
    if sc.bias:
        yield Tensor(f"{p}.conv.bias", (h,), "attention", i)
    yield from _linear(f"{p}.in_proj", h, 3 * h, sc.bias, "attention", i)
    yield from _linear(f"{p}.out_proj", h, h, sc.bias, "attention", i)


def _attention(spec: ModelSpec, i: int) -> Iterator[Tensor]:
    h, p = spec.hidden_size, f"layers.{i}.self_attn"
    if spec.resolved_layer_types[i] == "linear_attention":
        yield from _linear_attention(spec, i)
        return
    if spec.resolved_layer_types[i] == "conv":
        yield from _short_conv(spec, i)
        return
    if spec.resolved_layer_types[i] == "mamba":  # JambaMambaMixer (spec/mamba.py)
        yield from mamba_tensors(spec, i)
        return
    if spec.resolved_layer_types[i] == "hybrid":  # FalconH1DecoderLayer: the Mamba-2 mixer beside attention
        yield from mamba_tensors(spec, i)
    if spec.mla is not None:
        m, a = spec.mla, spec.num_attention_heads
        if m.q_lora_rank is None:
            yield from _linear(f"{p}.q_proj", h, a * m.qk_head_dim, False, "attention", i)
        else:
            yield from _linear(f"{p}.q_a_proj", h, m.q_lora_rank, spec.qkv_bias, "attention", i)
            yield from _norm_tensors(spec, f"{p}.q_a_layernorm", m.q_lora_rank, i)
            yield from _linear(f"{p}.q_b_proj", m.q_lora_rank, a * m.qk_head_dim, False, "attention", i)
        yield from _linear(
            f"{p}.kv_a_proj_with_mqa", h, m.kv_lora_rank + m.qk_rope_head_dim, spec.qkv_bias, "attention", i
        )
        yield from _norm_tensors(spec, f"{p}.kv_a_layernorm", m.kv_lora_rank, i)
        yield from _linear(
            f"{p}.kv_b_proj", m.kv_lora_rank, a * (m.qk_nope_head_dim + m.v_head_dim), False, "attention", i
        )
        yield from _linear(f"{p}.o_proj", a * m.v_head_dim, h, spec.o_bias, "attention", i)
        if m.head_gate:  # BailingHybridAttention.g_proj
            yield from _linear(f"{p}.g_proj", h, a, False, "attention", i)
        if m.indexer is not None and m.q_lora_rank is not None and m.indexer.has_indexer(i):
            yield from _dsa_indexer(m.indexer, m.q_lora_rank, h, f"{p}.indexer", i)
        return
    q, kv = spec.q_width, spec.kv_width
    # Qwen3NextAttention: q_proj yields the queries and an output gate of the same width
    yield from _linear(f"{p}.q_proj", h, 2 * q if spec.attn_output_gate else q, spec.qkv_bias, "attention", i)
    shared = i in spec.kv_shared_layers  # Gemma3nTextAttention: no k/v weights on a KV-shared layer
    if not shared:
        yield from _linear(f"{p}.k_proj", h, kv, spec.qkv_bias, "attention", i)
        yield from _linear(f"{p}.v_proj", h, kv, spec.qkv_bias, "attention", i)
    yield from _linear(f"{p}.o_proj", q, h, spec.o_bias, "attention", i)
    if spec.resolved_layer_types[i] == "cross_attention":  # MllamaCrossAttentionDecoderLayer
        yield from _norm_tensors(spec, f"{p}.q_norm", spec.head_dim, i)  # MllamaTextCrossAttention
        yield from _norm_tensors(spec, f"{p}.k_norm", spec.head_dim, i)
        yield Tensor(f"layers.{i}.cross_attn_attn_gate", (1,), "attention", i)
        yield Tensor(f"layers.{i}.cross_attn_mlp_gate", (1,), "attention", i)
    if spec.attention_sinks:  # GptOssAttention.sinks
        yield Tensor(f"{p}.sinks", (spec.num_attention_heads,), "attention", i)
    if spec.qk_norm == "per_head":
        yield from _norm_tensors(spec, f"{p}.q_norm", spec.head_dim, i)
        if not shared:
            yield from _norm_tensors(spec, f"{p}.k_norm", spec.head_dim, i)
    elif spec.qk_norm == "full_width":
        yield from _norm_tensors(spec, f"{p}.q_norm", q, i)
        yield from _norm_tensors(spec, f"{p}.k_norm", kv, i)


def _mlp(prefix: str, h: int, f: int, gated: bool, bias: bool, component: str, i: int) -> Iterator[Tensor]:
    if gated:
        yield from _linear(f"{prefix}.gate_proj", h, f, bias, component, i)
    yield from _linear(f"{prefix}.up_proj", h, f, bias, component, i)
    yield from _linear(f"{prefix}.down_proj", f, h, bias, component, i)


def _feed_forward(spec: ModelSpec, i: int) -> Iterator[Tensor]:
    h, p = spec.hidden_size, f"layers.{i}.mlp"
    if not spec.is_moe_layer(i):
        yield from _mlp(p, h, spec.intermediate_size, spec.mlp_gated, spec.mlp_bias, "mlp", i)
        if spec.activation == "xielu":  # XIELUActivation.alpha_p / alpha_n, [1] each (ApertusMLP.act_fn)
            yield Tensor(f"{p}.act_fn.alpha_p", (1,), "mlp", i)
            yield Tensor(f"{p}.act_fn.alpha_n", (1,), "mlp", i)
        return
    moe = spec.moe
    assert moe is not None
    e, fe = moe.num_experts, moe.expert_intermediate_size
    yield from _linear(f"{p}.gate", h, e, moe.router_bias, "router", i)
    if moe.score_bias_param:  # Ernie4_5_MoeStatics.e_score_correction_bias
        yield Tensor(f"{p}.gate.e_score_correction_bias", (1, e), "router", i)
    # transformers >= 5 fuses the experts: gate_up_proj [E, 2F, h] (or up only), down_proj [E, h, F].
    up_rows = 2 * fe if spec.mlp_gated else fe
    yield Tensor(f"{p}.experts.gate_up_proj", (e, up_rows, h), "routed_experts", i)
    yield Tensor(f"{p}.experts.down_proj", (e, h, fe), "routed_experts", i)
    if moe.expert_bias:
        yield Tensor(f"{p}.experts.gate_up_proj_bias", (e, up_rows), "routed_experts", i)
        yield Tensor(f"{p}.experts.down_proj_bias", (e, h), "routed_experts", i)
    if moe.shared_expert_intermediate_size:
        yield from _mlp(
            f"{p}.shared_experts",
            h,
            moe.shared_expert_intermediate_size,
            spec.mlp_gated,
            spec.mlp_bias,  # Ernie4_5_MoeMLP(config, ...) of the shared experts: bias=config.use_bias
            "shared_experts",
            i,
        )
        if moe.shared_expert_gate:
            yield from _linear(f"{p}.shared_expert_gate", h, 1, False, "shared_experts", i)


def text_tensors(spec: ModelSpec) -> Iterator[Tensor]:
    """Every parameter tensor of the text model, tied weights once."""
    if spec.encoder is not None:  # an encoder and its task head (spec/encoder_params.py)
        from gpumem_gui.core.spec.encoder_params import encoder_tensors

        yield from encoder_tensors(spec)
        return
    if spec.seq2seq is not None:  # an encoder-decoder (spec/seq2seq_params.py)
        from gpumem_gui.core.spec.seq2seq_params import seq2seq_tensors

        yield from seq2seq_tensors(spec)
        return
    if spec.gemma4 is not None:  # Gemma4TextModel (spec/gemma4.py)
        yield from gemma4_tensors(spec, Tensor)
        return
    if spec.deepseek_v4 is not None:  # DeepseekV4ForCausalLM (spec/compressed.py)
        yield from deepseek_v4_tensors(spec, Tensor)
        return
    h, e_dim = spec.hidden_size, spec.token_embedding_dim
    yield Tensor("embed_tokens.weight", (spec.vocab_size + spec.embedding_padding_rows, e_dim), "embedding")
    if spec.position_embedding == "learned":
        yield Tensor("embed_positions.weight", (spec.learned_position_rows, h), "position_embedding")
    if e_dim != h:
        yield from _linear("project_in", e_dim, h, False, "embedding_extra", None)
        yield from _linear("project_out", h, e_dim, False, "embedding_extra", None)
    if spec.embedding_norm:
        yield from _norm_tensors(spec, "embedding_norm", h, None)
    for i in range(spec.num_layers):
        if spec.traits.block == "single":  # NemotronHBlock: one norm and one mixer (spec/mamba.py)
            yield from single_layer_tensors(spec, i)
            continue
        for k in range(spec.norms_per_layer):
            yield from _norm_tensors(spec, f"layers.{i}.norm{k}", h, i)
        yield from _attention(spec, i)
        yield from _feed_forward(spec, i)
    if spec.final_norm:
        yield from _norm_tensors(spec, "norm", h, None)
    if spec.altup is not None:  # Gemma 3n (spec/altup.py)
        yield from altup_tensors(spec, Tensor)
    if not spec.tie_word_embeddings:
        yield from _linear("lm_head", e_dim, spec.vocab_size, spec.lm_head_bias, "lm_head", None)
    elif spec.lm_head_bias:
        yield Tensor("lm_head.bias", (spec.vocab_size,), "lm_head")


@lru_cache(maxsize=256)
def count_params(spec: ModelSpec) -> ParamCounts:
    """Exact parameter counts of ``spec`` (see module docstring); cached, specs are frozen."""
    by = dict.fromkeys(COMPONENTS, 0)
    per_layer = [0] * spec.num_layers
    for t in text_tensors(spec):
        n = t.numel
        by[t.component] += n
        if t.layer is not None:
            per_layer[t.layer] += n
    vision = spec.vision.params if spec.vision else 0
    by["vision"] = vision
    total = sum(by.values())
    routed = by["routed_experts"]
    active = total - routed
    if spec.moe is not None and routed:
        # every MoE layer holds num_experts identical experts; a token uses experts_per_token of them
        active += routed // spec.moe.num_experts * spec.moe.experts_per_token
    lm_head = by["lm_head"]
    return ParamCounts(
        total=total,
        text=total - vision,
        embedding=by["embedding"],
        position_embedding=by["position_embedding"],
        lm_head=lm_head,
        lm_head_tied=spec.tie_word_embeddings,
        routed_experts=routed,
        active_per_token=active,
        vision=vision,
        by_component=by,
        per_layer=tuple(per_layer),
    )
