"""llama.cpp launch commands: ``llama-server``, ``llama-cli`` (and ``llama-completion``, ``main``) and
``llama-bench``, read as an :class:`InferenceRun` with engine ``llama.cpp``.

Option names, short forms and defaults as ``common/arg.cpp`` (``common_params_parser_init``) and
``common/common.h`` (``common_params``: ``n_ctx = 0``, the model's training context; ``n_batch = 2048``;
``n_ubatch = 512``) declare them; ``llama-bench`` as ``tools/llama-bench/llama-bench.cpp`` (comma-separated
lists; ``-p 512 -n 128``; ``-ngl 99``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpumem_gui.core.formats import kv_bytes_per_element
from gpumem_gui.core.imports.base import Arg, Reading, program, split_options, to_bool, to_int, words
from gpumem_gui.core.runtimes.llamacpp import hf_gguf_weights
from gpumem_gui.core.runtimes.run import InferenceRun

_SERVERS = ("llama-server", "server", "llama-cli", "llama-completion", "main", "llama-run", "llama-mtmd-cli")
_BENCH = ("llama-bench",)
_WRAPPED = {
    "serve": "llama-server",
    "server": "llama-server",
    "cli": "llama-cli",
    "bench": "llama-bench",
    "run": "llama-run",
    "completion": "llama-completion",
}

# ggml type names llama.cpp's -ctk/-ctv accept (common/arg.cpp kv_cache_types) -> gpumem's KV dtype ids
_KV = {
    "f32": "fp32",
    "f16": "fp16",
    "bf16": "bf16",
    "q8_0": "q8_0",
    "q4_0": "q4_0",
    "q4_1": "q4_1",
    "iq4_nl": "iq4_nl",
    "q5_0": "q5_0",
    "q5_1": "q5_1",
}
_FLAGS = frozenset(
    words(
        "--no-mmap --mlock -cb --cont-batching -nocb --no-cont-batching --jinja --no-jinja -nkvo "
        "--no-kv-offload "
        "--embedding --embeddings --metrics --slots --no-slots --verbose -v --log-disable --no-webui -cnv "
        "--conversation -no-cnv --no-conversation -i --interactive -if --interactive-first -e --escape "
        "--no-warmup --swa-full --kv-unified -kvu --no-kv-unified --cpu-moe -cmoe --check-tensors --mmap "
        "--no-context-shift --context-shift --flash-attn-auto --no-display-prompt -st --single-turn "
        "--reranking --rerank --no-perf --offline --direct-io -dio"
    )
)
_INT_OPTS = {  # option -> (run field, lo, hi)
    "-ngl": ("n_gpu_layers", -1, 4096),
    "--gpu-layers": ("n_gpu_layers", -1, 4096),
    "--n-gpu-layers": ("n_gpu_layers", -1, 4096),
    "-b": ("n_batch", 1, 1 << 20),
    "--batch-size": ("n_batch", 1, 1 << 20),
    "-ub": ("n_ubatch", 1, 1 << 20),
    "--ubatch-size": ("n_ubatch", 1, 1 << 20),
}
_NO_MEMORY = {
    k: "no effect on GPU memory"
    for k in words(
        "--host --port -t --threads -tb --threads-batch -a --alias --api-key --api-key-file --jinja "
        "--no-jinja "
        "--chat-template --chat-template-file --temp --top-k --top-p --min-p --repeat-penalty --seed -s -p "
        "--prompt -f --file -sys --system-prompt --no-mmap --mlock --mmap -cb --cont-batching -nocb "
        "--no-cont-batching --metrics --slots --no-slots --verbose -v --log-disable --log-file --no-webui "
        "-cnv "
        "--conversation -no-cnv --no-conversation -i --interactive -if --interactive-first -e --escape "
        "--timeout -to --reasoning-format --reasoning-budget --cache-reuse -r --reverse-prompt --in-prefix "
        "--in-suffix --grammar --grammar-file -j --json-schema --no-warmup --path --threads-http --numa "
        "-mg --main-gpu -dev --device --rope-scaling --rope-scale --rope-freq-base --rope-freq-scale "
        "--yarn-orig-ctx --check-tensors --presence-penalty --frequency-penalty --keep --no-context-shift "
        "--context-shift -hft --hf-token --no-display-prompt -st --single-turn --color -co --log-colors "
        "--log-verbosity -lv --log-prefix --log-timestamps --mirostat --mirostat-lr --mirostat-ent "
        "--dry-multiplier --samplers --sampling-seq --prio --poll --cpu-mask --cpu-range --offline "
        "--direct-io -dio -o --output -r --repetitions --progress --delay"
    )
}
_UNMODELLED = {
    "-ts": "a tensor split over several GPUs is not modelled (one GPU holds the offloaded layers)",
    "--tensor-split": "a tensor split over several GPUs is not modelled",
    "-sm": "multi-GPU split modes are not modelled",
    "--split-mode": "multi-GPU split modes are not modelled",
    "-ot": "tensor overrides (tensors kept in host memory) are not modelled",
    "--override-tensor": "tensor overrides (tensors kept in host memory) are not modelled",
    "--cpu-moe": "expert tensors kept in host memory are not modelled",
    "-cmoe": "expert tensors kept in host memory are not modelled",
    "--n-cpu-moe": "expert tensors kept in host memory are not modelled",
    "-ncmoe": "expert tensors kept in host memory are not modelled",
    "-md": "the draft model of speculative decoding is not modelled",
    "--model-draft": "the draft model of speculative decoding is not modelled",
    "-ngld": "the draft model of speculative decoding is not modelled",
    "--gpu-layers-draft": "the draft model of speculative decoding is not modelled",
    "--draft-max": "speculative decoding is not modelled",
    "--draft": "speculative decoding is not modelled",
    "--mmproj": "the multimodal projector is not modelled",
    "-mm": "the multimodal projector is not modelled",
    "--lora": "LoRA adapters are not modelled",
    "--lora-scaled": "LoRA adapters are not modelled",
    "--embedding": "embedding mode (pooled outputs) is not modelled",
    "--embeddings": "embedding mode (pooled outputs) is not modelled",
    "--reranking": "reranking mode is not modelled",
    "-d": "llama-bench's depth (tokens already in the cache) is added to the context",
    "-pg": "llama-bench's prompt+generation test is read as its prompt and generated tokens",
}


def _key(name: str) -> str:
    return name


class LlamaCppCommand:
    name = "llama.cpp"

    def matches(self, argv: Sequence[str]) -> bool:
        prog, start = program(argv)
        return prog in _SERVERS + _BENCH or (
            prog == "llama" and len(argv) > start and argv[start] in _WRAPPED
        )

    def parse(self, argv: Sequence[str], env: Mapping[str, str]) -> Any:
        prog, start = program(argv)
        if (
            prog == "llama"
        ):  # the `llama` launcher: `llama serve ...` runs llama-server, `llama cli` llama-cli
            prog, start = _WRAPPED[argv[start]], start + 1
        bench = prog in _BENCH
        reading = Reading(f"llama.cpp command ({prog})")
        reading.fields["engine"] = "llama.cpp"
        state: dict[str, Any] = {"bench": bench}
        model: str | None = None
        for arg in split_options(argv, start, flags=_FLAGS, valued=_VALUED, normalize=_key):
            if arg.key is None:
                reading.warn(arg.text, "a positional argument llama.cpp does not take; ignored")
            elif arg.key in ("-m", "--model", "-hf", "-hfr", "--hf-repo", "-dr", "--docker-repo"):
                if model is not None:
                    reading.warn(arg.text, f"a second model: {model}, the first, is estimated")
                    continue
                model = _model(reading, arg, bench)
            else:
                _option(reading, arg, state)
        _context(reading, state)
        for name, value in env.items():
            if name.startswith(("LLAMA_ARG_", "GGML_")) or name == "CUDA_VISIBLE_DEVICES":
                reading.warn(f"{name}={value}", "environment setting not read (give it as an option)")
        return reading.inference(model)


_VALUED = frozenset(
    [
        *_INT_OPTS,
        "-m",
        "--model",
        "-hf",
        "-hfr",
        "--hf-repo",
        "-c",
        "--ctx-size",
        "-np",
        "--parallel",
        "-ctk",
        "--cache-type-k",
        "-ctv",
        "--cache-type-v",
        "-ts",
        "--tensor-split",
        "-p",
        "-n",
        "--n-predict",
        "-pg",
        "-d",
        "--n-depth",
        "-sm",
        "--split-mode",
        "-ot",
        "--override-tensor",
        "-t",
        "--threads",
        "--host",
        "--port",
        "-a",
        "--alias",
    ]
)


def _model(r: Reading, arg: Arg, bench: bool) -> str:
    value = _first(r, arg, bench)
    repo, colon, tag = value.partition(":")
    if arg.key in ("-hf", "-hfr", "--hf-repo") and colon and "/" in repo:
        # common/arg.cpp -hf <user>/<model>[:quant]: the GGUF type of the file llama.cpp downloads
        weights = hf_gguf_weights(tag)
        if weights is None:
            raise r.error(arg.where, f"{tag!r} is not a GGUF type gpumem knows (Q4_K_M, Q8_0, ...)")
        r.set(
            "weights",
            weights,
            arg.where,
            arg.text,
            f"model {repo} (a Hub repo of GGUF files), weights = {weights}",
        )
        return repo
    r.note(arg.text, "model" if arg.key in ("-m", "--model") else "model (a Hub repo of GGUF files)")
    return value


def _first(r: Reading, arg: Arg, bench: bool) -> str:
    """llama-bench takes comma-separated lists and runs every combination: gpumem estimates the largest."""
    value = arg.value or ""
    if bench and "," in value:
        r.warn(arg.text, "llama-bench runs each value; the largest is estimated")
    return value


def _list_int(r: Reading, arg: Arg, bench: bool, lo: int, hi: int) -> int:
    if bench and "," in (arg.value or ""):
        r.warn(arg.text, "llama-bench runs each value; the largest is estimated")
        return max(to_int(v, arg.where, lo=lo, hi=hi) for v in (arg.value or "").split(","))
    return to_int(arg.value, arg.where, lo=lo, hi=hi)


def _option(r: Reading, arg: Arg, state: dict[str, Any]) -> None:
    key, where, bench = arg.key or "", arg.where, state["bench"]
    if key in _INT_OPTS and str(arg.value).lower() in ("all", "auto"):
        auto = str(arg.value).lower() == "auto"
        r.set("n_gpu_layers", -1, where, arg.text, f"n_gpu_layers = -1 ({'auto' if auto else 'every layer'})")
        if auto and "fit" not in r.fields:  # -ngl auto: llama.cpp's --fit places the layers (on by default)
            r.set("fit", "on", where, arg.text)
    elif key in _INT_OPTS:
        field, lo, hi = _INT_OPTS[key]
        n = _list_int(r, arg, bench, lo - 1000 if field == "n_gpu_layers" else lo, hi)
        if field == "n_gpu_layers" and n < 0:
            n = -1  # llama.cpp: -1 auto, <= -2 all; gpumem: -1 = every layer on the GPU
        r.set(field, n, where, arg.text)
    elif key in ("-c", "--ctx-size"):
        state["ctx"] = (_list_int(r, arg, bench, 0, 1 << 24), arg)
    elif key in ("-np", "--parallel"):
        state["np"] = (_list_int(r, arg, bench, -1, 4096), arg)
    elif key in ("-p", "--n-prompt") and bench:
        state["prompt"] = (_list_int(r, arg, bench, 0, 1 << 24), arg)
    elif key in ("-n", "--n-gen", "--n-predict"):
        state["gen"] = (_list_int(r, arg, bench, -2, 1 << 24), arg)
    elif key in ("-d", "--n-depth") and bench:
        state["depth"] = (_list_int(r, arg, bench, 0, 1 << 24), arg)
    elif key in ("-fa", "--flash-attn"):
        _flash(r, arg, bench)
    elif key in ("-ctk", "--cache-type-k", "-ctv", "--cache-type-v"):
        _cache_type(r, arg, state)
    elif key in ("-fit", "--fit"):  # common/arg.cpp: -fit, --fit [on|off]
        r.set("fit", "off" if (arg.value or "on").lower() in ("off", "0", "false") else "on", where, arg.text)
    elif key in ("-fitt", "--fit-target"):  # MiB per device, comma-separated: one GPU takes the first
        if "," in (arg.value or ""):
            r.warn(arg.text, "one GPU is modelled: the first device's target is used")
        r.set(
            "fit_target_mib",
            to_int((arg.value or "").split(",")[0], where, lo=0, hi=1 << 20),
            where,
            arg.text,
        )
    elif key == "--swa-full":
        r.set("swa_full", True, where, arg.text)
    elif key in ("-nkvo", "--no-kv-offload"):
        r.maybe(InferenceRun, ("kv_offload",), False, where, arg.text, "KV in host memory is not modelled")
    elif key in _NO_MEMORY:
        r.note(arg.text, _NO_MEMORY[key])
    elif key in _UNMODELLED:
        r.warn(arg.text, _UNMODELLED[key])
    else:
        r.warn(arg.text, "not a llama.cpp option gpumem knows; ignored")


def _flash(r: Reading, arg: Arg, bench: bool) -> None:
    """``-fa`` is a flag in older builds and takes on|off|auto since 2025 (common/arg.cpp); llama-bench takes
    0/1 lists. ``auto`` enables it where the backend supports it (CUDA does)."""
    value = (arg.value or "on").lower()
    if bench and "," in value:
        r.warn(arg.text, "llama-bench runs each value; flash attention off (the larger) is estimated")
        value = "0" if "0" in value.split(",") else value.split(",")[0]
    on = True if value == "auto" else to_bool(value, arg.where)
    r.set("flash_attn", on, arg.where, arg.text)


def _cache_type(r: Reading, arg: Arg, state: dict[str, Any]) -> None:
    value = (arg.value or "").lower()
    if state["bench"] and "," in value:
        r.warn(arg.text, "llama-bench runs each value; the first is estimated")
        value = value.split(",")[0]
    kv = _KV.get(value)
    if kv is None:
        raise r.error(arg.where, f"{arg.value!r} is not a llama.cpp cache type ({', '.join(_KV)})")
    which = "k" if arg.key in ("-ctk", "--cache-type-k") else "v"
    state[f"ct{which}"] = kv
    field = f"cache_type_{which}"
    if field in InferenceRun.model_fields:
        r.set(field, value, arg.where, arg.text)
    else:
        r.note(arg.text, f"{which.upper()} cache {kv}")
        r.origin["kv_dtype"] = arg.where
    if "cache_type_k" not in InferenceRun.model_fields:
        k, v = state.get("ctk", "fp16"), state.get("ctv", "fp16")
        r.fields["kv_dtype"] = k if k == v else max((k, v), key=_kv_rank)
        if k != v:
            larger = r.fields["kv_dtype"]
            r.warn(
                arg.text, f"separate K ({k}) and V ({v}) cache types: the larger, {larger}, is used for both"
            )


def _kv_rank(kv: str) -> float:
    return kv_bytes_per_element(kv)


def _context(r: Reading, state: dict[str, Any]) -> None:
    """The context: ``-c`` split over ``-np`` slots (llama-server divides n_ctx between its slots:
    tools/server, n_ctx_slot = n_ctx / n_parallel), or for llama-bench the prompt + generated + depth."""
    if state["bench"]:
        p = state.get("prompt", (512, None))[0]
        n = state.get("gen", (128, None))[0]
        d = state.get("depth", (0, None))[0]
        seq, new = (p + d, max(0, n)) if p + d > 0 else (max(1, n), 0)
        r.fields["seq"], r.fields["new_tokens"] = seq, new
        r.note("llama-bench -p/-n/-d", f"prompt = {seq}, new tokens = {new} (n_ctx = p + n + d)")
        return
    if "gen" in state:
        n, arg = state["gen"]
        r.note(arg.text, "tokens to generate: within the context (-c), no effect on memory")
    slots = 1
    if "np" in state:
        n, arg = state["np"]
        slots = max(1, n)
        r.set("batch", slots, arg.where, arg.text, f"batch = {slots} (parallel slots)")
    if "ctx" in state and state["ctx"][0] > 0:
        n, arg = state["ctx"]
        per = max(1, n // slots)
        r.set("seq", per, arg.where, arg.text, f"seq = {per} (n_ctx {n} / {slots} slots)")
        r.fields["new_tokens"] = 0
    else:
        why = "-c (not given, or 0): llama.cpp's default, the model's training context"
        r.from_model.append(("seq", "max_position_embeddings", "batch", why))


PARSERS = (LlamaCppCommand(),)
