"""DeBERTa-v2/v3's encoder forward on symbolic tensors (transformers 5.24
``models/deberta_v2/modeling_deberta_v2.py``), for :class:`~gpumem_gui.core.replay.encoder.EncoderModel`:

* ``DebertaV2Model.forward``: ``attention_mask = ones(b, q)`` (fp32) and ``token_type_ids = zeros(b, q)``,
  held to the end; ``DebertaV2Embeddings`` (lookup, an unused ``zeros_like`` of it, LayerNorm, ``* mask``,
  dropout).
* ``DebertaV2Encoder.forward``: the [b, 1, q, q] fp32 mask (``get_attention_mask``), the log-bucketed relative
  positions (``build_relative_position``: int64 / fp32 [q, q] steps, an int64 [1, q, q] result), the normed
  ``rel_embeddings`` table, and every layer's output kept in ``all_hidden_states`` (``output_hidden_states``
  is always on) until the model returns.
* ``DisentangledSelfAttention``: q/k/v made contiguous per head, ``bmm(q, k^T / scale)``; per layer the
  dropped-out relative table projected by the shared query/key projections and repeated over the batch, the
  c2p and p2c scores (bmm over 2 x span positions, clamp, gather, / scale) summed; ``masked_fill`` with the
  inverted boolean mask, softmax in the activation dtype, dropout, ``bmm`` with v, permuted back.
* The heads: ``ContextPooler`` (dropout, dense, act) + dropout + classifier, the token classifier, the legacy
  MLM head.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpumem_gui.core.replay import mlp
from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import EncoderLike as EncoderModel


def _relative_positions(m: EncoderModel) -> T:
    """build_relative_position with make_log_bucket_position: [q, q] int64 and fp32 steps, each freed when
    the next is made; the int64 [1, q, q] result."""
    s, q = m.s, m.cfg.q
    n = q * q
    rel = s.new(n, "i64")  # q_ids[:, None] - k_ids[None, :]
    sign = s.new(n, "i64")
    cond = s.new(n, "bool")
    absolute = s.new(n, "i64")
    abs_pos = s.new(n, "i64")  # torch.where(...)
    del cond, absolute
    steps = [s.new(n, "f32") for _ in range(2)]  # abs_pos / mid, log()
    for _ in range(4):  # / log(...), * (mid - 1), ceil, + mid
        steps = [steps[1], s.new(n, "f32")]
    log_pos = steps[1]
    del steps
    near = s.new(n, "bool")  # abs_pos <= mid
    rel_f = s.new(n, "f32")  # relative_pos.type_as(log_pos)
    signed = s.new(n, "f32")  # log_pos * sign
    bucket = s.new(n, "f32")  # torch.where
    del near, rel_f, signed, sign, abs_pos, log_pos, rel
    out = s.new(n, "i64")  # .to(torch.long)
    del bucket
    return out


def _scores(m: EncoderModel, i: int, q: T, k: T, rel_emb: T, relative_pos: T) -> T:
    """disentangled_attention_bias (c2p and p2c with shared keys): the relative score [b * heads, q, q]."""
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    enc = spec.encoder
    assert enc is not None
    b, n, a = cfg.batch, cfg.q, spec.num_attention_heads
    span2 = 2 * enc.relative_span
    pre = f"layers.{i}.self_attn"
    pos_rows = b * a * span2 * spec.head_dim

    def project(name: str) -> T:  # transpose_for_scores(proj(rel_embeddings)).repeat(b, 1, 1)
        x = m.linear(rel_emb, f"{pre}.{name}")
        heads = o.clone(x)  # permute(0, 2, 1, 3).contiguous()
        del x
        out = s.new(pos_rows, heads.dt)
        s.node("pass", (heads,), (out,))
        return out

    pos_query, pos_key = project("q_proj"), project("k_proj")
    qq = b * a * n * n

    def gathered(left: T, right: T, index: T) -> T:  # torch.gather(bmm(left, right^T), -1, index)
        att = o.bmm(left, right, b * a * n * span2)
        g = s.new(qq, att.dt)
        s.node("copy", (att,), (g,), (index, att))  # gather's backward saves its input and the index
        return g

    c2p_index = _clamped(m, relative_pos)
    c2p_att = gathered(q, pos_key, c2p_index)  # the local c2p_att holds it to the function's end
    score = o.add(o.mul(c2p_att, None), None)  # 0 + c2p_att / scale: a new tensor
    p2c_index = _clamped(m, relative_pos)
    p2c_att = gathered(k, pos_query, p2c_index)
    p2c = o.mul(p2c_att, None)
    out = T(score.st, qq, score.dt)  # score += p2c_att / scale: in place, no new storage
    s.node("pass", (score, p2c), (out,))
    del c2p_att, p2c_att, p2c, pos_query, pos_key
    return out


def _clamped(m: EncoderModel, relative_pos: T) -> T:
    """``torch.clamp(±relative_pos + att_span, 0, 2 * att_span - 1)``: [q, q] int64 steps."""
    s, n = m.s, m.cfg.q * m.cfg.q
    a = s.new(n, "i64")
    b = s.new(n, "i64")
    del a
    out = s.new(n, "i64")
    del b
    return out


def _heads(m: EncoderModel, x: T, name: str) -> T:
    """transpose_for_scores(linear(x)): the projection made contiguous per head ([b * heads, q, d])."""
    y = m.linear(x, name)
    out = m.o.clone(y)
    del y
    return out


def attention(m: EncoderModel, i: int, x: T, mask: T, rel_emb: T, relative_pos: T) -> T:
    """DisentangledSelfAttention.forward: the context [b, q, hidden] (before the output dense)."""
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    b, n, a, d = cfg.batch, cfg.q, spec.num_attention_heads, spec.head_dim
    pre = f"layers.{i}.self_attn"
    q = _heads(m, x, f"{pre}.q_proj")
    k = _heads(m, x, f"{pre}.k_proj")
    v = _heads(m, x, f"{pre}.v_proj")
    qq = b * a * n * n
    scores = o.bmm(q, o.mul(k, None), qq)  # bmm(q, k^T / scale)
    rel = o.dropout(rel_emb, cfg.dropout)  # pos_dropout
    rel_att = _scores(m, i, q, k, rel, relative_pos)
    del rel
    scores = o.add(scores, rel_att, qq)
    boolean = s.new(b * n * n, "bool")  # attention_mask.bool()
    inverted = s.new(b * n * n, "bool")  # ~attention_mask
    filled = s.new(qq, scores.dt)
    s.node("copy", (scores,), (filled,), (inverted,))
    del inverted
    scores = filled
    del filled
    probs = s.new(qq, scores.dt)  # softmax in the activation dtype
    s.node("copy", (scores,), (probs,), (probs,))
    probs = o.dropout(probs, cfg.attn_dropout)
    ctx = o.bmm(probs, v, b * n * a * d)
    out = o.clone(ctx)  # view, permute(0, 2, 1, 3).contiguous()
    del ctx, probs, scores, boolean, rel_att, q, k, v
    return out


def layer(m: EncoderModel, i: int, hidden: T, mask: T, rel_emb: T, relative_pos: T) -> T:
    """DebertaV2Layer.forward: attention, DebertaV2SelfOutput, intermediate, DebertaV2Output (post-norm)."""
    o, s, cfg = m.o, m.s, m.cfg
    s.tr.where = f"layer {i} attention"
    s.region = "attention"
    ctx = attention(m, i, hidden, mask, rel_emb, relative_pos)
    x = o.dropout(m.linear(ctx, f"layers.{i}.self_attn.o_proj"), cfg.dropout)
    del ctx
    s.region = "hidden_states"
    x = o.add(x, hidden)
    attention_output = m.region_norm(x, f"layers.{i}.norm0")
    del x
    s.tr.where = f"layer {i} MLP"
    s.region = "mlp"
    inter = mlp.act(m, m.linear(attention_output, f"layers.{i}.mlp.up_proj"))
    y = o.dropout(m.linear(inter, f"layers.{i}.mlp.down_proj"), cfg.dropout)
    del inter
    s.region = "hidden_states"
    y = o.add(y, attention_output)
    del attention_output
    return m.region_norm(y, f"layers.{i}.norm1")


def encode(m: EncoderModel, ids: T, layers: Sequence[int]) -> T:
    """DebertaV2Model.forward up to the last layer's output."""
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    b, n, t, h = cfg.batch, cfg.q, cfg.tokens, spec.hidden_size
    s.tr.where = "embedding"
    s.region = "inputs"
    ones = s.new(t, "f32")  # attention_mask = torch.ones(input_shape)
    token_types = s.new(t, "i64")  # token_type_ids = torch.zeros(...)
    s.region = "hidden_states"
    w = m.param("embed_tokens.weight")
    emb = s.new(t * h, w.dt)
    s.node("copy", (w,), (emb,), (ids,))
    zeros = s.new(t * h, emb.dt)  # position_embeddings = torch.zeros_like(inputs_embeds)
    normed = m.norm(emb, "embedding_norm")
    mask_dt = s.cast(ones, normed.dt)  # mask.unsqueeze(2).to(embeddings.dtype)
    hidden = o.dropout(o.mul(normed, mask_dt, normed.n), cfg.dropout)
    del emb, zeros, normed, mask_dt
    s.region = "mask"
    mask = s.new(b * n * n, "f32")  # get_attention_mask: ext * ext.squeeze(-2).unsqueeze(-1)
    s.region = "inputs"
    relative_pos = _relative_positions(m)
    s.region = "hidden_states"
    rel_emb = m.norm(m.param("rel.embed_positions.weight"), "rel_norm")
    kept = [hidden]  # all_hidden_states
    for i in layers:
        s.hooks.enter_unit(s, i, (-1,))
        if cfg.grad_ckpt and (i + 1) % cfg.ckpt_every == 0:  # GradientCheckpointingLayer
            hidden = s.checkpoint(layer, m, i, hidden, mask, rel_emb, relative_pos)
        else:
            hidden = layer(m, i, hidden, mask, rel_emb, relative_pos)
        kept.append(hidden)
    s.hooks.enter_unit(s, -1)
    s.unit = None
    del kept, mask, relative_pos, rel_emb, ones, token_types
    return hidden


def head(m: EncoderModel, last: T) -> T:
    """ContextPooler (dropout, dense, act) + dropout + classifier; the token classifier; the legacy MLM
    head."""
    o, spec = m.o, m.spec
    enc = spec.encoder
    assert enc is not None
    p = m._classifier_dropout()
    if enc.head == "sequence_classification":
        x = mlp.act(m, m.linear(m._first_token(last), "pooler.dense"))
        return m.linear(o.dropout(x, p), "classifier")
    if enc.head == "token_classification":
        return m.linear(o.dropout(last, p), "classifier")
    x = m.norm(mlp.act(m, m.linear(last, "head.dense")), "head.norm")
    return o.linear(
        x, m.param("embed_tokens.weight"), m.param("lm_head.bias"), spec.vocab_size, spec.hidden_size
    )
