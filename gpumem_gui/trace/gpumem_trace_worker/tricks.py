"""Framework memory tricks that torch itself runs, applied to the traced training step.

* losses from the final norm's output, as torchtune computes them: ``chunked`` = the chunked output +
  ``CEWithChunkedOutputLoss`` (``torchtune/modules/loss/ce_chunked_output_loss.py``), ``chunked-linear`` =
  ``LinearCrossEntropyLoss`` (``torchtune/modules/loss/cross_entropy_loss.py``), with the recipe's label shift
  (``torch.hstack``) and ``del logits`` before backward;
* optimizer in backward: one optimizer per parameter stepped and zeroed by a
  ``register_post_accumulate_grad_hook`` (``torchtune/training/memory.py`` ``register_optim_in_bwd_hooks``);
* activation offloading: torchtune's ``OffloadActivations`` logic (``use_streams=True``: the last 5 packs'
  originals stay referenced in forward, a node's brought-back tensors are dropped after the next unpacking
  node) as ``saved_tensors_hooks`` around the decoder. Everything here is on the CPU device, so the copy that
  would live in host RAM is not made at all: the hook keeps the tensor's shape and dtype and counts its bytes
  (reported apart), and unpacking allocates the tensor that comes back to the GPU. What the tracker counts is
  therefore exactly the device side;
* selective layer checkpointing (every N-th decoder layer) and torchtitan's op-level selective checkpointing
  policy (``torch.utils.checkpoint.create_selective_checkpoint_contexts``).
"""

from __future__ import annotations

from typing import Any

from .building import TraceError

MIN_OFFLOAD_BYTES = 1024
FWD_STASH = 5


def decoder_layers(model: Any) -> list[Any]:
    """The decoder layers: the longest ModuleList of the model."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        raise TraceError("no decoder layer list found")
    return list(max(lists, key=len))


def base_model(model: Any) -> Any:
    """The transformers CausalLM under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def checkpoint_every(model: Any, every: int) -> None:
    """torchtitan layer SAC: layer ``i`` keeps checkpointing only when ``(i + 1) % every == 0``."""
    for i, layer in enumerate(decoder_layers(model)):
        if (i + 1) % every:
            layer.gradient_checkpointing = False


def op_sac_context() -> Any:
    """torchtitan's op-level SAC policy (``SelectiveAC._get_custom_policy``): the default save ops
    (``get_default_op_list().compute_intensive_ops``; CPU's SDPA kernel added as the GPU's flash/efficient
    kernels are in that list), every second mm/linear recomputed."""
    import torch
    from torch._functorch.partitioners import get_default_op_list
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {op.default for op in get_default_op_list().compute_intensive_ops}
    save.add(aten._scaled_dot_product_flash_attention_for_cpu.default)
    mm_ops = (aten.mm.default, aten.linear.default)

    def context() -> Any:
        meta = {"forward": 0, "recompute": 0}

        def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
            mode = "recompute" if ctx.is_recompute else "forward"
            if func in mm_ops:
                meta[mode] += 1
            if func in save:
                if func in mm_ops and meta[mode] % 2 == 0:
                    return CheckpointPolicy.PREFER_RECOMPUTE
                return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return context


class Offload:
    """torchtune's OffloadActivations on fake tensors (see the module docstring); ``host_peak``: the most
    bytes that would sit in host RAM."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.tracker: dict[int, tuple[Any, bool]] = {}
        self.ids = 0
        self.fwd_stash: dict[int, Any] = {}
        self.bwd_stash: dict[int, Any] = {}
        self.node: Any = None
        self.host = 0
        self.host_peak = 0
        self.first_backward = True

    def hooks(self) -> Any:
        return self.torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, t: Any) -> int:
        self.ids += 1
        tid = self.ids
        nbytes = t.element_size() * t.nelement()
        if nbytes >= MIN_OFFLOAD_BYTES and not isinstance(t, self.torch.nn.Parameter):
            for k in list(self.fwd_stash):
                if k > tid - FWD_STASH:
                    break
                del self.fwd_stash[k]
            self.tracker[tid] = ((tuple(t.shape), tuple(t.stride()), t.dtype, nbytes), True)
            self.fwd_stash[tid] = t
            self.host += nbytes
            self.host_peak = max(self.host_peak, self.host)
        else:
            self.tracker[tid] = (t, False)
        return tid

    def unpack(self, tid: int) -> Any:
        torch = self.torch
        if self.first_backward:
            self.first_backward = False
            torch.autograd.variable.Variable._execution_engine.queue_callback(self._finish)
        value, offloaded = self.tracker.pop(tid)
        if not offloaded:
            return value
        shape, stride, dtype, nbytes = value
        self.host -= nbytes
        node = torch._C._current_autograd_node()
        prev: list[int] = []
        if node is not self.node:
            self.node = node
            prev = list(self.bwd_stash)
        if tid in self.fwd_stash:
            t = self.fwd_stash[tid]
        else:
            t = torch.empty_strided(shape, stride, dtype=dtype)  # the copy brought back to the device
            self.bwd_stash[tid] = t

        def hook(outputs: Any, inputs: Any) -> Any:
            self.fwd_stash.clear()
            for k in prev:
                self.bwd_stash.pop(k, None)
            return outputs

        node.register_hook(hook)
        return t

    def _finish(self) -> None:
        self.bwd_stash.clear()
        self.fwd_stash.clear()
        self.first_backward = True
        self.node = None


def _head(model: Any) -> Any:
    """The output projection as a function: ``F.linear`` with the head's weight (MemTracker refuses a module
    called several times in one iteration; the allocations are the module's own)."""
    import torch.nn.functional as F

    head = base_model(model).lm_head
    if not isinstance(head, __import__("torch").nn.Linear) or type(head).__name__ != "Linear":
        raise TraceError("a chunked loss is traced with a plain nn.Linear head (no adapter on lm_head)")
    return lambda x: F.linear(x, head.weight, head.bias)


def _where(cond: Any, valid: int) -> Any:
    """``torch.where(cond)[0]`` (``nonzero``: [valid, cond.dim()] int64, a view of its first column) with
    the count of valid labels known (fake tensors have no values for ``nonzero`` to read)."""
    import torch

    nz = torch.empty((valid, cond.dim()), dtype=torch.long)
    return nz[:, 0]


def _tensor_split(h: Any, n: int, dim: int) -> list[Any]:
    return list(h.tensor_split(n, dim=dim))


def chunked_output_loss(model: Any, hidden: Any, ids: Any, chunks: int) -> Any:
    """torchtune: ``[output(c) for c in h.tensor_split(n, dim=1)]``, labels shifted, CEWithChunkedOutputLoss,
    the logits deleted before backward."""
    import torch
    import torch.nn.functional as F

    head = _head(model)
    logits = [head(c) for c in _tensor_split(hidden, chunks, 1)]
    labels = torch.hstack((ids[..., 1:], torch.full((ids.shape[0], 1), -100, dtype=ids.dtype)))
    total_elements = (labels != -100).sum()
    label_chunks = [c.reshape(-1) for c in labels.tensor_split(chunks, dim=1)]
    logit_chunks = [c.reshape(-1, c.size(-1)) for c in logits]
    total: Any = 0.0
    for lc, tc in zip(logit_chunks, label_chunks, strict=True):
        total += F.cross_entropy(lc.float(), tc, ignore_index=-100, reduction="sum")
    del logits, logit_chunks, label_chunks, labels
    return total / total_elements


def linear_ce_loss(model: Any, hidden: Any, ids: Any, chunks: int) -> Any:
    """torchtune LinearCrossEntropyLoss (mask_ignored_tokens=True) with the recipe's label shift."""
    import torch
    import torch.nn.functional as F

    head = _head(model)
    labels = torch.hstack((ids[..., 1:], torch.full((ids.shape[0], 1), -100, dtype=ids.dtype)))
    valid = ids.shape[0] * (ids.shape[1] - 1)  # every label but the appended ignore_index
    total_valid = _where(labels != -100, valid).numel()
    targets = labels.reshape(-1)
    outputs = hidden.reshape(-1, hidden.shape[-1])
    indices = _where(targets != -100, valid)
    outputs = outputs.index_select(0, indices)
    targets = targets.index_select(0, indices)
    del indices
    total = torch.tensor(0.0)
    for hc, tc in zip(outputs.tensor_split(chunks, dim=0), targets.tensor_split(chunks, dim=0), strict=True):
        logits = head(hc)
        total += F.cross_entropy(logits.float(), tc, reduction="sum", ignore_index=-100)
        del logits
    del outputs, targets, labels
    return total / max(1, total_valid)


LOSSES = {"chunked": chunked_output_loss, "chunked-linear": linear_ce_loss}


def standard_loss(model: Any, hidden: Any, ids: Any, chunks: int) -> Any:
    """LlamaForCausalLM.forward's head and loss (``logits_to_keep=0``) from the final norm's output."""
    base = base_model(model)
    logits = base.lm_head(hidden[:, slice(0, None), :])
    return base.loss_function(logits=logits, labels=ids, vocab_size=base.config.get_text_config().vocab_size)


def optimizers_in_backward(params: list[Any], make: Any) -> dict[Any, Any]:
    """One optimizer per parameter, stepped and zeroed as soon as its gradient is accumulated."""
    opts = {p: make([p]) for p in params}

    def hook(p: Any) -> None:
        opts[p].step()
        opts[p].zero_grad()

    for p in params:
        p.register_post_accumulate_grad_hook(hook)
    return opts
