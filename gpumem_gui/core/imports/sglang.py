"""SGLang launch commands: ``python -m sglang.launch_server --model-path MODEL ...``, ``sglang serve
--model-path ...`` and ``docker run ... lmsysorg/sglang ... python3 -m sglang.launch_server ...``, read as an
:class:`InferenceRun` with engine ``sglang``.

Option names and values as ``python/sglang/srt/server_args.py`` (``ServerArgs``, ``add_cli_args``) declares
them, aliases included (``--tp`` / ``--tp-size`` / ``--tensor-parallel-size``, ``--dp`` / ``--dp-size``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpumem_gui.core.imports.base import (
    Arg,
    Reading,
    program,
    split_options,
    to_bool,
    to_float,
    to_int,
    words,
)
from gpumem_gui.core.runtimes.sglang_command import SGLANG_KV_DTYPES, SGLANG_ONLINE_QUANT

_MODULES = ("sglang.launch_server",)

# --kv-cache-dtype (server_args.py; fp4_e2m1 on Blackwell, not modelled) and --quantization methods that
# quantize a 16-bit checkpoint while loading: runtimes/sglang_command.py, shared with gpumem's command
_KV = SGLANG_KV_DTYPES
_ONLINE_QUANT = SGLANG_ONLINE_QUANT
# --quantization methods that read an already quantized checkpoint: its bytes are the files' own
_CHECKPOINT_QUANT = words(
    "awq awq_marlin gptq gptq_marlin marlin gguf modelopt modelopt_fp8 modelopt_fp4 petit_nvfp4 w8a8_int8 "
    "w8a8_fp8 moe_wna16 w4afp8 mxfp4 compressed-tensors auto-round qoq quark mxfp8 modelopt_mixed"
)
_FLAGS = frozenset(
    words(
        "--disable-cuda-graph --disable-radix-cache --enable-dp-attention --trust-remote-code "
        "--enable-torch-compile --enable-mixed-chunk --disable-overlap-schedule --enable-metrics "
        "--enable-p2p-check --disable-custom-all-reduce --enable-ep-moe --enable-hierarchical-cache "
        "--enable-memory-saver --skip-tokenizer-init --is-embedding --enable-nccl-nvls "
        "--disable-cuda-graph-padding --enable-piecewise-cuda-graph --enable-nan-detection "
        "--allow-auto-truncate --enable-cache-report --log-requests --show-time-cost --enable-lora "
        "--enable-deterministic-inference --enable-two-batch-overlap --enable-eplb --enable-symm-mem "
        "--disable-chunked-prefix-cache --enable-multimodal --disable-shared-experts-fusion "
        "--enable-dp-lm-head --disable-piecewise-cuda-graph --disable-hybrid-swa-memory "
        "--enable-double-sparsity --enable-flashinfer-allreduce-fusion --disable-fast-image-processor"
    )
)
_INT_FIELDS = {
    **dict.fromkeys(("--tp-size", "--tp", "--tensor-parallel-size"), ("tp", 1, 4096)),
    **dict.fromkeys(("--pp-size", "--pipeline-parallel-size"), ("pp", 1, 4096)),
    **dict.fromkeys(("--dp-size", "--dp", "--data-parallel-size"), ("dp_size", 1, 4096)),
    **dict.fromkeys(("--ep-size", "--ep", "--expert-parallel-size"), ("ep", 1, 4096)),
    "--max-running-requests": ("max_running_requests", 1, 1 << 20),
    "--cuda-graph-max-bs": ("cuda_graph_max_bs", 1, 4096),
    "--page-size": ("page_size", 1, 4096),
    "--max-total-tokens": ("max_total_tokens", 1, (1 << 31) - 1),
    "--max-mamba-cache-size": ("max_mamba_cache_size", 1, 1 << 24),
}
_VALUED = frozenset(
    [
        *_INT_FIELDS,
        "--model-path",
        "--model",
        "--mem-fraction-static",
        "--context-length",
        "--dtype",
        "--chunked-prefill-size",
        "--max-prefill-tokens",
        "--kv-cache-dtype",
        "--quantization",
        "--cuda-graph-bs",
        "--swa-full-tokens-ratio",
        "--mamba-full-memory-ratio",
        "--mamba-ssm-dtype",
    ]
)
_BOOL_FIELDS = {
    "--disable-cuda-graph": "disable_cuda_graph",
    "--disable-radix-cache": "disable_radix_cache",
    "--enable-dp-attention": "enable_dp_attention",
}
_NO_MEMORY = (
    {
        k: "server / API option: no effect on GPU memory"
        for k in words(
            "--host --port --api-key --served-model-name --chat-template --log-level --log-level-http "
            "--log-requests --log-requests-level --show-time-cost --enable-metrics --decode-log-interval "
            "--stream-interval --enable-cache-report --reasoning-parser --tool-call-parser "
            "--file-storage-path "
            "--watchdog-timeout --dist-timeout --random-seed --schedule-policy --schedule-conservativeness "
            "--grammar-backend --sampling-backend --allow-auto-truncate --enable-nan-detection "
            "--completion-template --stream-output --enable-p2p-check --base-gpu-id --gpu-id-step "
            "--enable-deterministic-inference"
        )
    }
    | {
        k: "loading / tokenizer option: no effect on GPU memory"
        for k in words(
            "--trust-remote-code --tokenizer-path --tokenizer-mode --skip-tokenizer-init --load-format "
            "--download-dir --revision --model-loader-extra-config --device"
        )
    }
    | {
        k: "multi-node placement: no effect on one GPU's memory"
        for k in words("--nnodes --node-rank --dist-init-addr")
    }
)
_UNMODELLED = {
    "--disable-hybrid-swa-memory": "a hybrid-SWA model's single full-attention pool is not modelled "
    "(gpumem keeps SGLang's default split by swa_full_tokens_ratio)",
    "--cuda-graph-bs": "the exact captured batch sizes are not modelled (SGLang's default list up to the "
    "largest is)",
    "--enable-torch-compile": "torch.compile's graphs are not modelled",
    "--torch-compile-max-bs": "torch.compile's graphs are not modelled",
    "--enable-piecewise-cuda-graph": "piecewise CUDA graphs of prefill are not modelled",
    "--disable-piecewise-cuda-graph": "piecewise CUDA graphs of prefill are not modelled (their memory, "
    "outside the KV pool, is not counted either way)",
    "--cpu-offload-gb": "weights offloaded to CPU are not modelled (all weights stay on the GPU)",
    "--enable-hierarchical-cache": "the host-memory KV tier (HiCache) is not modelled",
    "--hicache-ratio": "the host-memory KV tier (HiCache) is not modelled",
    "--hicache-size": "the host-memory KV tier (HiCache) is not modelled",
    "--lora-paths": "LoRA adapter slots are not modelled",
    "--max-loras-per-batch": "LoRA adapter slots are not modelled",
    "--enable-lora": "LoRA adapter slots are not modelled",
    "--json-model-override-args": "config overrides are not applied to the model",
    "--config": "options inside the config file are not read (pass them on the command line)",
    "--enable-memory-saver": "memory release / resume is not modelled",
    "--enable-two-batch-overlap": "two-batch overlap is not modelled",
    "--enable-eplb": "expert-load balancing's redundant experts are not modelled",
    "--moe-a2a-backend": "the expert all-to-all buffers (DeepEP) are not modelled",
    "--enable-ep-moe": "expert parallel MoE: give --ep-size; the flag alone is not modelled",
    "--attention-backend": "the attention backend's workspace is taken as FlashInfer's",
    "--disable-custom-all-reduce": "the custom all-reduce buffers are not modelled separately",
    "--enable-mixed-chunk": "mixing decode into prefill chunks is not modelled",
    "--disable-overlap-schedule": "the overlap scheduler's buffers are not modelled",
    "--enable-symm-mem": "the symmetric-memory all-reduce buffers are not modelled",
}


class SglangCommand:
    name = "SGLang"

    def matches(self, argv: Sequence[str]) -> bool:
        prog, i = program(argv)
        if prog == "sglang":
            return len(argv) > i and argv[i] == "serve"
        return prog in _MODULES or (prog == "docker" and _module_at(argv) is not None)

    def parse(self, argv: Sequence[str], env: Mapping[str, str]) -> Any:
        prog, start = program(argv)
        reading = Reading(
            f"SGLang command ({'sglang serve' if prog == 'sglang' else 'sglang.launch_server'})"
        )
        if prog == "sglang":
            start += 1
        elif prog == "docker":
            at = _module_at(argv)
            assert at is not None  # matches() checked it
            reading.note(" ".join(argv[at - 1 : at + 1]), "SGLang inside the container: its arguments follow")
            start = at + 1
        reading.fields["engine"] = "sglang"
        model: str | None = None
        for arg in split_options(argv, start, flags=_FLAGS, valued=_VALUED):
            if arg.key is None:
                reading.warn(arg.text, "a positional argument SGLang would reject; ignored")
            elif arg.key in ("--model-path", "--model"):
                model = arg.value
                reading.note(arg.text, "model")
            else:
                _option(reading, arg)
        _environment(reading, env)
        _defaults(reading)
        return reading.inference(model)


def _module_at(argv: Sequence[str]) -> int | None:
    """Index of ``sglang.launch_server`` after a ``-m`` in a ``docker run`` command (None: not there)."""
    return next((i for i in range(1, len(argv)) if argv[i] in _MODULES and argv[i - 1] == "-m"), None)


def _option(r: Reading, arg: Arg) -> None:
    key, where, value = arg.key or "", arg.where, arg.value
    if key in _INT_FIELDS:
        field, lo, hi = _INT_FIELDS[key]
        r.set(field, to_int(value, where, lo=lo, hi=hi), where, arg.text)
    elif key in _BOOL_FIELDS:
        r.set(_BOOL_FIELDS[key], value is None or to_bool(value, where), where, arg.text)
    elif key == "--mem-fraction-static":
        r.set("mem_fraction_static", to_float(value, where, lo=0.01, hi=1.0), where, arg.text)
    elif key == "--swa-full-tokens-ratio":
        ratio = to_float(value, where, lo=0.0, hi=1.0)
        if ratio <= 0:
            raise r.error(where, "swa_full_tokens_ratio must be above 0 and at most 1")
        r.set("swa_full_tokens_ratio", ratio, where, arg.text)
    elif key == "--mamba-full-memory-ratio":
        ratio = to_float(value, where, lo=0.0, hi=100.0)
        if ratio <= 0:
            raise r.error(where, "mamba_full_memory_ratio must be above 0")
        r.set("mamba_full_memory_ratio", ratio, where, arg.text)
    elif key == "--mamba-ssm-dtype":
        if value not in ("float32", "bfloat16", "float16"):
            raise r.error(where, f"{value!r} is not a --mamba-ssm-dtype (float32, bfloat16, float16)")
        r.set("mamba_ssm_dtype", value, where, arg.text)
    elif key == "--context-length":
        r.set("max_model_len", to_int(value, where, lo=1, hi=1 << 24), where, arg.text)
    elif key == "--chunked-prefill-size":
        _chunked(r, arg)
    elif key == "--max-prefill-tokens":
        r.fields["_max_prefill"] = to_int(value, where, lo=1, hi=1 << 24)
        r.note(arg.text, "a prefill batch's token budget; sizes the forward only when chunking is off")
    elif key == "--kv-cache-dtype":
        kv = _KV.get(str(value).lower())
        if kv is None:
            if str(value).lower() == "fp4_e2m1":
                r.warn(arg.text, "an fp4 KV cache is not modelled; sized in the compute dtype")
                return
            raise r.error(where, f"{value!r} is not an SGLang KV-cache dtype ({', '.join(_KV)}, fp4_e2m1)")
        r.set("kv_dtype", kv, where, arg.text)
    elif key == "--dtype":
        r.torch_dtype("SGLang", arg.value, arg.where, arg.text)
    elif key == "--quantization":
        _quantization(r, arg)
    elif key == "--cuda-graph-bs":
        sizes = [to_int(v, where, lo=1, hi=4096) for v in (value or "").replace(",", " ").split()]
        r.set("cuda_graph_max_bs", max(sizes or [1]), where, arg.text)
        r.warn(arg.text, _UNMODELLED[key])
    elif key in _NO_MEMORY:
        r.note(arg.text, _NO_MEMORY[key])
    elif key in _UNMODELLED:
        r.warn(arg.text, _UNMODELLED[key])
    elif key.startswith("--speculative-"):
        r.warn(arg.text, "speculative decoding (draft model, its KV and graphs) is not modelled")
    else:
        r.warn(arg.text, "not an SGLang option gpumem knows; ignored")


def _chunked(r: Reading, arg: Arg) -> None:
    n = to_int(arg.value, arg.where, lo=-1, hi=1 << 24)
    if n == 0:
        raise r.error(arg.where, "0 is not a chunk size (a positive number of tokens, or -1: no chunking)")
    if n > 0:
        r.set("chunked_prefill_size", n, arg.where, arg.text)
        return
    r.fields["_no_chunking"] = arg.where
    r.note(arg.text, "no chunking: one prefill forward takes up to max_prefill_tokens (SGLang's reserve)")


def _quantization(r: Reading, arg: Arg) -> None:
    method = str(arg.value).lower()
    if method in _ONLINE_QUANT:
        r.set("weights", _ONLINE_QUANT[method], arg.where, arg.text)
    elif method in _CHECKPOINT_QUANT:
        r.set(
            "weights", "file", arg.where, arg.text, "weights = file (the checkpoint's own quantized tensors)"
        )
    else:
        r.warn(arg.text, "a quantization method gpumem does not know; weights left as the dtype says")


def _environment(r: Reading, env: Mapping[str, str]) -> None:
    for name, value in env.items():
        if name == "CUDA_VISIBLE_DEVICES":
            r.note(f"{name}={value}", "which GPUs: no effect on per-GPU memory")
        elif name.startswith(("SGLANG_", "SGL_")):
            r.warn(f"{name}={value}", "SGLang environment setting not modelled")


def _defaults(r: Reading) -> None:
    max_prefill = r.fields.pop("_max_prefill", 16384)  # server_args.py max_prefill_tokens default
    where = r.fields.pop("_no_chunking", None)
    if where is not None and "chunked_prefill_size" not in r.fields:
        r.set("chunked_prefill_size", max_prefill, where, "--chunked-prefill-size -1")
    max_len = r.fields.get("max_model_len")
    if max_len:
        r.fields["seq"] = max_len  # without a GPU capacity, the KV of one request of that length
        r.note(f"--context-length {max_len}", f"prompt = {max_len} (one request of that length)")
    else:
        r.note("--context-length (not given)", "SGLang's default, the model's own context length")


PARSERS = (SglangCommand(),)
