"""Ollama: ``ollama run MODEL`` / ``ollama serve`` with their environment, ``/set parameter`` lines typed in
a session, and Modelfiles (``FROM ...``, ``PARAMETER num_ctx ...``), read as an :class:`InferenceRun` with
engine ``ollama``.

The server's settings are environment variables (``envconfig/config.go``: ``OLLAMA_CONTEXT_LENGTH``,
``OLLAMA_NUM_PARALLEL``, ``OLLAMA_FLASH_ATTENTION``, ``OLLAMA_KV_CACHE_TYPE``, ``OLLAMA_GPU_OVERHEAD``); a
model's are parameters (``api/types.go`` ``Options``: ``num_ctx``, ``num_batch``, ``num_gpu``), set by a
Modelfile's ``PARAMETER`` or a session's ``/set parameter``. The model name maps to a Hugging Face model and
a GGUF type through :mod:`gpumem_gui.core.runtimes.ollama_models`. A pasted session joins its lines, so
``VAR=1 ollama serve`` / ``ollama run m`` / ``/set parameter num_ctx 8192`` read as one command; a Modelfile
pasted as a command reads the same way (:func:`import_modelfile` reads one from its text, line by line).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from math import ceil

from gpumem_gui.core.errors import GpumemInputError, clip
from gpumem_gui.core.imports.base import ImportedRun, Reading, program, to_bool, to_int
from gpumem_gui.core.runtimes.ollama_models import gguf_weights_id, resolve_ollama_model
from gpumem_gui.core.units import MiB

_INSTRUCTIONS = ("FROM", "PARAMETER", "TEMPLATE", "SYSTEM", "ADAPTER", "LICENSE", "MESSAGE", "REQUIRES")
_ARITY = dict.fromkeys(_INSTRUCTIONS, 1) | {"PARAMETER": 2, "MESSAGE": 2}
_KV = {"f16": "fp16", "fp16": "fp16", "q8_0": "q8_0", "q4_0": "q4_0"}  # ggml.go SupportsKVCacheType
_INT_PARAMS = {"num_ctx": (1, 1 << 24), "num_batch": (1, 1 << 20), "num_gpu": (-1, 4096)}
_NO_MEMORY_PARAMS = frozenset(
    [
        "num_thread",
        "num_keep",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "typical_p",
        "repeat_penalty",
        "repeat_last_n",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "stop",
        "num_predict",
        "mirostat",
        "mirostat_eta",
        "mirostat_tau",
        "penalize_newline",
        "tfs_z",
        "use_mmap",
        "use_mlock",
        "numa",
        "main_gpu",
        "low_vram",
        "f16_kv",
        "vocab_only",
    ]
)
_ENV_UNMODELLED = {
    "OLLAMA_MAX_LOADED_MODELS": "other models loaded at the same time are not counted",
    "OLLAMA_NEW_ENGINE": "Ollama's own engine is sized as its llama.cpp runner",
    "OLLAMA_MULTIUSER_CACHE": "the multi-user prompt cache is not modelled",
    "OLLAMA_LLM_LIBRARY": "the backend library choice is not modelled",
}
_VISIBLE = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
_ENV_PREFIXES = ("OLLAMA_", "CUDA_", "HIP_", "ROCR_", "GGML_", "LLAMA_ARG_FIT_TARGET")
_RUN_FLAGS = frozenset("--verbose --nowordwrap --insecure --hidethinking --think --help -h".split())  # noqa: SIM905
_RUN_VALUED = frozenset("--format --keepalive --dimensions".split())  # noqa: SIM905


class _Ollama:
    """The words of an Ollama session or Modelfile, walked once into a :class:`Reading`."""

    def __init__(self, source: str) -> None:
        self.r = Reading(source)
        self.model: str | None = None
        self.r.set("engine", "ollama", "argument 0", "ollama", "engine = ollama")

    def env(self, env: Mapping[str, str]) -> None:
        for name, value in env.items():
            if not name.startswith(_ENV_PREFIXES):
                continue  # not Ollama's (the caller's shell environment)
            where, written = f"environment {name}", f"{name}={value}"
            if name == "OLLAMA_CONTEXT_LENGTH":
                n = to_int(value, where, lo=0, hi=1 << 24)
                if n:  # 0: the VRAM-based default of Ollama >= 0.15.5
                    self.r.set("num_ctx", n, where, written)
                else:
                    self.r.note(written, "num_ctx = auto (Ollama's default)")
            elif name == "OLLAMA_NUM_PARALLEL":
                n = to_int(value, where, lo=0, hi=1024)
                if n:
                    self.r.set("num_parallel", n, where, written)
                else:  # 0: "auto" in Ollama before 0.10.0
                    self.r.note(written, "num_parallel = auto (the run's batch)")
            elif name == "OLLAMA_FLASH_ATTENTION":
                on = to_bool(value, where) if value.strip() else None
                self.r.set("flash_attention", "auto" if on is None else "on" if on else "off", where, written)
            elif name == "OLLAMA_KV_CACHE_TYPE":
                kv = _KV.get(value.strip().lower())
                if kv is None and value.strip():
                    self.r.warn(written, "Ollama takes f16, q8_0 or q4_0 and falls back to f16")
                self.r.set("kv_dtype", kv or "fp16", where, written)
            elif name == "OLLAMA_GPU_OVERHEAD":
                n = to_int(value, where, lo=0, hi=(1 << 20) * MiB)
                self.r.set(
                    "gpu_overhead_mib", ceil(n / MiB), where, written, f"gpu_overhead_mib = {ceil(n / MiB)}"
                )
            elif name == "OLLAMA_SCHED_SPREAD":
                on = to_bool(value, where) if value.strip() else False
                self.r.set("sched_spread", on, where, written)
            elif name == "LLAMA_ARG_FIT_TARGET":  # llm/llama_server.go: passed on to llama-server (v0.30+)
                mib = to_int(value.split(",")[0], where, lo=0, hi=1 << 20)
                self.r.set("fit_target_mib", mib, where, written)
                self.r.set("ollama_version", "0.30+", where, written, "ollama_version = 0.30+ (llama-server)")
            elif name in _VISIBLE:
                self.visible(value, where, written)
            elif name in _ENV_UNMODELLED:
                self.r.warn(written, _ENV_UNMODELLED[name])
            else:
                self.r.warn(written, "does not change the model's GPU memory; ignored")

    def visible(self, value: str, where: str, written: str) -> None:
        """The GPUs Ollama may use: their count is the run's pp (Ollama splits the layers over them)."""
        ids = [d.strip() for d in value.split(",") if d.strip()]
        if not ids or "-1" in ids:
            self.r.warn(written, "no GPU visible: Ollama runs on the CPU, which gpumem does not size")
        elif len(ids) > 4096:
            raise GpumemInputError(f"{where}: at most 4096 GPUs, got {len(ids)}", field="pp")
        else:
            self.r.set(
                "pp", len(ids), where, written, f"pp = {len(ids)} (the GPUs Ollama may split layers over)"
            )

    def parameter(self, key: str, value: str, where: str) -> None:
        written = f"{key} {value}"
        k = key.lower()
        if k in _INT_PARAMS:
            lo, hi = _INT_PARAMS[k]
            n = to_int(value, where, lo=lo, hi=hi)
            self.r.set(k, None if (k == "num_gpu" and n < 0) else n, where, written)
        elif k in _NO_MEMORY_PARAMS:
            self.r.warn(written, "does not change GPU memory; ignored")
        else:
            self.r.warn(written, "not an Ollama parameter gpumem models; ignored")

    def set_model(self, name: str, where: str) -> None:
        if self.model is not None:
            self.r.warn(name, f"a second model ({self.model} is read); ignored")
            return
        if name.lower().endswith(".gguf") or name.startswith(("/", "./", "../", "~")):
            self.model = name
            self.r.set("weights", "file", where, name, "model file: weights = file (its GGUF headers)")
            return
        if name.lower().startswith(("hf.co/", "huggingface.co/")):
            repo, _, quant = name.split("/", 1)[1].partition(":")
            try:
                weights = gguf_weights_id(quant) if quant else "gguf-Q4_K_M"  # Ollama pulls Q4_K_M
            except GpumemInputError as e:
                raise GpumemInputError(f"{where}: {e.message}") from None
            self.model = repo
            self.r.set("weights", weights, where, name)
            self.r.warn(name, "a GGUF repository: gpumem needs the base model's config.json (name it)")
            return
        try:
            m = resolve_ollama_model(name)
        except GpumemInputError as e:
            raise GpumemInputError(f"{where}: {e.message}") from None
        self.model = m.hf
        how = "named in the tag" if m.quant_given else f"Ollama's default for {m.family}:{m.size}"
        shown = f"model {m.hf}, weights = {m.weights} ({how}; {m.source})"
        self.r.set("weights", m.weights, where, name, shown)

    def done(self) -> ImportedRun:
        if self.model is None:
            raise GpumemInputError("no model named: write 'ollama run MODEL' or a Modelfile's 'FROM MODEL'")
        return self.r.inference(self.model)


def _session(argv: Sequence[str], env: Mapping[str, str]) -> ImportedRun:
    o = _Ollama("Ollama command")
    o.env(env)
    i = 0
    while i < len(argv):
        word, where = argv[i], f"argument {i} {clip(argv[i])!r}"
        if program(argv[i:])[0] == "ollama" or word in ("serve", "start"):
            i += 1
        elif word == "run" and o.model is None:
            if i + 1 >= len(argv):
                raise GpumemInputError(f"{where}: needs a model (ollama run MODEL)")
            o.set_model(argv[i + 1], f"argument {i + 1} {clip(argv[i + 1])!r}")
            i += 2
        elif word == "/set" and i + 1 < len(argv) and argv[i + 1] == "parameter":
            if i + 3 >= len(argv):
                raise GpumemInputError(f"{where}: '/set parameter' needs a name and a value")
            o.parameter(argv[i + 2], argv[i + 3], f"argument {i + 3} {clip(argv[i + 2])!r}")
            i += 4
        elif word in _RUN_VALUED and i + 1 < len(argv):
            o.r.warn(f"{word} {argv[i + 1]}", "does not change GPU memory; ignored")
            i += 2
        elif word in _RUN_FLAGS or word.startswith("--think="):
            o.r.warn(word, "does not change GPU memory; ignored")
            i += 1
        elif word.startswith("-"):
            o.r.warn(word, "not an option gpumem models; ignored")
            i += 1
        else:
            rest = " ".join(argv[i:])
            o.r.warn(rest, "a prompt or word gpumem does not read; set seq / new_tokens to size a prompt")
            break
    return o.done()


def _modelfile(
    items: Sequence[tuple[str, list[str], str]], source: str, env: Mapping[str, str]
) -> ImportedRun:
    """``items``: (instruction, its words, where) of each Modelfile line."""
    o = _Ollama(source)
    o.env(env)
    for inst, args, where in items:
        if len(args) < _ARITY[inst]:
            raise GpumemInputError(f"{where}: {inst} needs {_ARITY[inst]} value(s)")
        if inst == "FROM":
            o.set_model(args[0], where)
        elif inst == "PARAMETER":
            o.parameter(args[0], args[1], where)
        elif inst == "ADAPTER":
            o.r.warn(f"ADAPTER {args[0]}", "a LoRA adapter's weights are not counted")
        else:
            o.r.note(f"{inst} ...", "no effect on memory")
    return o.done()


def import_modelfile(text: str, path: str = "Modelfile") -> ImportedRun:
    """A Modelfile's text, one instruction per line (triple-quoted values may span lines)."""
    items: list[tuple[str, list[str], str]] = []
    lines = text.splitlines()
    n = 0
    while n < len(lines):
        line, first = lines[n].strip(), n
        n += 1
        if not line or line.startswith("#"):
            continue
        while line.count('"""') % 2 and n < len(lines):  # a multi-line """value"""
            line += "\n" + lines[n]
            n += 1
        inst, _, rest = line.partition(" ")
        where = f"line {first + 1} {clip(inst)!r}"
        if inst.upper() not in _INSTRUCTIONS:
            raise GpumemInputError(
                f"{where}: not a Modelfile instruction ({', '.join(_INSTRUCTIONS)})", source=path
            )
        if inst.upper() in ("FROM", "PARAMETER", "ADAPTER"):
            try:
                args = shlex.split(rest)
            except ValueError as e:
                raise GpumemInputError(f"{where}: {e}", source=path) from None
        else:
            args = [rest]
        items.append((inst.upper(), args, where))
    try:
        return _modelfile(items, f"Ollama Modelfile {path}", {})
    except GpumemInputError as e:
        e.source = e.source or path
        raise


class OllamaCommand:
    """``ollama run`` / ``ollama serve`` (with ``/set parameter`` lines) or a Modelfile pasted as words."""

    name = "Ollama"

    def matches(self, argv: Sequence[str]) -> bool:
        return bool(argv) and (program(argv)[0] == "ollama" or argv[0].upper() == "FROM")

    def parse(self, argv: Sequence[str], env: Mapping[str, str]) -> ImportedRun:
        if program(argv)[0] == "ollama":
            return _session(argv, env)
        items: list[tuple[str, list[str], str]] = []
        for i, word in enumerate(argv):
            if word.upper() in _INSTRUCTIONS and (not items or len(items[-1][1]) >= _ARITY[items[-1][0]]):
                items.append((word.upper(), [], f"argument {i} {clip(word)!r}"))
            elif items:
                items[-1][1].append(word)
        return _modelfile(items, "Ollama Modelfile", env)


class OllamaModelfile:
    """An Ollama Modelfile given as a file (``--from-file Modelfile``, a dropped file): its first instruction
    is FROM (ollama docs/modelfile.md: "The FROM instruction is required")."""

    name = "Ollama Modelfile"

    def matches_text(self, text: str, path: str) -> bool:
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                return line.split(None, 1)[0].upper() == "FROM"
        return False

    def parse_text(self, text: str, path: str) -> ImportedRun:
        return import_modelfile(text, path)


PARSERS = (OllamaCommand(),)
TEXT_PARSERS = (OllamaModelfile(),)
