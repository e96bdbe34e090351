"""The loss implementations of the training frameworks, from the final norm's output (the standard one,
transformers' ``ForCausalLMLoss`` over the full logits, is :meth:`.model.CausalLM.forward_loss` itself).

* ``chunked``: torchtune's ``CEWithChunkedOutputLoss`` (``torchtune/modules/loss/ce_chunked_output_loss.py``)
  with the model's chunked output (``TransformerDecoder.chunked_output``: ``[self.output(chunk) for chunk in
  h.tensor_split(num_output_chunks, dim=1)]``): every chunk's logits exist at once in the compute dtype; the
  loss upcasts one chunk at a time (``F.cross_entropy(logits.float(), labels, reduction="sum")``: the fp32
  log-probabilities of every chunk stay saved for backward); the recipe shifts the labels after the forward
  (``torch.hstack``) and deletes the logits before ``backward``.
* ``fp32-shift``: torchtune v0.1 / v0.2's loss (:func:`fp32_shift`): fp32 logits from the model, shifted
  by a contiguous fp32 copy, ``nn.CrossEntropyLoss`` over them.
* ``chunked-linear``: torchtune's ``LinearCrossEntropyLoss`` (the loss of 162 of the 172 recipe configs
  that name one, torchtune bd2a0fc): hidden states projected and upcast chunk by chunk inside the loss
  (:func:`chunked_linear`).
* ``chunked-trainer``: Axolotl's ``chunked_cross_entropy`` (``src/axolotl/monkeypatch/loss/chunked.py``
  ``patch_chunked_ce_loss_fn``, which replaces transformers' ``ForCausalLMLoss`` under the HF Trainer): the
  model's full logits, then per chunk a ``torch.compile``'d cross-entropy of the upcast chunk
  (:func:`chunked_trainer`).
* ``fused-linear``: Liger's ``LigerFusedLinearCrossEntropyFunction``
  (``liger_kernel/ops/fused_linear_cross_entropy.py``, ``fused_linear_cross_entropy_forward``): tokens in
  chunks of ``next_power_of_2(ceil(BT / ceil(V / H)))`` rows; per chunk the logits (compute dtype) are
  turned into their gradient in place, ``grad_input`` and ``grad_weight`` are accumulated in the forward
  and saved; backward hands them back (no full logits ever). Modelled from the source: Liger needs Triton
  and a GPU, so it is not traced.
* ``vocab-parallel``: Megatron-LM's ``VocabParallelCrossEntropy`` (``megatron/core/tensor_parallel/
  cross_entropy.py``): an fp32 copy of the (rank's vocabulary shard of the) logits made inside the
  function, turned into the softmax in place and saved; backward turns it into the gradient in place.
* ``loss-parallel``: torchtitan's standard loss under TP (``loss_parallel()``, on unless
  ``--parallelism.disable_loss_parallel``) over the head's vocabulary shard: torch's DTensor cross-entropy
  (:func:`loss_parallel`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpumem_gui.core.replay.autograd import Node, Sim
from gpumem_gui.core.replay.logits import compiled_cross_entropy
from gpumem_gui.core.replay.logits import cross_entropy_sum as _cross_entropy_sum
from gpumem_gui.core.replay.logits import grad_like_input as _grad_like_input
from gpumem_gui.core.replay.logits import head_logits as _head
from gpumem_gui.core.replay.loss_torchtune import fp32_shift
from gpumem_gui.core.replay.memory import Storage, T
from gpumem_gui.core.replay.sym import chunks

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def chunked(m: CausalLM, h: T) -> T:
    """torchtune's chunked output and CEWithChunkedOutputLoss (see the module docstring)."""
    s, cfg, spec = m.s, m.cfg, m.spec
    b, q, d = cfg.batch, cfg.q, spec.token_embedding_dim
    n = max(1, min(cfg.loss_chunks, q))
    sizes = [q // n + (1 if k < q % n else 0) for k in range(n)]  # torch.tensor_split
    s.tr.where = "lm_head"
    s.region = "hidden_states"
    logits = []
    for size in sizes:
        part = T(h.st, b * size * d, h.dt)  # a slice of the sequence: SliceBackward (a full-size gradient)
        s.node("copy", (h,), (part,))
        if b > 1 and n > 1 and (s.autocast is None or h.dt == s.autocast):
            # F.linear folds a non-contiguous 3-D input with reshape: a copy (saved by the matmul)
            part = m.o.clone(part)
        logits.append(_head(m, part))
        del part
    s.tr.where = "loss"
    s.region = "inputs"
    labels = s.new(b * q, "i64")  # the recipe's torch.hstack((labels[..., 1:], ignore_index))
    mask = s.new(b * q, "bool")  # (labels != ignore_index).sum()
    total_elements = s.new(1, "i64")
    del mask
    chunks = [s.new(b * size, "i64") if b > 1 and n > 1 else labels for size in sizes]  # .reshape(-1)
    s.region = "logits"
    total: T | None = None
    for k in range(n):
        ce = _cross_entropy_sum(s, logits[k], chunks[k], b * sizes[k] if cfg.compile_loss else 0)
        if total is None:
            total = m.o.add(ce, None)  # 0.0 + ce: a new tensor; later += in place
        else:
            s.node("pass", (total, ce), (total,))
        del ce
    del chunks, labels
    logits.clear()  # del logits (the recipe frees them before backward)
    s.region = "hidden_states"
    loss = s.new(1, "f32")
    s.node("pass", (total,), (loss,))  # / total_elements
    del total, total_elements
    return loss


def chunked_trainer(m: CausalLM, h: T) -> T:
    """Axolotl's ``chunked_cross_entropy`` (``patch_chunked_ce_loss_fn``; ``chunked_cross_entropy_num_chunks``
    default 8): the model computes its full logits as usual (compute dtype); the patched loss pads and
    shifts the labels, ``source.chunk(n, dim=1)`` splits the logits (views: one ``SplitBackward``, whose
    backward concatenates the chunks' gradients into one logits-sized gradient),
    ``logit_chunk.reshape(-1, V)`` (a view for one sequence, a copy of every chunk otherwise, all made before
    the loop) and runs ``F.cross_entropy(logits.float(), labels, reduction="sum")`` under ``torch.compile``
    chunk by chunk (:func:`.logits.compiled_cross_entropy`: the 16-bit chunk and two fp32 values per row
    kept, no fp32 logits; backward gives each chunk a 16-bit gradient)."""
    s, cfg = m.s, m.cfg
    b, q = cfg.batch, cfg.q
    logits = m.head(h)
    v = logits.n // (b * q)
    s.tr.where = "loss"
    n = max(1, min(cfg.loss_chunks, q))
    step = -(-q // n)  # torch.chunk: chunks of ceil(q / n), the last one what is left
    count = chunks(q, step)
    sizes = [step] * (count - 1) + [q - step * (count - 1)]
    s.region = "inputs"
    padded = s.new(b * (q + 1), "i64")  # F.pad(labels, (0, 1), value=ignore_index)
    labels = s.new(b * q, "i64") if b > 1 else padded  # labels[..., 1:].contiguous()
    mask = s.new(b * q, "bool")  # total_elements = (labels != ignore_index).sum()
    total_elements = s.new(1, "i64")
    del mask
    copies = b > 1 and len(sizes) > 1  # a chunk of dim 1 of a [b, q, V] tensor is not contiguous
    label_chunks = [s.new(b * k, "i64") if copies else labels for k in sizes]
    s.region = "logits"
    parts = tuple(T(logits.st, b * k * v, logits.dt) for k in sizes)
    s.node("custom", (logits,), parts, (), ctx=_grad_like_input)
    if copies:
        parts = tuple(m.o.clone(p) for p in parts)  # reshape(-1, V): a copy of each chunk
    total: T | None = None
    for part, chunk_labels in zip(parts, label_chunks, strict=True):
        ce = compiled_cross_entropy(s, part, chunk_labels, part.n // v)
        if total is None:
            total = m.o.add(ce, None)  # 0.0 + ce: a new tensor; later += in place
        else:
            s.node("pass", (total, ce), (total,))
        del ce
    del parts, label_chunks, labels, padded, logits, part, chunk_labels
    s.region = "hidden_states"
    loss = s.new(1, "f32")
    s.node("pass", (total,), (loss,))  # / num_items_in_batch or total_elements
    del total, total_elements
    return loss


def chunked_linear(m: CausalLM, h: T) -> T:
    """torchtune's LinearCrossEntropyLoss (``torchtune/modules/loss/cross_entropy_loss.py``, the loss of
    the current recipe configs): the model skips its output layer; the loss gathers the hidden states of the
    non-ignored tokens (``index_select``: a copy, every token counted here), splits them into
    ``num_output_chunks`` row chunks and projects and upcasts one chunk at a time (the 16-bit logits and
    their fp32 copy die with the chunk, the fp32 log-probabilities stay saved)."""
    s, cfg, spec = m.s, m.cfg, m.spec
    t, d = cfg.tokens, spec.token_embedding_dim
    nv = cfg.batch * (cfg.q - 1)  # the shift appends ignore_index to every sequence: b labels ignored
    n = max(1, min(cfg.loss_chunks, nv))
    sizes = [nv // n + (1 if k < nv % n else 0) for k in range(n)]
    s.tr.where = "loss"
    s.region = "inputs"
    labels = s.new(t, "i64")  # the recipe's torch.hstack((labels[..., 1:], ignore_index))
    mask = s.new(t, "bool")  # torch.where(targets != ignore_index)[0].numel(): nonzero of a [b, s] mask
    where = s.new(2 * nv, "i64")
    del mask, where
    mask = s.new(t, "bool")  # mask_inputs: indices = torch.where(target != ignore_index)[0]
    indices = s.new(nv, "i64")
    del mask
    s.region = "hidden_states"
    kept = s.new(nv * d, h.dt)  # hidden.index_select(0, indices) (saves the indices)
    s.node("copy", (h,), (kept,), (indices,))
    s.region = "inputs"
    targets = s.new(nv, "i64")  # target.index_select(0, indices)
    del indices
    total = s.new(1, "f32")  # torch.tensor(0.0)
    for size in sizes:
        s.region = "hidden_states"
        part = T(kept.st, size * d, kept.dt)  # tensor_split(dim=0): a view (SliceBackward)
        s.node("copy", (kept,), (part,))
        s.tr.where = "lm_head"
        logits = _head(m, part, alone=True)  # self.linear_projection (the model's output) from the loss
        del part
        s.tr.where = "loss"
        s.region = "logits"
        ce = _cross_entropy_sum(s, logits, targets, size if cfg.compile_loss else 0)
        del logits
        s.node("pass", (total, ce), (total,))  # total_loss += loss (in place)
        del ce
    del kept, targets, labels
    s.region = "hidden_states"
    loss = s.new(1, "f32")
    s.node("pass", (total,), (loss,))  # / total_valid_tokens
    return loss


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def liger_chunk_rows(tokens: int, vocab: int, hidden: int) -> int:
    """Liger's chunk size: ``next_power_of_2(cdiv(BT, cdiv(V, H)))`` rows (the same for every token count up
    to ``inc * rows`` and above half of it: a tape's guards)."""
    inc = -(-vocab // hidden)
    rows = _next_pow2(-(-int(getattr(tokens, "v", tokens)) // inc))
    if not (tokens <= inc * rows and (rows == 1 or tokens > inc * rows // 2)):
        raise AssertionError(f"{tokens} tokens do not make chunks of {rows} rows")
    return rows


def fused_linear(m: CausalLM, h: T) -> T:
    """Liger's fused linear cross-entropy (see the module docstring). On a GPU of compute capability 8+ an
    fp32 ``grad_weight`` with 16-bit logits is accumulated by ``addmm(out_dtype=float32)`` on a 16-bit copy of
    the input chunk; otherwise ``grad_weight += torch.mm(grad_logits.t(), input_chunk).float()`` holds a
    V x H product and its fp32 copy."""
    s, cfg, spec = m.s, m.cfg, m.spec
    t, d = cfg.tokens, spec.token_embedding_dim
    name = "lm_head.weight" if m.has("lm_head.weight") else "embed_tokens.weight"
    s.hooks.module_forward(s, "head", True)  # FSDP2: a head unit of its own, gathered for the whole loss
    w = m.param(name)
    v = spec.vocab_size
    s.tr.where = "loss"
    s.region = "inputs"
    padded = s.new(cfg.batch * (cfg.q + 1), "i64")  # F.pad(labels, (0, 1), value=-100)[..., 1:]
    labels = s.new(t, "i64") if cfg.batch > 1 else padded
    s.region = "logits"
    grad_input = s.new(h.n, h.dt)
    grad_weight = s.new(w.n, w.dt) if w.fn is not None else None
    loss_1d = s.new(t, "f32")
    target_mask = s.new(t, "bool")
    wc = s.ac_cast(w)  # the matmul's operand (autocast: the cached 16-bit copy)
    cdt = s.autocast if s.autocast is not None and h.dt in ("f32", "bf16", "f16") else h.dt
    rows = liger_chunk_rows(t, v, d)
    logits: T | None = None
    for k in range(chunks(t, rows)):
        r = min(rows, t - k * rows)
        x_c = s.new(r * d, cdt) if cdt != h.dt else None  # autocast's copy of the input chunk
        nxt = s.new(r * v, cdt)  # _input_chunk @ weight.t() (the previous chunk's logits still named)
        del x_c
        logits = nxt
        del nxt
        gi = s.new(r * d, cdt)  # grad_logits_chunk @ weight, copied into grad_input
        del gi
        if grad_weight is not None:
            if grad_weight.dt == "f32" and cdt != "f32":
                x16 = s.new(r * d, cdt) if h.dt != cdt else None  # input_chunk.to(grad_logits_t.dtype)
                del x16
            else:
                prod = s.new(v * d, cdt)
                up = s.new(v * d, "f32") if cdt != "f32" else None
                del prod, up
    del logits, loss_1d, target_mask, wc, labels, padded
    loss = s.new(1, "f32")
    saved = (grad_input, grad_weight)
    s.node("custom", (h, w if grad_weight is not None else None), (loss,), saved, ctx=_hand_back)
    del grad_input, grad_weight, saved, w
    s.hooks.module_forward(s, "head", False)
    return loss


def _hand_back(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
    """Backward of a function that computed its gradients in the forward: the saved ones, scaled in place."""
    saved = nd.saved or ()
    return [saved[i] if e is not None and i < len(saved) else None for i, e in enumerate(nd.edges)]


def vocab_parallel(m: CausalLM, h: T) -> T:
    """Megatron-LM's vocab-parallel cross-entropy over the head's (local) logits (see the module
    docstring)."""
    s, cfg = m.s, m.cfg
    t = cfg.tokens
    s.tr.where = "lm_head"
    s.region = "hidden_states"
    logits = _head(m, h)
    s.tr.where = "loss"
    s.region = "inputs"
    labels = s.new(t, "i64")  # labels.transpose(0, 1).contiguous()
    s.region = "logits"
    lf = s.new(logits.n, "f32")  # vocab_parallel_logits.float(), then max-subtracted, exp'd, divided in place
    small = [s.new(t, "f32") for _ in range(3)]  # logits_max, predicted_logits, sum_exp_logits
    target_mask = s.new(t, "bool")
    masked_target = s.new(t, "i64")
    per_token = s.new(t, "f32")
    s.node("custom", (logits,), (per_token,), (lf, target_mask, masked_target), ctx=_softmax_back)
    del lf, small, target_mask, masked_target, logits, labels
    s.region = "hidden_states"
    loss = s.new(1, "f32")  # (loss * loss_mask).sum() / num_tokens
    s.node("copy", (per_token,), (loss,))
    del per_token
    return loss


def _softmax_back(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
    """VocabParallelCrossEntropy.backward: the saved softmax becomes the gradient in place (the engine casts
    it to the logits' dtype)."""
    saved = nd.saved or ()
    return [saved[0] if saved else None]


def loss_parallel(m: CausalLM, h: T) -> T:
    """``F.cross_entropy(pred.flatten(0, 1).float(), labels)`` under torch's ``loss_parallel()`` on the rank's
    vocabulary shard of the logits (torchtitan train.py ``loss_fn``; torch/distributed/tensor/parallel/
    loss.py). ``_log_softmax`` decomposes: ``shifted = x - x_max``, ``torch.exp(shifted)`` summed (a
    temporary), ``result = shifted - logsumexp``, saved by log_softmax and nll_loss; the fp32 copy ``x`` dies
    with the forward (``del pred`` before backward). Backward (``_nll_loss_and_log_softmax_backward``; the
    log_softmax backward handler passes the gradient through): ``grad_input = zeros_like(x)``, then
    ``(grad_input + torch.exp(x)) * grad_output``: four fp32 logits-sized tensors at once with the saved
    result. Measured: tests/test_truth_tp.py (torch's MemTracker on DTensor TP with ``loss_parallel()``)."""
    s, cfg = m.s, m.cfg
    t = cfg.tokens
    logits = m.head(h)  # as the standard loss's (sequence-parallel gather included)
    s.tr.where = "loss"
    lf = s.cast(logits, "f32")
    s.region = "inputs"
    labels = s.new(t, "i64")  # the data loader's labels on the GPU
    s.region = "logits"
    x_max = s.new(t, "f32")
    shifted = s.new(lf.n, "f32")
    sum_exp = s.new(lf.n, "f32")  # torch.exp(shifted), summed over the shard then all-reduced
    del sum_exp, x_max
    result = s.new(lf.n, "f32")
    del shifted
    s.node("custom", (lf,), (result,), (), ctx=_pass_back)
    del lf
    s.region = "hidden_states"
    loss = s.new(1, "f32")
    total_weight = s.new(1, "f32")
    s.node("custom", (result,), (loss,), (result, labels, total_weight), ctx=_nll_log_softmax_back)
    del result, labels, total_weight, logits  # ``del pred`` once the loss is computed, before backward
    return loss


def _pass_back(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
    """``_log_softmax_backward_handler``: the gradient passes through (the nll backward computed it)."""
    return [gout[0]]


def _nll_log_softmax_back(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
    """``_nll_loss_and_log_softmax_backward``: zeros_like(x), exp(x), their sum, the product with
    grad_output (exp freed after the sum, the rest when the function returns)."""
    nbytes = nd.in_meta[0][0] * 4
    grad_input = sim.storage(nbytes, "temporaries")
    exp = sim.storage(nbytes, "temporaries")
    summed = sim.storage(nbytes, "temporaries")
    del exp
    out = sim.storage(nbytes, "temporaries")
    del summed, grad_input
    return [out]


LOSSES: dict[str, Callable[[CausalLM, T], T]] = {
    "fp32-shift": fp32_shift,
    "chunked": chunked,
    "chunked-linear": chunked_linear,
    "chunked-trainer": chunked_trainer,
    "fused-linear": fused_linear,
    "vocab-parallel": vocab_parallel,
    "loss-parallel": loss_parallel,
}
