"""Liveness simulation of a transformers forward pass (inference, ``torch.no_grad``).

transformers allocates deterministically: every op returns a new tensor and Python frees it when its last
name goes away. This module replays, op by op, what ``transformers`` 5.x modeling code allocates and frees
for one forward (a prefill of ``q`` tokens, or a decode step of one token, after ``past`` cached tokens), and
reports the peak of live bytes and what is live at that moment. It is the mechanism behind the
``transformers`` runtime profile; constants are sizes of real tensors, each named after the op that makes it.

The op orders follow the modeling files of transformers 5.24 (``models/llama/modeling_llama.py``:
``LlamaModel.forward``, ``LlamaDecoderLayer``, ``LlamaAttention``, ``LlamaMLP``, ``LlamaRMSNorm``;
``integrations/sdpa_attention.py``; ``cache_utils.py``: ``DynamicLayer.update`` concatenates into a new
tensor, ``DynamicSlidingWindowLayer.update`` keeps a slice *view* of the full concatenation, so its storage
stays full-length until the next step; ``integrations/moe.py``: ``grouped_mm_experts_forward``), and were
checked against PyTorch's own memory tracker (``../shared/reference/groundtruth.json``, ``tests/reference``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

from gpumem_gui.core.spec.model import ModelSpec

Attn = Literal["sdpa", "eager", "flash"]

# What each live tensor is, for the breakdown at the peak.
KINDS = ("kv_cache", "hidden_states", "attention", "mlp", "norm", "logits", "rope", "mask", "inputs")


@dataclass
class Tracker:
    """Live bytes by tensor name, with the peak and the set live at the peak."""

    live: dict[str, tuple[int, str]] = field(default_factory=dict)
    total: int = 0
    kinds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    peak: int = 0
    at_peak: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    peak_where: str = ""
    where: str = ""

    def alloc(self, name: str, nbytes: int, kind: str) -> None:
        if name in self.live:
            self.free(name)
        self.live[name] = (nbytes, kind)
        self.total += nbytes
        self.kinds[kind] += nbytes
        if self.total > self.peak:
            self.peak = self.total
            self.at_peak = dict(self.kinds)
            self.peak_where = self.where

    def free(self, *names: str) -> None:
        for name in names:
            n, kind = self.live.pop(name)
            self.total -= n
            self.kinds[kind] -= n

    def grow(self, name: str, delta: int) -> None:
        """Resize a live tensor group by ``delta`` bytes (the aggregated caches of skipped layers)."""
        n, kind = self.live[name]
        self.live[name] = (n + delta, kind)
        self.total += delta
        self.kinds[kind] += delta
        if self.total > self.peak:
            self.peak = self.total
            self.at_peak = dict(self.kinds)
            self.peak_where = self.where

    def rename(self, old: str, new: str) -> None:
        self.live[new] = self.live.pop(old)

    def has(self, name: str) -> bool:
        return name in self.live

    def by_kind(self) -> dict[str, int]:
        return dict(self.at_peak)


@dataclass(frozen=True)
class ForwardShape:
    """One forward: ``batch`` sequences, ``q`` new tokens each, after ``past`` cached tokens."""

    batch: int
    q: int
    past: int
    dt: int = 2  # activation dtype bytes (bf16/fp16)
    kv_dt: float = 2
    attn: Attn = "sdpa"
    logits_all: bool = False
    lm_head: bool = True  # False for pipeline stages other than the last

    @property
    def kv_len(self) -> int:
        return self.past + self.q


def _norm(tr: Tracker, spec: ModelSpec, src: str, out: str, elems: int, dt: int, kind: str = "norm") -> None:
    """An RMSNorm/LayerNorm of ``elems`` elements from tensor ``src`` into a new tensor ``out``.

    RMSNorm (Llama/Qwen/Gemma): x.float() (4 B), pow(2) (4 B, freed after mean), x * rsqrt(..) (4 B), then the
    cast back (dt) and the weight multiply (dt); Gemma multiplies by (1 + w) in fp32 before the cast.
    LayerNorm (``F.layer_norm``): one output in dt plus per-row statistics.
    """
    f32 = 4 * elems
    if spec.norm == "layernorm":
        tr.alloc(out, dt * elems, kind)
        return
    tr.alloc(f"{out}.f32", f32, kind)
    tr.alloc(f"{out}.pow", f32, kind)
    tr.free(f"{out}.pow")
    tr.alloc(f"{out}.scaled", f32, kind)
    tr.free(f"{out}.f32")
    if spec.traits.norm_weight_offset:
        tr.alloc(f"{out}.weighted", f32, kind)
        tr.free(f"{out}.scaled")
        tr.alloc(out, dt * elems, kind)
        tr.free(f"{out}.weighted")
        return
    tr.alloc(f"{out}.cast", dt * elems, kind)
    tr.free(f"{out}.scaled")
    tr.alloc(out, dt * elems, kind)
    tr.free(f"{out}.cast")


def _rope(tr: Tracker, src: str, out: str, nbytes: int) -> None:
    """``(x * cos) + (rotate_half(x) * sin)``: rotate_half negates one half and concatenates."""
    tr.alloc(f"{out}.xcos", nbytes, "attention")
    tr.alloc(f"{out}.neg", nbytes // 2, "attention")
    tr.alloc(f"{out}.rot", nbytes, "attention")
    tr.free(f"{out}.neg")
    tr.alloc(f"{out}.rsin", nbytes, "attention")
    tr.free(f"{out}.rot")
    tr.alloc(out, nbytes, "attention")
    tr.free(f"{out}.xcos", f"{out}.rsin")


def _cache_tokens_after(spec: ModelSpec, fs: ForwardShape, sliding: bool) -> int:
    """Tokens in a layer's cache storage after this forward's ``torch.cat``: the stored past (a sliding
    layer stores ``window - 1`` tokens as a view) plus the new tokens."""
    past = fs.past
    if sliding and spec.sliding_window:
        past = min(past, spec.sliding_window - 1)
    return past + fs.q


def _cache_elems_per_token(spec: ModelSpec) -> tuple[int, int]:
    """(K, V) elements per token of one layer's cache as transformers stores them."""
    if spec.mla is not None:
        return spec.mla.kv_lora_rank, spec.mla.qk_rope_head_dim
    kvh = spec.num_attention_heads if spec.transformers_expands_kv else spec.num_kv_heads
    return kvh * spec.head_dim, kvh * spec.head_dim


@dataclass(frozen=True)
class _LayerPlan:
    """The layer sequence of a spec as a forward walks it (fixed per spec, so computed once).

    ``replayed`` are the last layer of each kind (attention type x dense/MoE), the layers replayed op by op;
    ``segments`` has one ``(first, layer, sliding)`` per replayed layer in order: layers ``first`` to
    ``layer - 1`` are skipped before it, ``sliding`` of them sliding-window layers. The last layer is the
    last of its kind, so it is always replayed and no layer is skipped after it.
    """

    replayed: frozenset[int]
    segments: tuple[tuple[int, int, int], ...]
    types: frozenset[str]
    sliding_layers: int


@lru_cache(maxsize=256)
def _layer_plan(spec: ModelSpec) -> _LayerPlan:
    types = spec.resolved_layer_types
    last = {(types[i], spec.is_moe_layer(i)): i for i in range(spec.num_layers)}
    replayed = sorted(last.values())
    segments = []
    first = 0
    for layer in replayed:
        segments.append((first, layer, types[first:layer].count("sliding_attention")))
        first = layer + 1
    return _LayerPlan(
        replayed=frozenset(replayed),
        segments=tuple(segments),
        types=frozenset(types),
        sliding_layers=types.count("sliding_attention"),
    )


def _uses_rope(spec: ModelSpec) -> bool:
    return spec.position_embedding == "rope"


def _has_mask(spec: ModelSpec, fs: ForwardShape, sliding: bool) -> bool:
    """Whether this layer's attention gets a materialised mask.

    eager always builds a float mask; sdpa lets ``is_causal`` do the work unless a sliding window actually
    cuts the keys (``_ignore_causal_mask_sdpa`` in masking_utils) or the query is not the whole sequence.
    """
    if fs.attn == "eager":
        return True
    if fs.attn == "flash":
        return False
    if spec.traits.always_mask:
        return True  # FalconModel always passes a mask to its attention (no is_causal shortcut)
    return sliding and spec.sliding_window is not None and fs.kv_len > spec.sliding_window


def _attention(tr: Tracker, spec: ModelSpec, fs: ForwardShape, x: str, layer: int, sliding: bool) -> None:
    """Self-attention of one layer from normed input ``x``.

    Leaves ``attn_out`` (and eager's probabilities, freed when the layer returns)."""
    b, q, dt = fs.batch, fs.q, fs.dt
    a, d = spec.num_attention_heads, spec.head_dim
    kvh = spec.num_attention_heads if spec.transformers_expands_kv else spec.num_kv_heads
    qw, kvw = a * d, kvh * d
    kv_tokens_new = _cache_tokens_after(spec, fs, sliding)
    cache_k, cache_v = f"cache{layer}.k", f"cache{layer}.v"
    tr.where = f"layer {layer} attention"

    if spec.mla is not None:
        m = spec.mla
        qwid = a * m.qk_head_dim
        if m.q_lora_rank:
            tr.alloc("q_a", b * q * m.q_lora_rank * dt, "attention")
            _norm(tr, spec, "q_a", "q_a_n", b * q * m.q_lora_rank, dt, "attention")
            tr.free("q_a")
            tr.alloc("q", b * q * qwid * dt, "attention")
            tr.free("q_a_n")
        else:
            tr.alloc("q", b * q * qwid * dt, "attention")
        tr.alloc("ckv", b * q * (m.kv_lora_rank + m.qk_rope_head_dim) * dt, "attention")
        _norm(tr, spec, "ckv", "k_nope", b * q * m.kv_lora_rank, dt, "attention")
        rope_q = b * q * a * m.qk_rope_head_dim * dt
        _rope(tr, "q", "q_pe", rope_q)
        _rope(tr, "ckv", "k_pe", b * q * m.qk_rope_head_dim * dt)
        # cache update: latent and rope key concatenated into the cache
        _cache_update(
            tr, fs, cache_k, b * kv_tokens_new * m.kv_lora_rank, b * q * m.kv_lora_rank, sliding, spec
        )
        _cache_update(
            tr, fs, cache_v, b * kv_tokens_new * m.qk_rope_head_dim, b * q * m.qk_rope_head_dim, sliding, spec
        )
        tr.free("k_nope", "k_pe", "ckv")
        tr.alloc("query", b * q * qwid * dt, "attention")  # cat(q_nope, q_pe)
        tr.free("q", "q_pe")
        # expand_kv: per-head K (nope + rope) and V from the latent, for every cached token
        tr.alloc("k_full", b * a * kv_tokens_new * m.qk_head_dim * dt, "attention")
        tr.alloc("v_full", b * a * kv_tokens_new * m.v_head_dim * dt, "attention")
        _core_attention(tr, spec, fs, "query", "k_full", "v_full", a, m.v_head_dim, a, sliding)
        tr.free("query", "k_full", "v_full")
        tr.alloc("attn_out", b * q * spec.hidden_size * dt, "attention")
        tr.free("attn_o")
        return

    tr.alloc("q", b * q * qw * dt, "attention")
    tr.alloc("k", b * q * kvw * dt, "attention")
    tr.alloc("v", b * q * kvw * dt, "attention")
    if spec.qk_norm != "none":
        for t, w in (("q", qw), ("k", kvw)):
            _norm(tr, spec, t, f"{t}_n", b * q * w, dt, "attention")
            tr.free(t)
            tr.alloc(t, b * q * w * dt, "attention")
            tr.free(f"{t}_n")
    if _uses_rope(spec):
        _rope(tr, "q", "q_r", b * q * qw * dt)
        _rope(tr, "k", "k_r", b * q * kvw * dt)
        tr.free("q", "k")
        q_name, k_name = "q_r", "k_r"
    else:
        q_name, k_name = "q", "k"
    _cache_update(tr, fs, cache_k, b * kv_tokens_new * kvw, b * q * kvw, sliding, spec)
    _cache_update(tr, fs, cache_v, b * kv_tokens_new * kvw, b * q * kvw, sliding, spec)
    tr.free(k_name, "v")
    _core_attention(tr, spec, fs, q_name, cache_k, cache_v, kvh, d, a, sliding)
    tr.free(q_name)
    tr.alloc("attn_out", b * q * spec.hidden_size * dt, "attention")  # o_proj
    tr.free("attn_o")


def _cache_update(
    tr: Tracker, fs: ForwardShape, name: str, elems_after: int, elems_new: int, sliding: bool, spec: ModelSpec
) -> None:
    """``torch.cat([cache, new])`` into a new tensor; the old cache tensor is freed.

    The stored part before this step is the full past for full layers; for sliding layers the slice view
    of the previous step's concatenation, whose storage is what the previous step allocated.
    """
    tr.alloc(f"{name}.new", round(elems_after * fs.kv_dt), "kv_cache")
    if tr.has(name):
        tr.free(name)
    tr.rename(f"{name}.new", name)


def _core_attention(
    tr: Tracker,
    spec: ModelSpec,
    fs: ForwardShape,
    qn: str,
    kn: str,
    vn: str,
    kvh: int,
    vd: int,
    a: int,
    sliding: bool,
) -> None:
    """softmax(QK^T)V by the chosen implementation; leaves ``attn_o`` of shape [b, q, a*vd]."""
    b, q, dt, kv = fs.batch, fs.q, fs.dt, fs.kv_len
    if sliding and spec.sliding_window and fs.past:
        kv = min(kv, spec.sliding_window)  # decode: the cache returns the window
    groups = a // kvh
    mask = _has_mask(spec, fs, sliding)
    k_elems_per_head = spec.mla.qk_head_dim if spec.mla else spec.head_dim
    repeat = groups > 1 and (fs.attn == "eager" or (fs.attn == "sdpa" and mask and q > 1))
    if repeat:
        tr.alloc("k_rep", b * a * kv * k_elems_per_head * dt, "attention")
        tr.alloc("v_rep", b * a * kv * vd * dt, "attention")
    if spec.traits.always_mask and mask:
        tr.alloc("mask_float", b * q * kv * dt, "mask")  # torch.where(mask, 0, min) inside FalconAttention
    if fs.attn == "sdpa" and _math_sdpa(spec, mask):
        _math_attention(tr, spec, fs, a, kvh, kv, k_elems_per_head, vd, mask)
    elif fs.attn == "eager" and not _eager_softmax_fp32(spec):
        # GPT-2 / Falcon eager: softmax stays in the activation dtype
        s = b * a * q * kv
        tr.alloc("scores", s * dt, "attention")
        tr.alloc("scores_scaled", s * dt, "attention")
        tr.free("scores")
        tr.alloc("scores_masked", s * dt, "attention")
        tr.free("scores_scaled")
        tr.alloc("probs", s * dt, "attention")
        tr.free("scores_masked")
        tr.alloc("attn_raw", b * a * q * vd * dt, "attention")
        tr.alloc("attn_o", b * q * a * vd * dt, "attention")
        tr.free("attn_raw")
    elif fs.attn == "eager":
        s = b * a * q * kv
        tr.alloc("scores", s * dt, "attention")
        tr.alloc("scores_scaled", s * dt, "attention")
        tr.free("scores")
        tr.alloc("scores_masked", s * dt, "attention")
        tr.free("scores_scaled")
        tr.alloc("scores_f32", s * 4, "attention")
        tr.alloc("probs_f32", s * 4, "attention")
        tr.free("scores_f32")
        tr.alloc("probs", s * dt, "attention")
        tr.free("probs_f32", "scores_masked")
        tr.alloc("attn_raw", b * a * q * vd * dt, "attention")
        tr.alloc("attn_o", b * q * a * vd * dt, "attention")  # transpose(1, 2).contiguous()
        tr.free("attn_raw")
        # the probabilities are returned as attn_weights and live until the decoder layer returns
    else:
        # sdpa / flash kernels: output plus fp32 log-sum-exp per query row
        tr.alloc("attn_raw", b * a * q * vd * dt, "attention")
        tr.alloc("lse", b * a * q * 4, "attention")
        tr.free("lse")
        tr.alloc("attn_o", b * q * a * vd * dt, "attention")
        tr.free("attn_raw")
    if repeat:
        tr.free("k_rep", "v_rep")
    if tr.has("mask_float"):
        tr.free("mask_float")


def _eager_softmax_fp32(spec: ModelSpec) -> bool:
    """Llama-style eager attention upcasts the softmax to fp32; GPT-2's and Falcon's do not."""
    return spec.traits.eager_softmax_fp32


def _math_sdpa(spec: ModelSpec, mask: bool) -> bool:
    """Cases where torch's SDPA falls back to its math path (fp32 scores), as measured on the reference:
    a single KV head broadcast to all query heads with a mask (Falcon multi-query), and MLA's unequal
    query/key and value head dims, which the fused CPU kernel rejects."""
    if spec.mla is not None:
        return spec.mla.qk_head_dim != spec.mla.v_head_dim
    return spec.traits.sdpa_broadcast_kv and spec.num_kv_heads < spec.num_attention_heads


def _math_attention(
    tr: Tracker, spec: ModelSpec, fs: ForwardShape, a: int, kvh: int, kv: int, kd: int, vd: int, mask: bool
) -> None:
    """torch's ``_scaled_dot_product_attention_math`` for bf16 inputs: q/k/v copied to fp32, q scaled,
    fp32 scores (and the masked scores), fp32 softmax, fp32 output cast back."""
    b, q, dt = fs.batch, fs.q, fs.dt
    s = b * a * q * kv
    tr.alloc("q32", b * a * q * kd * 4, "attention")
    tr.alloc("k32", b * kvh * kv * kd * 4, "attention")
    tr.alloc("v32", b * kvh * kv * vd * 4, "attention")
    tr.alloc("q32s", b * a * q * kd * 4, "attention")
    tr.alloc("scores32", s * 4, "attention")
    tr.alloc("masked32", s * 4, "attention")
    tr.free("scores32")
    tr.alloc("probs32", s * 4, "attention")
    tr.free("masked32")
    tr.alloc("out32", b * a * q * vd * 4, "attention")
    tr.free("probs32", "q32", "k32", "v32", "q32s")
    tr.alloc("attn_raw", b * a * q * vd * dt, "attention")
    tr.free("out32")
    tr.alloc("attn_o", b * q * a * vd * dt, "attention")
    tr.free("attn_raw")


def _mlp(tr: Tracker, spec: ModelSpec, fs: ForwardShape, x: str, layer: int) -> None:
    """Feed-forward of one layer from normed input ``x``; leaves ``mlp_out``."""
    b, q, dt, h = fs.batch, fs.q, fs.dt, spec.hidden_size
    t = b * q
    tr.where = f"layer {layer} MLP"
    if spec.is_moe_layer(layer):
        _moe(tr, spec, fs, t)
        return
    f = spec.intermediate_size
    if not spec.mlp_gated:
        tr.alloc("fc", t * f * dt, "mlp")
        if spec.activation == "gelu_new":
            # NewGELUActivation: 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))) keeps ~3 temporaries of x's size
            for i in range(3):
                tr.alloc(f"gelu{i}", t * f * dt, "mlp")
            for i in range(3):
                tr.free(f"gelu{i}")
        tr.alloc("act", t * f * dt, "mlp")
        tr.free("fc")
        tr.alloc("mlp_out", t * h * dt, "mlp")
        tr.free("act")
        return
    if spec.traits.fused_gate_up:
        tr.alloc("gate_up", t * 2 * f * dt, "mlp")  # fused gate_up_proj, chunked into views
        tr.alloc("act", t * f * dt, "mlp")
        tr.alloc("prod", t * f * dt, "mlp")
        tr.free("act")
        tr.alloc("mlp_out", t * h * dt, "mlp")
        tr.free("prod", "gate_up")
        return
    tr.alloc("gate", t * f * dt, "mlp")
    tr.alloc("act", t * f * dt, "mlp")
    tr.free("gate")
    tr.alloc("up", t * f * dt, "mlp")
    tr.alloc("prod", t * f * dt, "mlp")
    tr.free("act", "up")
    tr.alloc("mlp_out", t * h * dt, "mlp")
    tr.free("prod")


def _moe(tr: Tracker, spec: ModelSpec, fs: ForwardShape, t: int) -> None:
    """transformers' grouped_mm experts: tokens are gathered per expert (t x k rows), projected, gated,
    projected back, weighted, un-permuted and summed over k; shared experts run beside them."""
    moe = spec.moe
    assert moe is not None
    dt, h, e, k, fe = (
        fs.dt,
        spec.hidden_size,
        moe.num_experts,
        moe.experts_per_token,
        moe.expert_intermediate_size,
    )
    s = t * k
    tr.alloc("router_logits", t * e * dt, "mlp")
    tr.alloc("router_probs", t * e * 4, "mlp")
    tr.alloc("topk", t * k * (4 + 8), "mlp")
    tr.free("router_probs")
    tr.alloc("sorted_ids", s * 8 * 2, "mlp")
    tr.alloc("selected", s * h * dt, "mlp")
    up_rows = 2 * fe if spec.mlp_gated else fe
    tr.alloc("experts_up", s * up_rows * dt, "mlp")
    if spec.mlp_gated:
        tr.alloc("experts_act", s * fe * dt, "mlp")
        tr.alloc("experts_prod", s * fe * dt, "mlp")
        tr.free("experts_act", "experts_up")
    else:
        tr.alloc("experts_prod", s * fe * dt, "mlp")
        tr.free("experts_up")
    tr.alloc("experts_down", s * h * dt, "mlp")
    tr.free("experts_prod")
    tr.alloc("weighted", s * h * dt, "mlp")
    tr.free("experts_down")
    tr.alloc("unpermuted", s * h * dt, "mlp")
    tr.free("weighted")
    tr.alloc("moe_sum", t * h * dt, "mlp")
    tr.free("unpermuted", "selected", "sorted_ids", "topk", "router_logits")
    if moe.shared_expert_intermediate_size:
        fs_ = moe.shared_expert_intermediate_size
        tr.alloc("sh_gate", t * fs_ * dt, "mlp")
        tr.alloc("sh_act", t * fs_ * dt, "mlp")
        tr.free("sh_gate")
        tr.alloc("sh_up", t * fs_ * dt, "mlp")
        tr.alloc("sh_prod", t * fs_ * dt, "mlp")
        tr.free("sh_act", "sh_up")
        tr.alloc("sh_out", t * h * dt, "mlp")
        tr.free("sh_prod")
        tr.alloc("mlp_out", t * h * dt, "mlp")
        tr.free("sh_out", "moe_sum")
    else:
        tr.rename("moe_sum", "mlp_out")


def _layer(tr: Tracker, spec: ModelSpec, fs: ForwardShape, layer: int, sliding: bool) -> None:
    """One decoder layer; enters with ``h_in`` live (held by the caller) and leaves ``h_out``."""
    b, q, dt, h = fs.batch, fs.q, fs.dt, spec.hidden_size
    act = b * q * h
    post_norms = spec.traits.norm_placement != "pre"
    if spec.traits.norm_placement == "post":
        _attention(tr, spec, fs, "h_in", layer, sliding)
    else:
        _norm(tr, spec, "h_in", "x1", act, dt)
        _attention(tr, spec, fs, "x1", layer, sliding)
        tr.free("x1")
    if post_norms:
        _norm(tr, spec, "attn_out", "attn_n", act, dt)
        tr.free("attn_out")
        tr.rename("attn_n", "attn_out")
    if spec.parallel_attn_mlp:
        _norm(tr, spec, "h_in", "x2", act, dt)
        _mlp(tr, spec, fs, "x2", layer)
        tr.free("x2")
        tr.alloc("h_mid", act * dt, "hidden_states")
        tr.free("attn_out")
        tr.alloc("h_out", act * dt, "hidden_states")
        tr.free("h_mid", "mlp_out")
    else:
        tr.alloc("h_mid", act * dt, "hidden_states")  # residual + attention
        tr.free("attn_out")
        if spec.traits.norm_placement == "post":
            _mlp(tr, spec, fs, "h_mid", layer)
        else:
            _norm(tr, spec, "h_mid", "x2", act, dt)
            _mlp(tr, spec, fs, "x2", layer)
            tr.free("x2")
        if post_norms:
            _norm(tr, spec, "mlp_out", "mlp_n", act, dt)
            tr.free("mlp_out")
            tr.rename("mlp_n", "mlp_out")
        tr.alloc("h_out", act * dt, "hidden_states")
        tr.free("mlp_out", "h_mid")
    if tr.has("probs"):
        tr.free("probs")


@dataclass(frozen=True)
class SimResult:
    """Peak of one simulated forward and what was live at it (bytes by kind), excluding weights."""

    peak: int
    where: str
    by_kind: dict[str, int]
    kv_cache_storage: int  # cache storage held at the end of the forward
    kv_cache_logical: int  # bytes of the cache tensors as views (sliding layers: window - 1 tokens)
    logits: int


def _rope_bytes(spec: ModelSpec, fs: ForwardShape) -> int:
    if not _uses_rope(spec):
        return 0
    d = spec.mla.qk_rope_head_dim if spec.mla else spec.head_dim
    n_rotary = 2 if spec.traits.rotary_per_layer_type else 1  # Gemma-3: local and global rotary
    return n_rotary * 2 * fs.q * d * fs.dt  # cos and sin, [1, q, d] (position_ids has batch 1)


def simulate_forward(
    spec: ModelSpec, fs: ForwardShape, past_storage: tuple[int, ...] | None = None
) -> SimResult:
    """Simulate one forward of ``spec`` with shape ``fs`` (see module docstring).

    ``past_storage`` gives each layer's cache storage before the forward (bytes; prefill: zeros).
    """
    b, q, dt, h = fs.batch, fs.q, fs.dt, spec.hidden_size
    types = spec.resolved_layer_types
    n = spec.num_layers
    storage = list(past_storage) if past_storage is not None else [0] * n
    tr = Tracker()
    tr.where = "embedding"
    tr.alloc("input_ids", b * q * 8, "inputs")
    tr.alloc("embeds", b * q * spec.token_embedding_dim * dt, "hidden_states")
    if spec.embedding_dim and spec.embedding_dim != h:
        tr.alloc("embeds_proj", b * q * h * dt, "hidden_states")
    tr.alloc("position_ids", q * 8, "inputs")
    if spec.position_embedding == "learned":
        tr.alloc("pos_embeds", q * h * dt, "hidden_states")
        tr.alloc("h0", b * q * h * dt, "hidden_states")
    rope = _rope_bytes(spec, fs)
    if rope:
        tr.alloc("cos_sin", rope, "rope")
    plan = _layer_plan(spec)
    n_masks = (1 if "full_attention" in plan.types else 0) + (1 if "sliding_attention" in plan.types else 0)
    if fs.attn == "eager":
        tr.alloc("mask", n_masks * b * q * fs.kv_len * dt, "mask")
    elif fs.attn == "sdpa" and any(_has_mask(spec, fs, t == "sliding_attention") for t in plan.types):
        tr.alloc("mask", b * q * fs.kv_len, "mask")  # boolean sliding mask
    if spec.position_embedding == "alibi":
        tr.alloc("alibi", b * spec.num_attention_heads * fs.kv_len * 4, "mask")
    # Only the last layer of each kind is replayed op by op (its transient peak sits on the most cache);
    # the caches of the other layers are one aggregate.
    replayed = plan.replayed
    # Caches of all layers, as stored before this forward.
    for i in replayed:
        if storage[i]:
            tr.alloc(f"cache{i}.k", storage[i] // 2, "kv_cache")
            tr.alloc(f"cache{i}.v", storage[i] - storage[i] // 2, "kv_cache")
    tr.alloc("caches_other", sum(storage) - sum(storage[i] for i in replayed), "kv_cache")
    # The first layer's input is the embedding output itself (held by the caller and by inputs_embeds).
    tr.alloc("h_in", 0, "hidden_states")
    k, v = _cache_elems_per_token(spec)
    after = {
        sl: round(fs.batch * _cache_tokens_after(spec, fs, sl) * k * fs.kv_dt)
        + round(fs.batch * _cache_tokens_after(spec, fs, sl) * v * fs.kv_dt)
        for sl in (False, True)
    }
    for first, layer, sliding_skipped in plan.segments:
        if layer > first:
            # Layers first..layer-1 are skipped: a skipped layer's transient peak is dominated by the replayed
            # layer of its kind (same ops, more cache below it), so only its lasting effects count, its output
            # and its cache (the growth of all of them applied before the next replayed layer).
            if tr.live["h_in"][0] == 0:
                tr.free("h_in")
                tr.alloc("h_in", b * q * h * dt, "hidden_states")
            full_skipped = layer - first - sliding_skipped
            growth = full_skipped * after[False] + sliding_skipped * after[True] - sum(storage[first:layer])
            if growth:
                tr.grow("caches_other", growth)
        _layer(tr, spec, fs, layer, types[layer] == "sliding_attention")
        tr.free("h_in")
        tr.rename("h_out", "h_in")
    tr.where = "final norm"
    _norm(tr, spec, "h_in", "h_final", b * q * h, dt)
    # The model's forward returns: its inputs, masks, rotary tables and the last layer output are freed.
    for name in (
        "h_in",
        "embeds",
        "embeds_proj",
        "embeds_scaled",
        "pos_embeds",
        "h0",
        "cos_sin",
        "mask",
        "alibi",
        "position_ids",
    ):
        if tr.has(name):
            tr.free(name)
    if spec.embedding_dim and spec.embedding_dim != h:
        tr.alloc("h_proj_out", b * q * spec.embedding_dim * dt, "hidden_states")
    tr.where = "lm_head"
    keep = q if fs.logits_all else 1
    logits = b * keep * spec.vocab_size * dt if fs.lm_head else 0
    tr.alloc("logits", logits, "logits")
    if spec.final_logit_softcapping and logits:
        # logits / cap, tanh, * cap: each a new tensor while the previous one is alive
        tr.alloc("logits_capped", logits, "logits")
        tr.free("logits")
        tr.rename("logits_capped", "logits")
    kv_storage = tr.kinds["kv_cache"]
    if spec.mla is not None:
        per_tok = b * (spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim) * fs.kv_dt
    else:
        kvh = spec.num_attention_heads if spec.transformers_expands_kv else spec.num_kv_heads
        per_tok = b * 2 * kvh * spec.head_dim * fs.kv_dt
    sliding_toks = min(fs.kv_len, spec.sliding_window - 1) if spec.sliding_window else fs.kv_len
    logical = (n - plan.sliding_layers) * round(per_tok * fs.kv_len) + plan.sliding_layers * round(
        per_tok * sliding_toks
    )
    return SimResult(
        peak=tr.peak,
        where=tr.peak_where,
        by_kind=tr.by_kind(),
        kv_cache_storage=kv_storage,
        kv_cache_logical=logical,
        logits=logits,
    )
