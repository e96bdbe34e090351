"""vLLM launch commands: ``vllm serve MODEL ...``, ``python -m vllm.entrypoints.openai.api_server
--model ...`` and ``docker run ... vllm/vllm-openai --model ...``, read as an :class:`InferenceRun` with
engine ``vllm``.

Option names and values as ``vllm/engine/arg_utils.py`` (``EngineArgs.add_cli_args``) and
``vllm/entrypoints/openai/cli_args.py`` declare them; vLLM's parser (``vllm/utils FlexibleArgumentParser``)
also accepts underscores for dashes, and so does this one.
"""

from __future__ import annotations

import json
import re
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
from gpumem_gui.core.imports.vllm_mm import mm_limit
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.runtimes.vllm_command import VLLM_KV_DTYPES, VLLM_ONLINE_QUANT

_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")

# --quantization methods that quantize a 16-bit checkpoint while loading: VLLM_ONLINE_QUANT (runtimes/
# vllm_command.py, shared with the command gpumem writes)
# --quantization methods that read an already quantized checkpoint: its bytes are the files' own
_CHECKPOINT_QUANT = (
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "gptq_marlin_24",
    "gptq_bitblas",
    "marlin",
    "compressed-tensors",
    "modelopt",
    "modelopt_fp4",
    "mxfp4",
    "gguf",
    "aqlm",
    "hqq",
    "experts_int8",
    "fp_quant",
    "auto-round",
    "quark",
    "torchao",
    "awq_triton",
    "moe_wna16",
    "bitblas",
    "tpu_int8",
    "inc",
    "petit_nvfp4",
)
_KV = VLLM_KV_DTYPES  # --kv-cache-dtype (vllm/config/cache.py CacheDType)

_FLAGS = frozenset(
    words(
        "--enforce-eager --no-enforce-eager --enable-prefix-caching --no-enable-prefix-caching "
        "--trust-remote-code --disable-log-requests --disable-log-stats --enable-chunked-prefill "
        "--no-enable-chunked-prefill "
        "--enable-expert-parallel --enable-lora --disable-custom-all-reduce --enable-auto-tool-choice "
        "--disable-frontend-multiprocessing --async-scheduling --enable-sleep-mode --enable-log-requests "
        "--disable-fastapi-docs --enable-prompt-tokens-details --enable-force-include-usage --headless "
        "--enable-reasoning --disable-sliding-window --enable-eplb --enable-dbo --no-enable-log-requests "
        "--skip-tokenizer-init --enable-server-load-tracking --disable-cascade-attn "
        "--enable-request-id-headers "
        "--enable-log-outputs --enable-prompt-embeds --use-v2-block-manager --enable-ssl-refresh "
        "--disable-hybrid-kv-cache-manager"
    )
)
_INT_FIELDS = {
    "--tensor-parallel-size": ("tp", 1, 4096),
    "-tp": ("tp", 1, 4096),
    "--pipeline-parallel-size": ("pp", 1, 4096),
    "-pp": ("pp", 1, 4096),
    "--max-num-seqs": ("max_num_seqs", 1, 1 << 16),
    "--max-num-batched-tokens": ("max_num_batched_tokens", 1, 1 << 24),
}
_CAPTURE_FIELDS = ("max_cudagraph_capture_size", "max_capture_size", "cudagraph_max_size")
_VALUED = frozenset(
    [
        *_INT_FIELDS,
        "--model",
        "--max-model-len",
        "--gpu-memory-utilization",
        "--dtype",
        "--quantization",
        "-q",
        "--kv-cache-dtype",
        "--data-parallel-size",
        "-dp",
    ]
)
# options that change nothing in GPU memory (server, tokenizer, logging, API surface), and why
_NO_MEMORY = {
    k: "server / API option: no effect on GPU memory"
    for k in words(
        "--host --port --api-key --served-model-name --uvicorn-log-level --disable-log-requests "
        "--chat-template "
        "--response-role --ssl-keyfile --ssl-certfile --root-path --middleware --allowed-origins "
        "--allow-credentials --allowed-methods --allowed-headers --enable-auto-tool-choice "
        "--tool-call-parser --tool-parser-plugin "
        "--reasoning-parser --enable-reasoning --disable-log-stats --disable-fastapi-docs "
        "--enable-log-requests "
        "--disable-frontend-multiprocessing --return-tokens-as-token-ids --enable-prompt-tokens-details "
        "--enable-force-include-usage --max-log-len --chat-template-content-format --lora-modules "
        "--enable-server-load-tracking --enable-request-id-headers --enable-log-outputs --log-config-file "
        "--no-enable-log-requests --api-server-count --enable-ssl-refresh"
    )
} | {
    k: "loading / tokenizer option: no effect on GPU memory"
    for k in words(
        "--trust-remote-code --download-dir --tokenizer --tokenizer-mode --revision --code-revision "
        "--tokenizer-revision --seed --load-format --generation-config --skip-tokenizer-init "
        "--distributed-executor-backend --worker-cls --model-impl --override-generation-config --hf-token "
        "--safetensors-load-strategy --ignore-patterns --model-loader-extra-config"
    )
}
_FIXED_KV = "a fixed KV size is not modelled (the pool is sized from gpu_memory_utilization)"
_GRAPHS = "CUDA-graph capture sizes are not modelled (the graph pool scales with layers)"
# vLLM options that change memory and that gpumem does not model
_UNMODELLED = {
    "--cpu-offload-gb": "weights offloaded to CPU are not modelled (all weights stay on the GPU)",
    "--swap-space": "CPU swap space is host memory; not modelled",
    "--block-size": "gpumem uses vLLM's default 16-token pages",
    "--kv-cache-memory": _FIXED_KV,
    "--kv-cache-memory-bytes": _FIXED_KV,
    "--num-gpu-blocks-override": "a fixed block count is not modelled",
    "--speculative-config": "speculative decoding (draft model, its KV) is not modelled",
    "--speculative-model": "speculative decoding (draft model, its KV) is not modelled",
    "--num-speculative-tokens": "speculative decoding is not modelled",
    "--enable-lora": "LoRA adapter slots are not modelled",
    "--max-loras": "LoRA adapter slots are not modelled",
    "--max-lora-rank": "LoRA adapter slots are not modelled",
    "--limit-mm-per-prompt": "the images per prompt are not a field of this run",
    "--mm-processor-kwargs": "the multimodal encoder cache is not modelled",
    "--rope-scaling": "rope scaling is not read from the command (use the model's config)",
    "--hf-overrides": "config overrides are not applied to the model",
    "--max-seq-len-to-capture": "CUDA graphs are sized per layer, not per captured length",
    "--cuda-graph-sizes": _GRAPHS,
    "--compilation-config": "compilation settings are not modelled (the graph pool scales with layers)",
    "-O": "compilation settings are not modelled (the graph pool scales with layers)",
    "--disable-custom-all-reduce": "the custom all-reduce buffers are not modelled separately",
    "--data-parallel-size-local": "each data-parallel replica is estimated as one",
    "--max-logprobs": "the logprobs buffers are not modelled",
    "--config": "options inside the config file are not read (pass them on the command line)",
    "--enable-sleep-mode": "sleep mode is not modelled",
    "--enable-eplb": "expert-load balancing's redundant experts are not modelled",
    "--num-redundant-experts": "redundant experts are not modelled",
    "--calculate-kv-scales": "KV-scale calibration buffers are not modelled",
    "--max-cudagraph-capture-size": _GRAPHS,
    "--disable-sliding-window": "not modelled: vLLM then runs every layer as full attention and caps "
    "max_model_len at the window (gpumem sizes sliding layers by their window unless --no-hybrid-kv-cache)",
    "--disable-hybrid-kv-cache-manager": "every layer sized for the whole context is not a field of this run",
    "--long-prefill-token-threshold": "prefill scheduling is not modelled",
    "--max-num-partial-prefills": "prefill scheduling is not modelled",
    "--async-scheduling": "scheduling is not modelled",
    "--enable-dbo": "dual-batch overlap is not modelled",
}


def _key(name: str) -> str:
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


class VllmCommand:
    name = "vLLM"

    def matches(self, argv: Sequence[str]) -> bool:
        prog, i = program(argv)
        if prog == "vllm":
            return len(argv) > i and argv[i] == "serve"
        return prog in _MODULES or (prog == "docker" and _image(argv) is not None)

    def parse(self, argv: Sequence[str], env: Mapping[str, str]) -> Any:
        prog, start = program(argv)
        reading = Reading("vLLM command (vllm serve)" if prog == "vllm" else f"vLLM command ({prog})")
        if prog == "vllm":
            start += 1
        elif prog == "docker":
            image = _image(argv)
            assert image is not None  # matches() checked it
            reading.note(f"docker ... {argv[image]}", "the vLLM image: its arguments follow")
            start = image + 1
        reading.fields["engine"] = "vllm"
        model: str | None = None
        for arg in split_options(argv, start, flags=_FLAGS, valued=_VALUED, normalize=_key):
            if arg.key is None:
                if model is None and arg.value:
                    model = arg.value
                    reading.note(arg.text, "model")
                else:
                    reading.warn(arg.text, "an extra positional argument vLLM would reject; ignored")
            elif arg.key == "--model":
                model = _value(arg)
                reading.note(arg.text, "model")
            else:
                _option(reading, arg)
        _environment(reading, env)
        _defaults(reading)
        return reading.inference(model)


def _image(argv: Sequence[str]) -> int | None:
    return next((i for i, w in enumerate(argv) if w.split(":")[0].endswith("vllm/vllm-openai")), None)


def _value(arg: Arg) -> str:
    if arg.value is None:
        raise ValueError  # pragma: no cover - split_options gives every non-flag option its value
    return arg.value


def _option(r: Reading, arg: Arg) -> None:
    key, where = arg.key or "", arg.where
    value = arg.value
    if key in _INT_FIELDS:
        field, lo, hi = _INT_FIELDS[key]
        r.set(field, to_int(value, where, lo=lo, hi=hi), where, arg.text)
    elif key == "--max-model-len":
        n = _human_int(value, where)
        if n == -1:
            r.fields.pop("max_model_len", None)
            r.note(arg.text, "max_model_len from the model's config (vLLM: -1 = the model's own)")
        else:
            r.set("max_model_len", n, where, arg.text)
    elif key == "--gpu-memory-utilization":
        r.set("gpu_memory_utilization", to_float(value, where, lo=1e-6, hi=1.0), where, arg.text)
    elif key in ("--enforce-eager", "--no-enforce-eager"):
        on = key == "--enforce-eager" and (value is None or to_bool(value, where))
        r.set("enforce_eager", on, where, arg.text)
    elif key == "--dtype":
        r.torch_dtype("vLLM", arg.value, arg.where, arg.text)
    elif key in ("--quantization", "-q"):
        _quantization(r, arg)
    elif key == "--kv-cache-dtype":
        kv = _KV.get(str(value).lower())
        if kv is None:
            raise r.error(where, f"{value!r} is not a vLLM KV-cache dtype ({', '.join(_KV)})")
        r.set("kv_dtype", kv, where, arg.text)
    else:
        _other(r, arg)


def _other(r: Reading, arg: Arg) -> None:
    key, where, value = arg.key or "", arg.where, arg.value
    if key in ("--data-parallel-size", "-dp"):
        dp = to_int(value, where, lo=1, hi=4096)
        r.fields["_dp"] = dp
        r.note(arg.text, f"{dp} data-parallel replicas, each with this per-GPU memory (estimated as one)")
    elif key == "--enable-expert-parallel":
        r.fields["_ep"] = True
        r.note(arg.text, "expert parallel over the tensor-parallel GPUs (ep = tp)")
    elif key in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
        if "prefix_caching" in InferenceRun.model_fields:
            r.set("prefix_caching", key == "--enable-prefix-caching", where, arg.text)
        else:
            r.note(arg.text, "no effect on the pool's size: cached prefixes share its KV blocks")
    elif key in ("--enable-chunked-prefill", "--no-enable-chunked-prefill"):
        r.note(arg.text, "the V1 engine chunks prefills by max_num_batched_tokens either way")
    elif key in ("--compilation-config", "-O") or key.startswith("-O"):
        _compilation(r, arg)
    elif key == "--max-cudagraph-capture-size":
        n = to_int(value, where, lo=1, hi=1 << 16)
        r.maybe(InferenceRun, _CAPTURE_FIELDS, n, where, arg.text, _UNMODELLED[key])
    elif key == "--cuda-graph-sizes":
        sizes = [to_int(v, where, lo=1, hi=1 << 16) for v in (value or "").replace(",", " ").split()]
        r.maybe(InferenceRun, _CAPTURE_FIELDS, max(sizes or [1]), where, arg.text, _UNMODELLED[key])
    elif key == "--block-size":
        n = to_int(value, where, lo=1, hi=4096)
        r.maybe(InferenceRun, ("block_size", "kv_block_size"), n, where, arg.text, _UNMODELLED[key])
    elif key == "--disable-hybrid-kv-cache-manager":
        r.maybe(InferenceRun, ("hybrid_kv_cache",), False, where, arg.text, _UNMODELLED[key])
    elif key == "--limit-mm-per-prompt":
        mm_limit(r, arg, _UNMODELLED[key])
    elif key == "--config-format":
        _config_format(r, arg)
    elif key in _NO_MEMORY:
        r.note(arg.text, _NO_MEMORY[key])
    elif key in _UNMODELLED:
        r.warn(arg.text, _UNMODELLED[key])
    else:
        r.warn(arg.text, "not a vLLM option gpumem knows; ignored")


def _config_format(r: Reading, arg: Arg) -> None:
    """``--config-format mistral``: vLLM builds its config from the checkpoint's ``params.json`` instead of
    ``config.json`` (vllm/transformers_utils/configs/mistral.py ``adapt_config_dict``); its
    ``_remap_general_mistral_args`` defaults ``max_position_embeddings`` and ``max_seq_len`` to 128,000 when
    params.json names neither, so vLLM's default max_model_len can differ from the config.json gpumem
    reads."""
    if str(arg.value).lower() == "mistral":
        r.warn(
            arg.text,
            "vLLM reads params.json (Mistral's format), gpumem the model's config.json: vLLM's default "
            "max_model_len is params.json's max_seq_len (128,000 when it names none); give --max-model-len",
        )
    else:
        r.note(arg.text, "loading option: no effect on GPU memory")


def _human_int(value: str | None, where: str) -> int:
    """vLLM's ``human_readable_int`` (vllm/engine/arg_utils.py): 32768, 32k (x1000), 32K (x1024), 1m, 1M."""
    text = (value or "").strip()
    scale = {"k": 1000, "m": 1000**2, "g": 1000**3, "K": 1024, "M": 1024**2, "G": 1024**3}
    if text and text[-1] in scale:
        n = to_float(text[:-1], where, lo=0, hi=1 << 24)
        return to_int(n * scale[text[-1]], where, lo=1, hi=1 << 24)
    return to_int(text, where, lo=-1, hi=1 << 24) if text != "0" else to_int(text, where, lo=1)


def _quantization(r: Reading, arg: Arg) -> None:
    method = str(arg.value).lower()
    if method in VLLM_ONLINE_QUANT:
        fmt = VLLM_ONLINE_QUANT[method]
        r.set("weights", fmt, arg.where, arg.text, f"weights = {fmt}")
    elif method in _CHECKPOINT_QUANT:
        shown = "weights = file (the checkpoint's own quantized tensors)"
        r.set("weights", "file", arg.where, arg.text, shown)
    else:
        r.warn(arg.text, "a quantization method gpumem does not know; weights left as the dtype says")


_PROFILE_GRAPHS = "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"  # the run's profile_cudagraphs


def _environment(r: Reading, env: Mapping[str, str]) -> None:
    for name, value in env.items():
        if name == "CUDA_VISIBLE_DEVICES":
            r.note(f"{name}={value}", "which GPUs: no effect on per-GPU memory")
        elif name == _PROFILE_GRAPHS:  # vllm/envs.py: "1" (the default since v0.21) or "0"
            on = to_bool(value, name)
            r.set("profile_cudagraphs", on, name, f"{name}={value}")
        elif name == "VLLM_USE_V1":  # vllm/envs.py: "0" runs the V0 engine (v0.8 to v0.10)
            engine = "v1" if to_bool(value, name) else "v0"
            r.set("vllm_engine", engine, name, f"{name}={value}")
        elif name.startswith("VLLM_"):
            r.warn(f"{name}={value}", "vLLM environment setting not modelled")


def _defaults(r: Reading) -> None:
    dp = r.fields.pop("_dp", 1)
    if r.fields.pop("_ep", False):
        r.fields["ep"] = r.fields.get("tp", 1)
        r.origin["ep"] = r.origin.get("tp", "the command")
        if dp > 1:
            r.warn(
                f"--enable-expert-parallel with -dp {dp}",
                f"vLLM splits the experts over tp x dp GPUs; gpumem over tp ({r.fields['ep']}) only",
            )
    max_len = r.fields.get("max_model_len")
    if max_len:
        r.fields["seq"] = max_len  # without a GPU capacity, the KV of one max-length request
        r.note(f"--max-model-len {max_len}", f"prompt = {max_len} (one request of that length)")
    else:
        why = "--max-model-len (not given): vLLM's default, the model's own context length"
        for field in ("max_model_len", "seq"):
            r.from_model.append((field, "max_position_embeddings", "", why))


def _compilation(r: Reading, arg: Arg) -> None:
    """``--compilation-config JSON`` / ``-O JSON`` / ``-O3``: the CUDA-graph capture sizes it names are read
    (``cudagraph_capture_sizes``, ``max_cudagraph_capture_size``); the rest is named in a warning."""
    text = arg.value if arg.value is not None else arg.text[2:]
    if re.fullmatch(r"[0-9]+", (text or "").strip()):
        r.note(arg.text, "compilation level: no effect on the memory gpumem models")
        return
    try:
        data = json.loads(text or "")
    except (ValueError, RecursionError):  # JSONDecodeError, or an integer over Python's digit limit
        raise r.error(arg.where, "expected a JSON object or an optimization level (0 to 3)") from None
    if not isinstance(data, dict):
        raise r.error(arg.where, "expected a JSON object")
    sizes = data.get("cudagraph_capture_sizes")
    top = data.get("max_cudagraph_capture_size")
    if isinstance(sizes, list) and sizes:
        top = max(to_int(v, f"{arg.where} cudagraph_capture_sizes", lo=1, hi=1 << 16) for v in sizes)
    if top is not None:
        n = to_int(top, f"{arg.where} max_cudagraph_capture_size", lo=1, hi=1 << 16)
        r.maybe(InferenceRun, _CAPTURE_FIELDS, n, arg.where, arg.text, _UNMODELLED["--compilation-config"])
    rest = sorted(set(data) - {"cudagraph_capture_sizes", "max_cudagraph_capture_size"})
    if rest:
        r.warn(f"{arg.name} {{{', '.join(rest)}}}", "compilation settings not modelled")


PARSERS = (VllmCommand(),)
