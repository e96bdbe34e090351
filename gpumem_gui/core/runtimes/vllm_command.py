"""vLLM's own launch command for a run (Edit > Copy as, ``gpumem ... --command``), and the option values both
that command and the vLLM importer (:mod:`gpumem_gui.core.imports.vllm`) spell, declared once.

Every option and value written is one ``vllm serve`` accepts: option names from ``vllm/engine/arg_utils.py``
``EngineArgs.add_cli_args``; ``--dtype`` from ``vllm/config/model.py`` ``ModelDType`` (auto, half, float16,
bfloat16, float, float32); ``--kv-cache-dtype`` from ``vllm/config/cache.py`` ``CacheDType`` (auto, bfloat16,
fp8, fp8_e4m3, fp8_e5m2, fp8_inc, fp8_ds_mla: no float16 / float32); ``--quantization`` from
``vllm/model_executor/layers/quantization/__init__.py`` ``QuantizationMethods``.
"""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpumem_gui.core.results.estimate import Estimate
    from gpumem_gui.core.runtimes.run import InferenceRun

# --dtype value -> gpumem compute dtype (vllm/config/model.py ModelDType; "auto" is the checkpoint's dtype)
VLLM_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "half": "fp16", "float": "fp32"}
# --kv-cache-dtype value -> gpumem KV dtype id (vllm/config/cache.py CacheDType)
VLLM_KV_DTYPES = {
    "auto": "auto",
    "fp8": "fp8",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
    "bfloat16": "bf16",
}
# --quantization methods that quantize a 16-bit checkpoint while loading -> gpumem weight format
# (vllm/model_executor/layers/quantization: fp8 dynamic per-tensor (Fp8Config, no checkpoint scales);
# bitsandbytes in-flight 4-bit NF4 (model_loader/bitsandbytes_loader.py)); the first method of a format is
# the one the command writes
VLLM_ONLINE_QUANT = {"fp8": "fp8", "bitsandbytes": "nf4", "ptpc_fp8": "fp8", "fbgemm_fp8": "fp8"}


def _first(table: dict[str, str], value: str) -> str:
    return next(k for k, v in table.items() if v == value)


def vllm_writes_weights(run: InferenceRun, checkpoint: str | None) -> str | None:
    """Why ``vllm serve`` cannot load the run's weights as the run has them (None: it can): vLLM casts a
    float checkpoint to ``--dtype``, quantizes on load only to fp8 and bitsandbytes NF4, and reads any other
    format from a checkpoint published in it (``checkpoint``: the model's own format, None when unknown)."""
    w = run.weights
    if w in ("file", run.compute_dtype) or w in VLLM_ONLINE_QUANT.values() or w == checkpoint:
        return None
    if w in VLLM_DTYPES.values():
        return (
            f"vLLM casts float weights to --dtype: weights {w} with compute dtype {run.compute_dtype} are "
            f"loaded as {run.compute_dtype} (set the weights to {run.compute_dtype})"
        )
    return (
        f"vLLM quantizes on load only to fp8 or bitsandbytes NF4; {w} weights come from a checkpoint "
        "published in that format (open that checkpoint)"
    )


def vllm_command(model: str, run: InferenceRun, est: Estimate, checkpoint: str | None = None) -> list[str]:
    """``vllm serve`` for the run, as shell-quoted lines (with environment assignments)."""
    max_len = run.max_model_len or int(est.facts.get("max_model_len", run.tokens) or run.tokens)  # type: ignore[call-overload]
    args = ["vllm", "serve", model, "--max-model-len", str(max_len)]
    # repr: the shortest text that reads back as the same float (":g" kept 6 digits)
    args += ["--gpu-memory-utilization", repr(run.gpu_memory_utilization)]
    if run.weights in VLLM_ONLINE_QUANT.values() and run.weights not in VLLM_DTYPES.values():
        args += ["--quantization", _first(VLLM_ONLINE_QUANT, run.weights)]
    # the compute dtype, which is also the weights' for a float checkpoint; left to vLLM's "auto" (the
    # checkpoint's) only for a checkpoint in its own quantized format at the default bf16
    if run.compute_dtype != "bf16" or run.weights in (run.compute_dtype, *VLLM_ONLINE_QUANT.values()):
        args += ["--dtype", _first(VLLM_DTYPES, run.compute_dtype)]
    if run.kv_dtype != "auto":
        args += ["--kv-cache-dtype", _first(VLLM_KV_DTYPES, run.kv_dtype)]
    args += ["--tensor-parallel-size", str(run.tp)]
    if run.pp > 1:
        args += ["--pipeline-parallel-size", str(run.pp)]
    if run.ep > 1:  # vLLM's expert parallelism spans the tensor-parallel GPUs (ep = tp, vllm_expresses)
        args.append("--enable-expert-parallel")
    for flag, value in (
        ("--max-num-seqs", run.max_num_seqs),
        ("--max-num-batched-tokens", run.max_num_batched_tokens),
        ("--max-cudagraph-capture-size", run.max_cudagraph_capture_size),
    ):
        if value is not None:
            args += [flag, str(value)]
    if run.block_size != type(run).model_fields["block_size"].default:
        args += ["--block-size", str(run.block_size)]
    if not run.hybrid_kv_cache:
        args.append("--disable-hybrid-kv-cache-manager")
    if run.images_per_prompt is not None:
        args += ["--limit-mm-per-prompt", json.dumps({"image": run.images_per_prompt})]
    if run.enforce_eager:
        args.append("--enforce-eager")
    if not run.profile_cudagraphs:  # vllm/envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS
        args = ["VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0", *args]
    return [shlex.join(args)]


def vllm_expresses(run: InferenceRun, checkpoint: str | None) -> str | None:
    """Why ``vllm serve`` cannot express the run (None: it can)."""
    if run.ep > 1 and run.ep != run.tp:
        return (
            f"vLLM's expert parallelism spans the tensor-parallel GPUs (--enable-expert-parallel: ep = tp "
            f"{run.tp}), not ep {run.ep}"
        )
    return vllm_writes_weights(run, checkpoint)
