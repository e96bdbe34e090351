"""Ground truth for tensor parallelism: rank 0 of a TP group, measured by PyTorch's MemTracker.

A small transformers model is built under FakeTensorMode and parallelised with DTensor
(``torch.distributed.tensor.parallel.parallelize_module``) on torch's fake process group, with torchtitan's
plan (``torchtitan/models/llama3/infra/parallelize.py`` ``apply_tp``) mapped onto transformers' module names:

* q/k/v, gate/up ``ColwiseParallel``, o/down ``RowwiseParallel``, the token embedding ``RowwiseParallel``
  (vocabulary rows), the head ``ColwiseParallel``;
* sequence parallelism: ``SequenceParallel`` on every norm, the row-parallel outputs and the embedding
  reduce-scattered to ``Shard(1)``, ``PrepareModuleInput`` all-gathering the attention's and the MLP's input
  (the residual stream stays a DTensor so that transformers sizes its masks and rotary tables by the whole
  sequence);
* the head: its logits gathered to every rank (``Replicate()``: transformers' ``colwise_gather_output``) or
  kept sharded under ``loss_parallel()`` (torchtitan's default).

Two optimizer steps (AdamW, foreach, one parameter group of DTensors and one of plain tensors, since foreach
cannot mix them) under ``torch.autocast(bfloat16)`` with fp32 weights; the peaks of the second are kept.

One shim, which changes no allocation of a real rank: DTensor derives each op's global output metadata by
running the op on global-shape fake tensors (``torch/distributed/tensor/_sharding_prop.py``
``_propagate_tensor_meta_non_cached``) in ``detect_fake_mode() or FakeTensorMode()``. On a GPU that is a
private fake mode and allocates nothing; under the tracer's FakeTensorMode it would be detected, and
MemTracker would count the global-shape shadow tensors (loss_parallel's handlers call it on every step: two
``tokens x vocab`` fp32 tensors). The shim makes the propagation use its own fake mode, as on a GPU.
Writes ``tests/reference/distributed/tp.json``; run with the project's venv (torch, transformers):
``.venv/bin/python validation/truth_tp.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "reference" / "distributed" / "tp.json"
sys.path.insert(0, str(REPO / "gpumem_gui" / "trace"))

# two small decoder-only models (rank-sized: heads and KV heads divisible by tp = 4)
MODELS: dict[str, dict[str, Any]] = {
    "tiny-llama": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 1024,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    },
    "tiny-qwen2": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 384,
        "intermediate_size": 1024,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "num_hidden_layers": 3,
        "vocab_size": 2048,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    },
}
BATCH, SEQ = 2, 128


def training_run(p: dict[str, Any]) -> Any:
    """The gpumem run a stored point stands for (``validate.py`` section (g) estimates it; the accuracy test
    ``tests/test_truth_tp.py`` maps points the same way): torchtitan keeps the head's logits vocab-parallel
    under ``loss_parallel``, transformers' TP plan (plain PyTorch) gathers them."""
    from gpumem_gui.core.training import make_training_run

    return make_training_run(
        batch=p["batch"],
        seq=p["seq"],
        tp=p["tp"],
        sequence_parallel=p["sequence_parallel"],
        precision=p["precision"],
        optimizer=p["optimizer"],
        framework="torchtitan" if p["loss_parallel"] else "pytorch",
    )


def _plan(sp: bool) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    row = RowwiseParallel(output_layouts=Shard(1), use_local_output=False) if sp else RowwiseParallel()
    plan: dict[str, Any] = {
        **{f"self_attn.{p}_proj": ColwiseParallel() for p in "qkv"},
        "self_attn.o_proj": row,
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": row,
    }
    if sp:
        plan |= {
            "input_layernorm": SequenceParallel(),
            "post_attention_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            ),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        }
    return plan


def _parallelize(model: Any, mesh: Any, sp: bool, lp: bool) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    for layer in model.model.layers:
        parallelize_module(layer, mesh, _plan(sp))
    top: dict[str, Any] = {
        "model.embed_tokens": RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate(), use_local_output=not sp
        ),
        "lm_head": ColwiseParallel(
            input_layouts=Shard(1) if sp else Replicate(),
            output_layouts=Shard(-1) if lp else Replicate(),
            use_local_output=not lp,
        ),
    }
    if sp:
        top["model.norm"] = SequenceParallel()
    parallelize_module(model, mesh, top)


def _optimizer(model: Any) -> Any:
    import torch
    from torch.distributed.tensor import DTensor

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if isinstance(p, DTensor)]},
        {"params": [p for p in params if not isinstance(p, DTensor)]},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=1e-5, foreach=True)


def _steps(model: Any, opt: Any, mt: Any, ids: Any, lp: bool) -> None:
    import torch
    from gpumem_trace_worker.tracking import restart_peaks
    from torch.distributed.tensor.parallel import loss_parallel

    for last in (False, True):
        if last:
            restart_peaks(mt)
        mt.enter("forward" if last else "warmup")
        parallel_loss = loss_parallel() if lp else contextlib.nullcontext()
        with torch.autocast("cpu", dtype=torch.bfloat16), parallel_loss:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        mt.enter("backward" if last else "warmup", forward=False)
        with loss_parallel() if lp else contextlib.nullcontext():
            loss.backward()
        del loss
        mt.enter("optimizer" if last else "warmup", forward=False)
        opt.step()
        opt.zero_grad(set_to_none=True)


def measure(config: dict[str, Any], tp: int, sp: bool, lp: bool) -> dict[str, dict[str, int]]:
    """Phase peaks (MemTracker categories) of rank 0 of ``tp`` ranks."""
    import torch
    import torch.distributed as dist
    import torch.distributed.tensor._sharding_prop as _sharding_prop
    import transformers
    from gpumem_trace_worker.building import patch_transformers_for_fake
    from gpumem_trace_worker.tracking import memory_tracker
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    patch_transformers_for_fake()
    _sharding_prop.detect_fake_mode = lambda *a, **k: None  # metadata in a private fake mode (see above)
    cfg = transformers.AutoConfig.for_model(**config)
    cfg._attn_implementation = "sdpa"
    dist.init_process_group("fake", rank=0, world_size=tp, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (tp,))  # from real tensors, outside the fake mode
        with FakeTensorMode():
            model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
            model.train()
            _parallelize(model, mesh, sp, lp)
            ids = torch.randint(0, config["vocab_size"], (BATCH, SEQ))
            opt = _optimizer(model)
            mt = memory_tracker()
            mt.track_external(model, ids, opt)
            with mt:
                _steps(model, opt, mt, ids, lp)
            return {k: v for k, v in mt.phase_peaks.items() if k != "warmup"}
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    import torch
    import transformers

    points = []
    for name, config in MODELS.items():
        for tp in (2, 4):
            for sp in (False, True):
                for lp in (False, True):
                    phases = measure(config, tp, sp, lp)
                    points.append(
                        {
                            "model": name,
                            "tp": tp,
                            "sequence_parallel": sp,
                            "loss_parallel": lp,
                            "batch": BATCH,
                            "seq": SEQ,
                            "precision": "amp-bf16",
                            "optimizer": "adamw",
                            "phases": phases,
                        }
                    )
                    total = {k: v["Total"] for k, v in phases.items()}
                    print(f"{name} tp={tp} sp={sp} loss_parallel={lp}: {total}")
    doc = {
        "about": (
            "rank 0 of a DTensor tensor-parallel group on torch's fake process group, MemTracker phase peaks "
            "of the second optimizer step; made by validation/truth_tp.py"
        ),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "models": MODELS,
        "points": points,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"{len(points)} points -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
