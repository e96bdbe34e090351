"""The broad grid of the refactoring oracle (:mod:`regression`): every reference config x inference and
training modes x a few shapes x parallel plans."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from regression_record import jsonable

REPO = Path(__file__).resolve().parents[1]


def _config_files() -> list[Path]:
    dirs = [REPO / "tests" / "reference" / "configs", REPO / "tests" / "reference" / "extra" / "configs"]
    return sorted(p for d in dirs for p in d.glob("*.json"))


# the inference runs of every config: three attention kernels x four shapes, then each engine once or twice
# (Ollama at both its eras: v0.30+ llama-server, v0.12.10's own runner)
INFER: list[dict[str, Any]] = [
    dict(batch=batch, seq=seq, new_tokens=new, attn=attn)
    for attn in ("sdpa", "eager", "flash")
    for batch, seq, new in ((1, 512, 0), (2, 1024, 64), (1, 8192, 1), (4, 300, 1000))
]
INFER += [
    dict(batch=1, seq=4096, logits="all"),
    dict(batch=1, seq=4096, new_tokens=128, tp=2),
    dict(batch=1, seq=4096, new_tokens=128, pp=2),
    dict(batch=2, seq=4096, new_tokens=128, compute_dtype="fp32"),
    dict(batch=2, seq=4096, new_tokens=128, weights="nf4"),
    dict(batch=2, seq=4096, new_tokens=128, kv_dtype="fp8"),
    dict(batch=8, seq=2048, new_tokens=256, engine="vllm"),
    dict(batch=8, seq=2048, new_tokens=256, engine="vllm", tp=2, max_model_len=8192),
    dict(batch=1, seq=8192, new_tokens=256, engine="llama.cpp", weights="gguf-Q4_K_M"),
    dict(batch=1, seq=8192, new_tokens=256, engine="llama.cpp", weights="gguf-Q8_0", n_gpu_layers=3),
    dict(batch=8, seq=2048, new_tokens=256, engine="sglang"),
    *(
        dict(batch=1, seq=4096, new_tokens=256, engine="ollama", weights="gguf-Q4_K_M", **era)
        for era in ({"ollama_version": "0.30+"}, {"ollama_version": "0.12.10"})
    ),
]

# the training runs of every config (MoE configs add expert parallelism)
TRAIN: list[dict[str, Any]] = [
    dict(),
    dict(grad_ckpt=True, batch=2),
    dict(precision="bf16", attn="eager", seq=512),
    dict(precision="fp32", seq=512),
    dict(precision="amp-fp16", optimizer="adamw-fused", grad_accum=2),
    dict(precision="megatron-bf16", tp=2, dp=2),
    dict(method="lora", lora_rank=8),
    dict(method="lora", precision="bf16", grad_ckpt=True, lora_targets="q_proj,v_proj"),
    dict(method="qlora", qlora_base="nf4-dq", grad_ckpt=True, optimizer="paged-adamw-8bit"),
    dict(zero=3, dp=8, grad_ckpt=True),
    dict(zero=2, dp=4, offload="optimizer"),
    dict(fsdp="full_shard", dp=4),
    dict(fsdp="shard_grad_op", dp=2, optimizer="adafactor"),
    dict(pp=2, grad_accum=4, optimizer="lion"),
    dict(cp=2, seq=8192, grad_ckpt=True, optimizer="sgd-momentum"),
    dict(first_step=True, optimizer="adamw-8bit", frozen_layers=1),
]


def grid_calls(
    load_config_file: Callable[[Path], Any], make_run: Callable[..., Any]
) -> Iterator[dict[str, Any]]:
    """Every reference config x inference and training modes x a few shapes and plans (``load_config_file``
    and ``make_run`` as the code under test spells them)."""
    from gpumem_gui.core import GpumemError
    from gpumem_gui.core.fit import GpuTarget
    from gpumem_gui.core.training import make_training_run

    def call(fn: str, spec: Any, *args: Any) -> dict[str, Any]:
        rel = str(path.relative_to(REPO))
        return json.loads(json.dumps({"fn": fn, "config": rel, "args": jsonable(args), "kwargs": {}}))

    h100 = GpuTarget(name="H100-SXM-80GB", capacity_bytes=80 * 2**30, count=8)
    for path in _config_files():
        try:
            spec = load_config_file(path)
        except GpumemError:
            continue
        big = spec.num_layers * spec.hidden_size > 80 * 8192 or spec.moe is not None
        for kw in INFER:
            try:
                run = make_run(**kw)
            except GpumemError:
                continue
            yield call("estimate_inference", spec, run)
            if kw.get("engine") in ("vllm", "sglang", "ollama"):  # engines that size from the GPU's memory
                yield call("estimate_inference", spec, run, 80 * 2**30)
            if kw.get("engine") == "ollama":  # a GPU too small for many models: Ollama's placement
                yield call("estimate_inference", spec, run, 24 * 2**30)
        yield call("fit_report", spec, make_run(batch=4, seq=4096, new_tokens=256), h100)
        train = list(TRAIN)
        if spec.moe is not None:
            train.append(dict(ep=2, dp=2))
        for kw in train:
            kw = {"seq": 1024, **kw}
            if big:
                kw["seq"] = min(kw["seq"], 512)
            try:
                run = make_training_run(**kw)
            except GpumemError:
                continue
            yield call("estimate_training", spec, run)
        yield call("fit_training", spec, make_training_run(method="lora", seq=2048, grad_ckpt=True), h100)
