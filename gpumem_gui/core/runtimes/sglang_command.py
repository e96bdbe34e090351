"""SGLang's own launch command for a run (Edit > Copy as), and the option values both that command and the
SGLang importer (:mod:`gpumem_gui.core.imports.sglang`) spell, declared once.

Every option and value written is one ``python -m sglang.launch_server`` accepts
(``python/sglang/srt/server_args.py`` ``ServerArgs.add_cli_args``): ``--dtype`` as ``SERVER_DTYPES``
(:mod:`.base`); ``--kv-cache-dtype`` auto, fp8_e5m2, fp8_e4m3, bf16 / bfloat16 (fp4_e2m1 on Blackwell, not
modelled); ``--quantization`` from ``QUANTIZATION_CHOICES``.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from gpumem_gui.core.runtimes.base import server_dtype_args

if TYPE_CHECKING:
    from gpumem_gui.core.runtimes.run import InferenceRun

# --kv-cache-dtype value -> gpumem KV dtype id (server_args.py); the first spelling is the one written
SGLANG_KV_DTYPES = {
    "auto": "auto",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp8_e5m2": "fp8_e5m2",
    "fp8_e4m3": "fp8_e4m3",
}
# --quantization methods that quantize a 16-bit checkpoint while loading -> gpumem weight format (SGLang's
# python/sglang/srt/layers/quantization: fp8 on a bf16 checkpoint quantizes per tensor on load (Fp8Config
# without is_checkpoint_fp8_serialized); bitsandbytes 4-bit NF4 on load)
SGLANG_ONLINE_QUANT = {"fp8": "fp8", "bitsandbytes": "nf4"}


def _ratio(x: float) -> str:
    return repr(float(x))  # the shortest text that reads back as the same float (":g" kept 6 digits)


def sglang_command(model: str, run: InferenceRun) -> list[str]:
    """``python -m sglang.launch_server`` for the run, as shell-quoted lines."""
    defaults = type(run).model_fields
    args = ["python", "-m", "sglang.launch_server", "--model-path", model, "--tp", str(run.tp)]
    if run.pp > 1:
        args += ["--pp-size", str(run.pp)]
    if run.dp_size > 1:
        args += ["--dp-size", str(run.dp_size)] + (
            ["--enable-dp-attention"] if run.enable_dp_attention else []
        )
    if run.ep > 1:
        args += ["--ep-size", str(run.ep)]
    # left to SGLang, the fraction is its own default for the GPU it starts on (sglang_defaults.py), as the
    # estimate resolves it: written only when the run sets it
    if run.mem_fraction_static is not None:
        args += ["--mem-fraction-static", _ratio(run.mem_fraction_static)]
    if run.max_model_len:
        args += ["--context-length", str(run.max_model_len)]
    args += server_dtype_args(run, SGLANG_ONLINE_QUANT)
    if run.kv_dtype != "auto":
        args += ["--kv-cache-dtype", next(k for k, v in SGLANG_KV_DTYPES.items() if v == run.kv_dtype)]
    for flag, value in (
        ("--chunked-prefill-size", run.chunked_prefill_size),
        ("--max-running-requests", run.max_running_requests),
        ("--cuda-graph-max-bs", run.cuda_graph_max_bs),
        ("--page-size", run.page_size),
        ("--max-total-tokens", run.max_total_tokens),
    ):
        if value is not None:
            args += [flag, str(value)]
    for flag, name in (
        ("--swa-full-tokens-ratio", "swa_full_tokens_ratio"),
        ("--mamba-full-memory-ratio", "mamba_full_memory_ratio"),
    ):
        if getattr(run, name) != defaults[name].default:  # the field defaults are SGLang's (sglang_options)
            args += [flag, _ratio(getattr(run, name))]
    if run.max_mamba_cache_size is not None:
        args += ["--max-mamba-cache-size", str(run.max_mamba_cache_size)]
    if run.mamba_ssm_dtype != "auto":
        args += ["--mamba-ssm-dtype", run.mamba_ssm_dtype]
    args += ["--disable-cuda-graph"] * run.disable_cuda_graph
    args += ["--disable-radix-cache"] * run.disable_radix_cache
    return [shlex.join(args)]
