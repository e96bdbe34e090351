"""Count the memory of LoRA training steps of a DeepSeek-V4 config by its live storages (issue 29), a check
on `gpumem trace` where PyTorch's MemTracker keeps tensors alive that a run frees.

Why: ``gpumem trace`` counts with ``torch.distributed._tools.mem_tracker.MemTracker``, and a step run under
it keeps part of DeepSeek-V4's indexer graph alive, which the same step frees without it. The indexer ends in
integer top-k indices (``DeepseekV4Indexer.forward``, modeling_deepseek_v4.py), so no backward ever runs
through its scorer; with LoRA adapters upstream of it (or on it) that graph is recorded, and with the
tracker's hooks on it (presumably its ``ModTracker`` module hooks; not followed further) its tensors
outlive the step, the tracker and ``gc.collect()``. Measured on the tiny config, LoRA on all-linear less
o_a_proj, seq 64: 415,872 B alive after ``loss.backward()`` with the tracker, none (the gradients and
input ids only) without it, the model built by gpumem trace's own ``prepare`` in both. The traced phases
are 0 to 14 % above what the step holds (the checkpointed forwards equal it to the byte).

How: the real model (``DeepseekV4ForCausalLM._from_config`` in bf16, the fp32 modules kept fp32; real CPU
tensors, eager attention) with PEFT's LoRA as ``gpumem trace`` builds it (gradient checkpointing enabled
before ``get_peft_model``, non-reentrant; AdamW foreach; one warm-up step on zero gradients so the states
exist, as the trace does); then one step under a ``TorchDispatchMode`` that adds every new storage an op
returns and a ``weakref.finalize`` that subtracts it when it dies. A phase's peak is what was alive before
the step (parameters, buffers, optimizer states, input ids) plus the most the step's storages reached in it.

Run with the ground-truth environment (torch 2.13 CPU, transformers 5.24, peft 0.21):
``.venv/bin/python validation/measure_dsv4_lora.py tests/reference/extra/configs/
synthetic__deepseek_v4-tiny.json > tests/reference/extra/deepseek_v4_lora_storage.json``
"""

from __future__ import annotations

import contextlib
import json
import sys
import weakref
from pathlib import Path
from typing import Any

ALL = "q_a_proj,q_b_proj,kv_proj,o_b_proj,gate_proj,up_proj,down_proj,weights_proj"  # all-linear but o_a_proj
ATTENTION = "q_a_proj,q_b_proj,kv_proj,o_b_proj"
# the points of tests/reference/extra/deepseek_v4_trace.json's LoRA steps (run fields as gpumem names them)
POINTS = [
    {"batch": 1, "seq": 64, "precision": "bf16", "lora_targets": ALL},
    {"batch": 1, "seq": 100, "precision": "bf16", "lora_targets": ALL, "grad_ckpt": True},
    {"batch": 2, "seq": 128, "precision": "amp-bf16", "lora_targets": ATTENTION},
    {"batch": 2, "seq": 97, "precision": "amp-bf16", "lora_targets": ATTENTION, "grad_ckpt": True},
    {"batch": 2, "seq": 97, "precision": "amp-bf16", "lora_targets": ALL},
]


class Counter:
    """Live bytes of the storages made since it started (each storage once, by its data pointer)."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self.seen: set[int] = set()

    def add(self, st: Any) -> None:
        key, nbytes = st.data_ptr(), st.nbytes()
        if nbytes == 0 or key in self.seen:
            return
        self.seen.add(key)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(st, self._free, key, nbytes)

    def _free(self, key: int, nbytes: int) -> None:
        self.seen.discard(key)
        self.live -= nbytes

    def phase(self) -> None:
        """A new phase starts: its peak starts from what is alive now."""
        self.peak = self.live


def _mode(counter: Counter, known: set[int]) -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Storages(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in known:
                    counter.add(t.untyped_storage())
            return out

    return Storages()


def _storage_bytes(tensors: list[Any]) -> tuple[int, set[int]]:
    """Bytes of the distinct storages of ``tensors`` and their data pointers."""
    by_ptr = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(by_ptr.values()), set(by_ptr)


def measure_point(config: Path, point: dict[str, Any]) -> dict[str, Any]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    raw = json.loads(config.read_text())
    cfg = DeepseekV4Config(
        **{k: v for k, v in raw.items() if k not in ("model_type", "architectures", "torch_dtype")}
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    if point.get("grad_ckpt"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=point["lora_targets"].split(","))
    model = get_peft_model(model, lora)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, foreach=True)
    for p in params:  # the warm-up step of gpumem trace: every state exists
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    ids = torch.randint(0, cfg.vocab_size, (point["batch"], point["seq"]))
    states = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    before = [*model.parameters(), *model.buffers(), *states, ids]
    held, known = _storage_bytes(before)
    counter = Counter()
    phases: dict[str, int] = {}
    autocast = (
        torch.autocast("cpu", dtype=torch.bfloat16)
        if point["precision"] == "amp-bf16"
        else contextlib.nullcontext()
    )
    with _mode(counter, known):
        with autocast:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        phases["forward"] = held + counter.peak
        counter.phase()
        loss.backward()
        del loss
        phases["backward"] = held + counter.peak
        counter.phase()
        opt.step()
        phases["optimizer"] = held + counter.peak
        opt.zero_grad(set_to_none=True)
    return {
        "run": {"method": "lora", "attn": "eager", "optimizer": "adamw", **point},
        "phases": phases,
        "trainable_params": sum(p.numel() for p in params),
    }


def main() -> None:
    import peft
    import torch
    import transformers

    config = Path(sys.argv[1])
    doc = {
        "about": "LoRA steps of DeepseekV4ForCausalLM counted by their live storages (a TorchDispatchMode "
        "and weakref finalizers): what the step holds without PyTorch's MemTracker, under which part of the "
        "indexer's graph stays alive. Script: validation/measure_dsv4_lora.py",
        "config": config.stem,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
        },
        "points": [measure_point(config, p) for p in POINTS],
    }
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
