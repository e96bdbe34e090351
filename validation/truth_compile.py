"""Ground truth for compiled code: what Inductor's partitioner saves for backward, on the CPU.

``torch.compile`` (backend ``inductor``, the one torchtune and torchtitan use) runs on the CPU when a C++
compiler is installed. For each piece of a decoder layer and each loss the replay models as compiled
(replay/tricks.py, replay/loss.py), this script compiles the PyTorch code of that piece as the frameworks run
it (transformers' ``LlamaMLP`` / ``LlamaRMSNorm`` / ``apply_rotary_pos_emb``, ``ForCausalLMLoss``,
torchtune's ``compute_cross_entropy`` of ``CEWithChunkedOutputLoss`` and ``LinearCrossEntropyLoss``,
torchtitan's ``cross_entropy_loss``) and records what the compiled graph keeps for backward: the tensors of
``out.grad_fn.saved_tensors`` (AOTAutograd's ``CompiledFunction`` saves exactly the forward graph's extra
outputs that ``min_cut_rematerialization_partition`` chose), parameters left out, as (bytes, dtype)
pairs. The eager saved tensors of the same code (``saved_tensors_hooks``) are recorded beside them. Then a
whole model: transformers' ``LlamaForCausalLM`` of a tiny config (:data:`MODEL`), bf16, one step's forward
with its loss (``model(input_ids, labels=input_ids)``), eager and under ``torch.compile(model)`` (what the HF
Trainer's ``torch_compile=True`` does): the bytes of every distinct non-parameter storage the autograd graph
keeps (the ``_saved_*`` tensors of eager nodes and ``saved_tensors`` of the compiled ones). Written to
``tests/reference/distributed/compile.json``; ``tests/test_compile.py`` checks the replay against it.

Run: ``.venv/bin/python validation/truth_compile.py`` (a few minutes on a CPU: every piece is compiled).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "reference" / "distributed" / "compile.json"
BF16 = torch.bfloat16
T, D, F_, V = 64, 32, 96, 1000  # tokens, hidden, intermediate, vocabulary (small: the partition is by shape)
HEADS, HD = 4, 8
_DT = {torch.bfloat16: "bf16", torch.float32: "f32", torch.int64: "i64", torch.bool: "bool"}


def swiglu(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
    """transformers LlamaMLP.forward: down_proj(act_fn(gate_proj(x)) * up_proj(x))."""
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """transformers LlamaRMSNorm.forward."""
    hs = x.to(torch.float32)
    variance = hs.pow(2).mean(-1, keepdim=True)
    hs = hs * torch.rsqrt(variance + 1e-6)
    return w * hs.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """transformers apply_rotary_pos_emb."""
    return (q * cos) + (_rotate_half(q) * sin), (k * cos) + (_rotate_half(k) * sin)


def hf_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformers ForCausalLMLoss (torch.compile(model) compiles it with the forward): upcast, pad + shift
    the labels, mean cross-entropy."""
    logits = logits.float()
    labels = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)


def chunk_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """torchtune CEWithChunkedOutputLoss.compute_cross_entropy (torchtitan cross_entropy_loss is the same
    call on the full logits)."""
    return F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")


def linear_ce(hidden: torch.Tensor, w: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """torchtune LinearCrossEntropyLoss.compute_cross_entropy: the head's projection and the upcast CE."""
    return F.cross_entropy(F.linear(hidden, w).float(), labels, ignore_index=-100, reduction="sum")


def _leaf(*shape: int, grad: bool = True, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def _cases() -> dict[str, tuple[Callable[..., Any], tuple[Any, ...], int]]:
    """name: (function, inputs, how many leading inputs are activations, not parameters)."""
    labels = torch.randint(0, V, (T,))
    cos, sin = torch.randn(T, HD, dtype=BF16), torch.randn(T, HD, dtype=BF16)
    return {
        "swiglu-full": (swiglu, (_leaf(T, D), _leaf(F_, D), _leaf(F_, D), _leaf(D, F_)), 1),
        "swiglu-frozen": (
            swiglu,
            (_leaf(T, D), _leaf(F_, D, grad=False), _leaf(F_, D, grad=False), _leaf(D, F_, grad=False)),
            1,
        ),
        "rms-norm": (rms_norm, (_leaf(T, D), _leaf(D)), 1),
        "rope": (rope, (_leaf(HEADS, T, HD), _leaf(2, T, HD), cos, sin), 2),
        "hf-loss": (hf_loss, (_leaf(1, T, V), labels.view(1, T)), 1),
        "chunk-ce": (chunk_ce, (_leaf(T, V), labels), 1),
        "linear-ce": (linear_ce, (_leaf(T, D), _leaf(V, D), labels), 1),
    }


def _describe(ts: list[torch.Tensor], params: list[torch.Tensor]) -> list[list[Any]]:
    """(numel, dtype) of each distinct saved storage that is not a parameter, largest first."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, list[Any]] = {}
    for t in ts:
        ptr = t.untyped_storage().data_ptr()
        if ptr in skip or ptr in seen:
            continue
        seen[ptr] = [t.untyped_storage().nbytes(), _DT[t.dtype]]
    return sorted(seen.values(), key=lambda e: -e[0])


def _outputs(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, tuple) else (out,)


def _eager(fn: Callable[..., Any], args: tuple[Any, ...], params: list[torch.Tensor]) -> list:
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return _describe(saved, params)


def _compiled(fn: Callable[..., Any], args: tuple[Any, ...], params: list[torch.Tensor]) -> dict:
    torch._dynamo.reset()
    outs = _outputs(torch.compile(fn, backend="inductor", fullgraph=True)(*args))
    saved = list(outs[0].grad_fn.saved_tensors)  # one CompiledFunction node for every output
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    grads = {
        i: _DT[a.grad.dtype] for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.grad is not None
    }
    return {"saved": _describe(saved, params), "grad_dtypes": grads}


# a tiny Llama: the partition depends on the ops and their shapes' ratios, not on the sizes
MODEL = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 176,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 1000, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False,
    "mlp_bias": False,
}  # fmt: skip
MODEL_SEQ = 64


def _graph_saved(root: Any, params: set[int]) -> int:
    """Bytes of the distinct non-parameter storages every node behind ``root`` saved."""
    seen, out, todo = set(), {}, [root]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        ts = list(fn.saved_tensors) if type(fn).__name__.startswith("CompiledFunction") else []
        for name in dir(fn):
            if not name.startswith("_saved_"):
                continue
            v = getattr(fn, name)
            if isinstance(v, torch.Tensor):
                ts.append(v)
            elif isinstance(v, tuple | list):
                ts += [x for x in v if isinstance(x, torch.Tensor)]
        for t in ts:
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                out[st.data_ptr()] = st.nbytes()
        todo += [n for n, _ in fn.next_functions]
    return sum(out.values())


def _model(compiled: bool) -> int:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    torch._dynamo.reset()
    fields = {k: v for k, v in MODEL.items() if k not in ("model_type", "architectures", "torch_dtype")}
    model = LlamaForCausalLM(LlamaConfig(**fields, attn_implementation="sdpa")).to(BF16)
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    ids = torch.randint(0, MODEL["vocab_size"], (1, MODEL_SEQ))
    out = (torch.compile(model) if compiled else model)(input_ids=ids, labels=ids)
    return _graph_saved(out.loss.grad_fn, params)


def main() -> None:
    torch.manual_seed(0)
    doc: dict[str, Any] = {
        "torch": torch.__version__,
        "backend": "inductor (CPU)",
        "shapes": {"tokens": T, "hidden": D, "intermediate": F_, "vocab": V, "heads": HEADS, "head_dim": HD},
        "note": "saved: [bytes, dtype] of each distinct non-parameter storage the graph keeps for backward",
        "cases": {},
    }
    for name, (fn, args, acts) in _cases().items():
        params = [a for a in args[acts:] if isinstance(a, torch.Tensor) and a.is_floating_point()]
        eager = _eager(fn, args, params)
        fresh = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)
        params = [a for a in fresh[acts:] if isinstance(a, torch.Tensor) and a.is_floating_point()]
        doc["cases"][name] = {"eager": eager, "compiled": _compiled(fn, fresh, params)}
        print(name, json.dumps(doc["cases"][name]), file=sys.stderr)
    doc["model"] = {
        "config": MODEL,
        "batch": 1,
        "seq": MODEL_SEQ,
        "eager": _model(False),
        "compiled": _model(True),
    }
    print("model", json.dumps(doc["model"]), file=sys.stderr)
    OUT.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
