"""DeepSeek-V4's attention on symbolic tensors (transformers 5.24
``models/deepseek_v4/modeling_deepseek_v4.py`` ``DeepseekV4Attention``, ``DeepseekV4HCACompressor``,
``DeepseekV4CSACompressor``, ``DeepseekV4Indexer``, ``DeepseekV4IndexerScorer`` and the cache layers
``DeepseekV4HCACache`` / ``DeepseekV4CSACache``).

* The query through ``q_a_proj``, the fp32-weight ``q_a_norm`` (its output, ``q_residual``, also feeds the
  indexer), ``q_b_proj`` and the unweighted ``q_b_norm``, then the interleaved rotary; one shared K=V head
  (``kv_proj``, ``kv_norm``, rotary); the sliding cache concatenates it (a CSA / HCA layer keeps one tensor
  for keys and values, a sliding layer two: ``DynamicSlidingWindowLayer``).
* A compressor projects ``kv`` and ``gate`` (CSA: ``2 x head_dim``, two overlapping series laid out in
  ``new_kv`` / ``new_gate`` of ``2 x rate`` slots), adds the fp32 ``position_bias``, softmaxes the gate in
  fp32 over each window, sums, normalises and rotates one entry per closed window. With a cache the
  projections of the tokens after the last closed window stay in the cache as views of the projection (the
  whole projection's storage stays with them); the entries are concatenated onto the running ones.
* CSA's indexer does the same at ``index_head_dim``, scores every query head against every compressed entry
  in fp32 (``[b, q, heads, entries]``), keeps the top ``index_topk`` and builds a ``[b, 1, q, entries + 1]``
  block bias from them; HCA's compressor builds a causal one.
* Eager attention with the per-head sinks (gpt-oss's kernel, ``replay/sinks.py``, reached through
  ``attention_kernels.EAGER``) over the window's keys and the compressed entries, the model's mask
  concatenated with the block bias; the output's rope slice rotated back (``-sin``), the grouped ``o_a_proj``
  (a bmm per group, its transposed output reshaped into a copy) and ``o_b_proj``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpumem_gui.core.replay import attention_kernels as kernels
from gpumem_gui.core.replay.dsv4_ops import op, rope, tables, unweighted_norm, weighted_norm
from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


class LayerCache:
    """One DeepSeek-V4 cache layer's tensors (None: no cache, training): what the layer held before this
    forward (one aggregate of the rule's bytes) until the forward replaces it, then the tensors it keeps."""

    def __init__(self, held: list[T]) -> None:
        self.held = held
        self.new: list[T] = []

    def keep(self, *tensors: T) -> None:
        self.new.extend(tensors)

    def release(self) -> None:
        self.held = []

    def done(self) -> None:
        self.held, self.new = self.new, []

    @property
    def nbytes(self) -> int:
        """The storage it holds (a view keeps its whole storage; each storage once)."""
        return sum({id(t.st): t.st.nbytes for t in self.held if t.st is not None}.values())


def _windows(m: CausalLM, rate: int, cached: bool) -> tuple[Any, Any]:
    """(tokens the compressor compresses now, the entries it then has): with a cache the buffered tokens of
    the previous calls join the new ones (``store_compression_weights``)."""
    cfg = m.cfg
    past = cfg.past if cached else 0
    buffered = past % rate if cached else 0
    n = buffered + cfg.q
    usable = (n // rate) * rate
    return usable, (past + cfg.q) // rate


def _project(m: CausalLM, pre: str, x: T, width: int, rate: int, c: LayerCache | None) -> tuple[T, T, Any]:
    """kv_proj / gate_proj, joined to the buffered tokens of the cache; the compressible tokens."""
    cfg = m.cfg
    kv = m.linear(x, f"{pre}.kv_proj")
    gate = m.linear(x, f"{pre}.gate_proj")
    usable, _ = _windows(m, rate, c is not None)
    if c is not None and cfg.past % rate:  # torch.cat([buffered, new]) of kv and gate
        n = cfg.batch * (cfg.past % rate + cfg.q) * width
        kv, gate = op(m, n, kv.dt, (kv,)), op(m, n, gate.dt, (gate,))
    if c is not None:  # buffer_kv / buffer_gate: views of what is left, holding the whole storage
        c.keep(kv, gate)
    return kv, gate, usable


def _pool(
    m: CausalLM, pre: str, kv: T, gate: T, usable: Any, dim: int, overlap: bool, c: LayerCache | None
) -> tuple[T, list[T]]:
    """One compressor's closed windows: ``chunk_gate + position_bias`` (fp32), the overlap layout (CSA), the
    fp32 softmax cast back, ``(kv * weights).sum(dim=2)``, kv_norm and the rotary at the windows' positions.
    Returns the entries and the locals the compressor's forward keeps until it returns (``chunk_gate``,
    ``new_kv``, ``new_gate``, ``positions``, ``cos``, ``sin``)."""
    o, s, cfg = m.o, m.s, m.cfg
    b = cfg.batch
    rows = b * usable * (2 * dim if overlap else dim)  # the chunk's elements (CSA: two series)
    bias = m.param(f"{pre}.position_bias")
    g = op(m, rows, "f32", (gate, bias))
    held = [g]
    if overlap:
        new_kv = op(m, rows, kv.dt, (kv,))  # new_zeros, slices of chunk_kv copied in
        new_gate = op(m, rows, "f32", (g,))  # new_full(-inf), slices of chunk_gate copied in
        if c is not None:  # update_overlap_state: the last window's Ca slice, cloned (kv and gate)
            rate = m.shape[f"{pre}.position_bias"][0]
            c.keep(s.new(b * rate * dim, kv.dt), s.new(b * rate * dim, "f32"))
        held += [new_kv, new_gate]
        kv_in, g = new_kv, new_gate
        del new_kv, new_gate
    else:
        kv_in = T(kv.st, rows, kv.dt, kv.rg, kv.fn, kv.idx)
    sm = s.new(rows, "f32")  # softmax(dim=2, dtype=float32) saves its output
    s.node("copy", (g,), (sm,), (sm,))
    del g
    smc = s.cast(sm, kv_in.dt)
    del sm
    prod = o.mul(kv_in, smc, rows)
    del smc, kv_in
    windows = usable // m.shape[f"{pre}.position_bias"][0]
    n_win = b * windows
    summed = op(m, n_win * dim, kv.dt, (prod,))
    del prod
    normed = weighted_norm(m, summed, f"{pre}.kv_norm")
    del summed
    pos = s.new(windows, "i64")  # arange(n_windows) * rate + first_window_position
    pos = s.new(windows, "i64")
    pos = s.new(windows, "i64")
    cos, sin = tables(m, n_win, normed.dt)
    out = rope(m, normed, n_win, cos, sin, n_win)
    del normed
    return out, [*held, pos, cos, sin]


def _entries(m: CausalLM, fresh: T | None, entries: Any, dim: int, c: LayerCache | None) -> T:
    """update_compressor_states: the first entries as they are, later ones concatenated onto the running."""
    s, b = m.s, m.cfg.batch
    if c is None or m.cfg.past < 1:
        out = fresh if fresh is not None else s.new(0, "bf16")
    else:
        out = s.new(b * entries * dim, fresh.dt if fresh is not None else m.cfg.param_dt)
    if c is not None:
        c.keep(out)
    return out


def compressor(
    m: CausalLM, i: int, x: T, width: int, dim: int, overlap: bool, name: str, c: LayerCache | None
) -> tuple[T, Any, list[T]]:
    """A compressor's running entries (``[b, entries, dim]``), their count after this forward, and the locals
    its forward keeps until it returns (the projections, the pooling's: CSA runs its indexer with them)."""
    m.param(f"{name}.position_bias")  # built on first use (inference): its shape [rate, width]
    rate = m.shape[f"{name}.position_bias"][0]
    kv, gate, usable = _project(m, name, x, width, rate, c)
    fresh, held = _pool(m, name, kv, gate, usable, dim, overlap, c) if usable > 0 else (None, [])
    _, total = _windows(m, rate, c is not None)
    return _entries(m, fresh, total, dim, c), total, [kv, gate, *held]


def _causal_bias(m: CausalLM, entries: Any, dt: str) -> T:
    """HCA's block bias: arange, ``(position_ids + 1) // rate``, zeros [b, 1, q, entries] masked_fill'd by a
    boolean [1, 1, q, entries] comparison."""
    s, cfg = m.s, m.cfg
    idx = s.new(entries, "i64")
    th = s.new(cfg.q, "i64")
    th = s.new(cfg.q, "i64")
    zeros = s.new(cfg.batch * cfg.q * entries, dt)
    cond = s.new(cfg.q * entries, "bool")
    out = s.new(cfg.batch * cfg.q * entries, dt)
    del idx, th, zeros, cond
    return out


def _indexer(m: CausalLM, i: int, x: T, q_residual: T, c: LayerCache | None) -> tuple[T, Any]:
    """DeepseekV4Indexer.forward: its compressor, the rotated queries, the fp32 scores, the top-k indices."""
    o, s, cfg, v4 = m.o, m.s, m.cfg, m.spec.deepseek_v4
    assert v4 is not None
    pre = f"layers.{i}.self_attn.compressor.indexer"
    di, hi, b, q = v4.attention.index_head_dim, v4.index_n_heads, cfg.batch, cfg.q
    keys, entries, held = compressor(m, i, x, 2 * di, di, True, pre, c)
    cos, sin = tables(m, q, x.dt)  # cos_q, sin_q: locals to the return
    qi = m.linear(q_residual, f"{pre}.q_b_proj")
    qi = rope(m, qi, b * q * hi, cos, sin, q)
    # DeepseekV4IndexerScorer: torch.matmul(q.float() [b, q, heads, d], keys.float() [b, 1, d, entries])
    # broadcasts the keys over the queries: matmul expands and reshapes both operands into copies (the
    # transposed queries, the keys once per query: b x q x d x entries fp32) for one bmm
    qf = s.cast(qi, "f32")
    kf = s.cast(keys, "f32")
    n = b * q * hi * entries
    qc = op(m, qf.n, "f32", (qf,))
    kc = op(m, b * q * di * entries, "f32", (kf,))
    scores = o.bmm(qc, kc, n)
    del qc, kc, qf, kf
    scores = op(m, n, "f32", (scores,), (scores,))  # relu
    scores = o.mul(scores, None)
    w = m.linear(x, f"{pre}.scorer.weights_proj")
    w = o.mul(s.cast(w, "f32"), None)
    weighted = o.mul(scores, w, n)
    del scores, w
    index_scores = op(m, b * q * entries, "f32", (weighted,))  # .sum(dim=2)
    del weighted
    k = min(v4.index_topk, entries)
    if entries > 0:
        th = s.new(q, "i64")
        th = s.new(q, "i64")
        idx = s.new(entries, "i64")
        future = s.new(q * entries, "bool")
        index_scores = s.new(b * q * entries, "f32")  # masked_fill
        del idx, future
        vals, top = s.new(b * q * k, "f32"), s.new(b * q * k, "i64")
        del vals
        invalid = s.new(b * q * k, "bool")
        full = s.new(b * q * k, "i64")
        top = s.new(b * q * k, "i64")  # torch.where(invalid, -1, top)
        del invalid, full, th
    else:
        top = s.new(0, "i64")
    del index_scores, keys, held, qi, cos, sin
    return top, k


def _sparse_bias(m: CausalLM, i: int, x: T, q_residual: T, entries: Any, c: LayerCache | None) -> T:
    """DeepseekV4CSACompressor's block bias from the indexer's top-k: ``valid``, the clamped indices, a
    new_full [b, 1, q, entries + 1] bias scattered and sliced (the view keeps the whole storage)."""
    s, cfg = m.s, m.cfg
    top, k = _indexer(m, i, x, q_residual, c)
    rows = cfg.batch * cfg.q
    valid = s.new(rows * k, "bool")
    full = s.new(rows * k, "i64")
    safe = s.new(rows * k, "i64")
    del full, top
    bias = s.new(rows * (entries + 1), cfg.param_dt)
    del valid, safe
    return bias


def _no_gradient(m: CausalLM, fn: Any, *args: Any) -> T:
    """``fn``'s graph ends in integer indices (the indexer's top-k): no gradient reaches it, so its nodes die
    with its tensors. Inside a checkpoint their holders die too and the recomputation does not refill them
    (torch/utils/checkpoint.py skips dead holders): the region forgets the nodes, and a recomputation runs
    ``fn`` without recording any."""
    s = m.s
    if s.recomputing is not None:
        prev, s.grad_enabled = s.grad_enabled, False
        try:
            return fn(m, *args)
        finally:
            s.grad_enabled = prev
    ck = s.ckpt
    mark = len(ck.nodes) if ck is not None else 0
    out = fn(m, *args)
    if ck is not None:
        dead = ck.nodes[mark:]
        del ck.nodes[mark:]
        ck.expected -= sum(nd.n_saved for nd in dead)
    return out


def _kv(m: CausalLM, i: int, x: T, cos: T, sin: T, c: LayerCache | None, sliding: bool) -> T:
    """kv_norm(kv_proj(x)), rotated; with a cache the window's concatenation (a sliding layer's cache keeps
    keys and values, two tensors; a compressed layer's one)."""
    cfg, spec = m.cfg, m.spec
    pre = f"layers.{i}.self_attn"
    kv = weighted_norm(m, m.linear(x, f"{pre}.kv_proj"), f"{pre}.kv_norm")
    kv = rope(m, kv, cfg.batch * cfg.q, cos, sin, cfg.q)
    if m.cache is not None and sliding:
        k_full, _v_full = m.cache.update(i, kv, kv, cfg.q)
        return k_full
    if c is not None:
        w = spec.sliding_window or 1
        toks = min(cfg.past, w - 1) + cfg.q
        full = op(m, cfg.batch * toks * spec.head_dim, kv.dt, (kv,))
        c.keep(full)
        c.release()  # the layer's previous state goes as its first update replaces it (approximation)
        return full
    return kv


def attention(
    m: CausalLM, i: int, x: T, tabs: dict[str, tuple[T, T]], mask: T | None, c: LayerCache | None
) -> tuple[T, T]:
    """DeepseekV4Attention.forward on the normed input ``x``; returns o_b_proj's output and the attention
    probabilities (the decoder layer keeps both until it returns)."""
    o, s, cfg, spec, v4 = m.o, m.s, m.cfg, m.spec, m.spec.deepseek_v4
    assert v4 is not None
    kind = spec.resolved_layer_types[i]
    sliding = kind == "sliding_attention"
    cos, sin = tabs["main" if sliding else "compress"]
    pre = f"layers.{i}.self_attn"
    a, d, b, q = spec.num_attention_heads, spec.head_dim, cfg.batch, cfg.q
    s.region = "attention"
    q_residual = weighted_norm(m, m.linear(x, f"{pre}.q_a_proj"), f"{pre}.q_a_norm")
    qs = m.linear(q_residual, f"{pre}.q_b_proj")
    qs = unweighted_norm(m, qs, d)
    qs = rope(m, qs, b * q * a, cos, sin, q)
    kv = _kv(m, i, x, cos, sin, c, sliding)
    keys = kv.n // b // d
    bias = None
    if not sliding:
        csa = kind == "compressed_sparse_attention"
        width = 2 * d if csa else d
        comp, entries, held = compressor(m, i, x, width, d, csa, f"{pre}.compressor", c)
        if csa:
            bias = _no_gradient(m, _sparse_bias, i, x, q_residual, entries, c)
        elif q != 1 and entries > 0:
            bias = _causal_bias(m, entries, kv.dt)
        del held
        kv = op(m, b * (keys + entries) * d, kv.dt, (kv, comp))  # torch.cat([kv, compressed_kv], dim=2)
        del comp
        if mask is not None and entries > 0:  # the mask concatenated with the block bias (or padded)
            mask = op(m, b * q * (keys + entries), mask.dt, (mask,))
        keys = keys + entries
    # q_residual and the block bias are locals of the attention: they live until it returns
    out, weights = kernels.EAGER["sinks"](m, i, qs, kv, kv, mask, a, 1, d, kv_len=keys)
    del qs, kv, mask
    # apply_rotary_pos_emb(attn_output.transpose(1, 2), cos, -sin): -sin is a new table
    neg = op(m, sin.n, sin.dt, (sin,))
    out = rope(m, out, b * q * a, cos, neg, q)
    del neg
    grouped = o.clone(out)  # .transpose(1, 2).reshape(..., o_groups, -1): a copy
    del out
    y = o.bmm(grouped, m.param(f"{pre}.o_a_proj.weight"), b * q * v4.o_groups * v4.o_lora_rank)
    del grouped
    y = o.clone(y)  # bmm's [groups, tokens, rank] transposed and reshaped: a copy
    s.region = "hidden_states"
    out = m.linear(y, f"{pre}.o_b_proj")
    del y, bias, q_residual
    return out, weights
