"""The gated delta rule of transformers' torch fallback, on symbolic tensors (``models/qwen3_next/
modeling_qwen3_next.py`` ``torch_chunk_gated_delta_rule`` and ``torch_recurrent_gated_delta_rule``,
transformers 5.24).

Without the ``fla`` kernels (the CPU, or a GPU where flash-linear-attention is not installed) transformers
runs these Python functions, and the traces measure them: fp32 copies of q, k, v, beta and the decay, the
sequence padded to a multiple of ``chunk_size`` (64), per-chunk ``[chunk, chunk]`` decay and attention
matrices, two triangular solves, then a Python loop over the chunks that updates the fp32 recurrent state. A
GPU with fla's Triton kernels (``chunk_gated_delta_rule``) keeps none of these fp32 [b, heads, padded, d]
intermediates in PyTorch's allocator (the kernels work chunk by chunk in on-chip memory and return the bf16
output and the fp32 final state), so its linear-attention layers peak lower than modelled here.

Each chunk of the scan allocates the same temporaries; inference replays the first two iterations (the second
holds the first's ``v_new`` and ``inter_chunk_attn`` while it makes its own, which every later one repeats);
training, where each iteration also leaves its saved tensors behind, replays a few and stands for the middle
ones with their bytes (:mod:`.scan`), to the byte.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay.memory import T, promote
from gpumem_gui.core.replay.scan import run_scan
from gpumem_gui.core.replay.sym import chunks

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM
    from gpumem_gui.core.spec.linear import LinearAttentionSpec


def new_op(
    m: CausalLM,
    n: object,
    dt: str,
    *inputs: T | None,
    saved: tuple[T | None, ...] = (),
    keep_out: bool = False,
) -> T:
    """One op's new output of ``n`` elements (its backward makes one gradient per input); autograd saves
    ``saved`` and, with ``keep_out``, the output itself (exp, rsqrt, sigmoid, solve_triangular)."""
    out = m.s.new(n, dt)
    m.s.node("copy", inputs, (out,), (*saved, out) if keep_out else saved)
    return out


def _to_f32(m: CausalLM, x: T, contiguous: bool) -> T:
    """``x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)``: a copy unless ``x`` is
    already fp32 and the transposed view is contiguous."""
    if x.dt == "f32" and contiguous:
        return x
    return new_op(m, x.n, "f32", x)


def _l2norm(m: CausalLM, x: T, rows: object) -> T:
    """l2norm: ``x * rsqrt((x * x).sum(-1, keepdim=True) + eps)``."""
    sq = new_op(m, x.n, "f32", x, saved=(x,))
    ssum = new_op(m, rows, "f32", sq)
    del sq
    eps = new_op(m, rows, "f32", ssum)
    del ssum
    inv = new_op(m, rows, "f32", eps, keep_out=True)
    del eps
    return new_op(m, x.n, "f32", x, inv, saved=(x, inv))


def _prepare(
    m: CausalLM, la: LinearAttentionSpec, qkv: tuple[T, T, T], g: T, beta: T, q: object
) -> tuple[T, T, T, T, T]:
    """GVA repeat of q and k, the fp32 [b, heads, s, d] copies, l2norm of q and k, q scaled."""
    query, key, value = qkv
    b = m.cfg.batch
    if la.groups > 1:  # repeat_interleave over the value heads
        query = new_op(m, query.n * la.groups, query.dt, query)
        key = new_op(m, key.n * la.groups, key.dt, key)
    multi = q > 1  # type: ignore[operator]  # a transposed [b, s, h, d] is contiguous only for one token
    query, key, value, beta, decay = (_to_f32(m, x, not multi) for x in (query, key, value, beta, g))
    rows = b * la.value_heads * q  # type: ignore[operator]
    query = _l2norm(m, query, rows)
    key = _l2norm(m, key, rows)
    query = new_op(m, query.n, "f32", query)  # query * scaling
    return query, key, value, beta, decay


def chunk_rule(
    m: CausalLM, la: LinearAttentionSpec, qkv: tuple[T, T, T], g: T, beta: T, state: T | None
) -> tuple[T, T | None]:
    """torch_chunk_gated_delta_rule(use_qk_l2norm_in_kernel=True): the output [b, s, hv, dv] in the input
    dtype and the fp32 final state (``state``: the cache's, read in place, or None: zeros)."""
    cfg = m.cfg
    b, q, c, dt = cfg.batch, cfg.q, la.chunk_size, qkv[0].dt
    hv, dk, dv = la.value_heads, la.key_head_dim, la.value_head_dim
    query, key, value, beta, decay = _prepare(m, la, qkv, g, beta, q)
    nc = chunks(q, c)
    rows = b * hv * nc * c  # padded positions over all heads
    query, key, value = (new_op(m, rows * d, "f32", x) for x, d in ((query, dk), (key, dk), (value, dv)))
    beta, decay = (new_op(m, rows, "f32", x) for x in (beta, decay))  # F.pad
    v_beta = new_op(m, rows * dv, "f32", value, beta, saved=(value, beta))
    k_beta = new_op(m, rows * dk, "f32", key, beta, saved=(key, beta))
    mask = new_op(m, c * c, "bool")
    mask = new_op(m, c * c, "bool", mask)  # ones(...).triu(1)
    cum = new_op(m, rows, "f32", decay)
    pair = new_op(m, rows * c, "f32", cum)  # cum.unsqueeze(4) - cum.unsqueeze(3)
    pair = new_op(m, rows * c, "f32", pair, saved=(mask,))  # masked_fill
    pair = new_op(m, rows * c, "f32", pair, keep_out=True)  # exp
    ut = m.o.bmm(k_beta, key, rows * c)  # matmuls: autocast runs them in its lower precision
    ut = new_op(m, rows * c, "f32", ut, pair, saved=(ut, pair))
    intra = m.o.bmm(query, key, rows * c)
    intra = new_op(m, rows * c, "f32", intra, pair, saved=(intra, pair))
    e = new_op(m, rows, "f32", cum)
    decayed_k_beta = new_op(m, rows * dk, "f32", k_beta, e, saved=(k_beta, e))
    del e
    new_values = new_op(m, rows * dv, "f32", ut, v_beta, saved=(ut,), keep_out=True)  # solve_triangular
    k_cumdecay = new_op(m, rows * dk, "f32", ut, decayed_k_beta, saved=(ut,), keep_out=True)
    last = state if state is not None else m.s.new(b * la.recurrent_state_elems, "f32")
    core = m.s.new(rows * dv, "f32")  # zeros_like(new_values)
    e = new_op(m, rows, "f32", cum)
    query = new_op(m, query.n, "f32", query, e, saved=(query, e))
    e = new_op(m, rows, "f32", cum)
    e = new_op(m, rows, "f32", e)
    key = new_op(m, key.n, "f32", key, e, saved=(key, e))
    del e
    chunk_decay = new_op(m, b * hv * nc, "f32", cum)
    # the loop's last v_new and inter_chunk_attn stay alive (locals of the function) until it returns
    # inference: two iterations stand for all; training: every one (each saves its v_new and state)
    n_iter = nc if m.s.grad_enabled else min(nc, 2)
    last, _v_new, _inter = _scan(
        m, la, (new_values, k_cumdecay, query, key, intra), chunk_decay, core, last, n_iter
    )
    # core_attn_out[:, :, :s].transpose(1, 2).to(dtype, memory_format=contiguous): traced as an fp32 clone of
    # the padded output (every chunk's rows), then the cast of the first s positions
    flat = new_op(m, rows * dv, "f32", core)
    del core
    out = new_op(m, b * q * hv * dv, dt, flat)
    del flat
    return out, last if m.cache is not None else None


def _chunk(m: CausalLM, x: T, n: object) -> T:
    out = T(x.st, n, x.dt)
    m.s.node("copy", (x,), (out,))
    return out


def _scan(
    m: CausalLM, la: LinearAttentionSpec, per_chunk: tuple[T, ...], chunk_decay: T, core: T, last: T, n: int
) -> tuple[T, T, T]:
    """The sequential loop over chunks (``n`` iterations, replayed in a number of steps that does not grow
    with ``n``: :func:`.scan.run_scan`): v_new, inter_chunk_attn, the output slice, the new state."""
    b, hv, c, dk, dv = m.cfg.batch, la.value_heads, la.chunk_size, la.key_head_dim, la.value_head_dim
    blk = b * hv * c * dv

    # the loop's variables, each replaced where the loop assigns it (the old value lives until then)
    v: dict[str, T] = {"last": last}
    del last

    def step(it: int, v: dict[str, T]) -> dict[str, T]:
        # x[:, :, i]: views of one chunk (their backward: a zero-filled full-size gradient each)
        new_values, k_cumdecay, query, key, intra = (
            _chunk(m, x, b * hv * c * d) for x, d in zip(per_chunk, (dv, dk, dk, dk, c), strict=True)
        )
        mm = m.o.bmm(k_cumdecay, v["last"], blk)
        v["v_new"] = new_op(m, blk, "f32", new_values, mm)
        del mm
        v["inter"] = m.o.bmm(query, v["last"], blk)
        mm = m.o.bmm(intra, v["v_new"], blk)
        out = new_op(m, blk, promote(v["inter"].dt, mm.dt), v["inter"], mm)
        del mm
        m.s.node("pass", (out, core), (core,))  # core_attn_out[:, :, i] = ...: CopySlices keeps the history
        del out
        # without a cache the last state is dropped (output_final_state=False): its ops' graph dies at once,
        # so they are replayed without one (a graph nobody reaches would hold a checkpoint's inputs)
        grad = m.s.grad_enabled
        m.s.grad_enabled = grad and not (it == n - 1 and m.cache is None)
        last = v["last"]
        decayed = new_op(m, last.n, "f32", last, chunk_decay, saved=(last, chunk_decay))
        upd = m.o.bmm(key, v["v_new"], last.n)
        v["last"] = new_op(m, last.n, "f32", decayed, upd)
        del decayed, upd, last
        m.s.grad_enabled = grad
        return v

    v = run_scan(m.s, n, step, v, lambda carry: carry["last"])
    return v["last"], v["v_new"], v["inter"]


def recurrent_rule(
    m: CausalLM, la: LinearAttentionSpec, qkv: tuple[T, T, T], g: T, beta: T, state: T
) -> tuple[T, T]:
    """torch_recurrent_gated_delta_rule for one token after a cached state (the decode step): the state
    decayed, read, corrected and read again, each an fp32 [b, hv, dk, dv] temporary."""
    b, dt = m.cfg.batch, qkv[0].dt
    hv, dv = la.value_heads, la.value_head_dim
    query, key, value, beta, decay = _prepare(m, la, qkv, g, beta, 1)
    small = b * hv
    core = m.s.new(small * dv, "f32")  # zeros_like(value)
    decay_t = new_op(m, small, "f32", decay)  # decay_t, kv_mem, delta: loop locals, alive to the end
    last = new_op(m, state.n, "f32", state, decay_t, saved=(state, decay_t))
    prod = new_op(m, last.n, "f32", last, key, saved=(last, key))
    kv_mem = new_op(m, small * dv, "f32", prod)
    del prod
    delta = new_op(m, small * dv, "f32", value, kv_mem)
    delta = new_op(m, small * dv, "f32", delta, beta, saved=(delta, beta))
    outer = new_op(m, last.n, "f32", key, delta, saved=(key, delta))
    last = new_op(m, last.n, "f32", last, outer)
    del outer
    prod = new_op(m, last.n, "f32", last, query, saved=(last, query))
    read = new_op(m, small * dv, "f32", prod)
    del prod
    m.s.node("pass", (read, core), (core,))
    del read
    out = new_op(m, small * dv, dt, core)  # transpose(1, 2).contiguous() is a view, .to(dtype) a copy
    return out, last
