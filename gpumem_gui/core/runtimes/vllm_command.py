"""vLLM's own launch command for a run (Edit > Copy as, ``gpumem ... --command``), and the option values both
that command and the vLLM importer (:mod:`gpumem_gui.core.imports.vllm`) spell, declared once.

Every option and value written is one ``vllm serve`` accepts: option names from ``vllm/engine/arg_utils.py``
``EngineArgs.add_cli_args``; ``--dtype`` from ``vllm/config/model.py`` ``ModelDType`` (``SERVER_DTYPES``
in :mod:`.base`); ``--kv-cache-dtype`` from ``vllm/config/cache.py`` ``CacheDType`` (auto, bfloat16,
fp8, fp8_e4m3, fp8_e5m2, fp8_inc, fp8_ds_mla: no float16 / float32); ``--quantization`` from
``vllm/model_executor/layers/quantization/__init__.py`` ``QuantizationMethods``.
"""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING

from gpumem_gui.core.runtimes.base import server_dtype_args, server_weights_refusal

if TYPE_CHECKING:
    from gpumem_gui.core.results.estimate import Estimate
    from gpumem_gui.core.runtimes.run import InferenceRun

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


def vllm_command(model: str, run: InferenceRun, est: Estimate) -> list[str]:
    """``vllm serve`` for the run, as shell-quoted lines (with environment assignments)."""
    max_len = run.max_model_len or int(est.facts.get("max_model_len", run.tokens) or run.tokens)  # type: ignore[call-overload]
    args = ["vllm", "serve", model, "--max-model-len", str(max_len)]
    # repr: the shortest text that reads back as the same float (":g" kept 6 digits)
    args += ["--gpu-memory-utilization", repr(run.gpu_memory_utilization)]
    args += server_dtype_args(run, VLLM_ONLINE_QUANT)
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
    if run.vllm_engine == "v0":  # vllm/envs.py VLLM_USE_V1 (v0.8 to v0.10; V0 was the only engine before)
        args = ["VLLM_USE_V1=0", *args]
    elif not run.profile_cudagraphs:  # vllm/envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS
        args = ["VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0", *args]
    return [shlex.join(args)]


def vllm_expresses(run: InferenceRun, checkpoint: str | None) -> str | None:
    """Why ``vllm serve`` cannot express the run (None: it can)."""
    if run.ep > 1 and run.ep != run.tp:
        return (
            f"vLLM's expert parallelism spans the tensor-parallel GPUs (--enable-expert-parallel: ep = tp "
            f"{run.tp}), not ep {run.ep}"
        )
    return server_weights_refusal("vLLM", run, checkpoint, VLLM_ONLINE_QUANT)
