"""The Ollama runtime: llama.cpp's buffers under Ollama's defaults, knobs and layer placement, per version
(``ollama_version``): :class:`OllamaServer` is v0.30+'s upstream llama-server (the default;
:mod:`.ollama_server`: Ollama v0.33's arguments and defaults, placed by llama.cpp's ``--fit``,
:mod:`.llamacpp_fit` / :mod:`.llamacpp_split_fit`), :class:`Ollama` v0.12.10's llama runner (older Ollama's
logs); ``Ollama.for_run`` picks one for a run.

Ollama v0.12.10 runs llama.cpp with ``n_ctx = num_ctx x OLLAMA_NUM_PARALLEL`` (``llm/server.go`` ``KvSize``),
``n_batch = min(num_batch, num_ctx)``, flash attention when ``OLLAMA_FLASH_ATTENTION`` (or the model's
default) asks and the model allows it, the KV type of ``OLLAMA_KV_CACHE_TYPE`` only with flash attention, and
``-ngl`` = the layers its own prediction (:mod:`.ollama_predict`) fits into the GPU's free memory. The bytes
are then llama.cpp's (:mod:`.llamacpp`: model, KV and compute buffers); the facts carry Ollama's own figures
(``offloaded N/M``, ``memory.required.full``, ``memory.graph.*``) so a published server log compares to both.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from types import MappingProxyType

from gpumem_gui.core.formats import WeightBytes
from gpumem_gui.core.gpu_memory import GpuMemory
from gpumem_gui.core.monotone import largest
from gpumem_gui.core.results.estimate import Estimate, GpuShare
from gpumem_gui.core.results.nontorch import context_bytes
from gpumem_gui.core.runtimes import refusals
from gpumem_gui.core.runtimes.base import Lever, Runtime
from gpumem_gui.core.runtimes.llamacpp import LLAMA_CPP, LlamaCpp, kv_label, kv_types
from gpumem_gui.core.runtimes.llamacpp_options import LLAMA_FIT_TARGET_MIB
from gpumem_gui.core.runtimes.llamacpp_split_fit import SplitFit, fit_split, split_fit_facts
from gpumem_gui.core.runtimes.ollama_models import ollama_tag
from gpumem_gui.core.runtimes.ollama_options import (
    OLLAMA_DEFAULT_NUM_CTX,
    OLLAMA_LLAMA_CPP,
    OLLAMA_SERVER_ERA,
)
from gpumem_gui.core.runtimes.ollama_predict import (
    Placement,
    Prediction,
    predict,
    recurrent_note,
)
from gpumem_gui.core.runtimes.ollama_server import (
    check_parallelism,
    server_gpus,
    server_kv_type,
    server_settings,
)
from gpumem_gui.core.runtimes.ollama_settings import (
    KV_OLLAMA,
    OllamaSettings,
    flash_supported,
    ollama_settings,
)
from gpumem_gui.core.runtimes.ollama_split import choose_gpus, placement_notes, split_estimate
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.state import has_state
from gpumem_gui.core.units import MiB


def _context(run: InferenceRun) -> int:
    """The process's CUDA context on each GPU, which llama.cpp's free memory leaves out."""
    return context_bytes(run.gpu_arch, run.cuda_context_mib)


# llama.cpp's default n_ubatch (common/common.h), which Ollama's runner leaves as is (llama/llama.go
# NewContextParams sets n_batch only)
LLAMA_DEFAULT_UBATCH = 512
_KV_LLAMA = {"f16": "fp16", "q8_0": "q8_0", "q4_0": "q4_0"}
_SERVER_SRC = "ollama v0.33 llm/llama_server.go startLlamaServer, server/sched.go, server/routes.go"
_SRC = (
    "ollama v0.12.10 llm/server.go NewLlamaServer, llm/memory.go estimateGPULayers, fs/ggml/ggml.go GraphSize"
)


def ollama_plan(
    spec: ModelSpec, run: InferenceRun, wb: WeightBytes, free: int | None
) -> tuple[OllamaSettings, Prediction, Placement]:
    """Ollama's settings, prediction and layer placement on the ``pp`` GPUs (CUDA_VISIBLE_DEVICES) with
    ``free`` bytes each (None: unlimited): on the fewest that hold every layer, or all with sched_spread."""
    s = ollama_settings(spec, run)
    pred = predict(spec, wb, s.num_ctx * s.parallel, s.batch, s.parallel, s.kv_type, s.flash)
    plc = choose_gpus(pred, free, run.pp, run.gpu_overhead_mib * MiB, run.num_gpu, run.sched_spread)
    return s, pred, plc


class _OllamaBuffers(LlamaCpp):
    """The buffers Ollama v0.12.10 allocates: llama.cpp's, except that a chunked-local layer keeps every
    token: Ollama runs Llama 4 on its own engine (fs/ggml/ggml.go ``OllamaEngineRequired``), whose
    ``kvcache.NewChunkedAttentionCache`` (model/models/llama4/model.go) is the size of the causal cache
    (kvcache/causal.go ``Init``: the chunk only masks)."""

    chunked_local = False
    # Ollama's own layout: num_gpu k holds the last k blocks, the output layer only with every block
    # (llm/server.go createGPULayers; :func:`.ollama_split.gpu_layers`)
    output_first = False


OLLAMA_RUNNER = _OllamaBuffers()


class Ollama(Runtime):
    name = "ollama"
    compressed_attention_refusal = refusals.OLLAMA_COMPRESSED_ATTENTION  # DeepSeek-V4: its own cache
    label = "Ollama"
    gguf = True
    fallback_format = "gguf-Q4_K_M"
    sizes_from_capacity = True  # the layers Ollama offloads depend on the GPU's memory
    even_stages = False  # pp GPUs take layers by their free memory (ollama_split)
    # v0.12.10's llama runner (vendored llama.cpp 7049736, Makefile.sync) runs jamba, nemotron_h,
    # granitehybrid, falcon-h1 (Mamba-1/2) and lfm2 / lfm2moe (short conv); their r / s buffers are
    # llama.cpp's (runtimes/state_pools.py)
    state_mixers = frozenset({"mamba1", "mamba2", "short_conv"})
    state_refusals = refusals.OLLAMA_STATE  # the gated DeltaNet, KDA, lightning: not in v0.12.10
    cross_attention_refusal = refusals.OLLAMA_CROSS_ATTENTION  # mllama: its Go engine

    def for_run(self, run: InferenceRun) -> Runtime:
        """The profile of the run's Ollama version: v0.12.10's llama runner, or v0.30+'s llama-server."""
        return OLLAMA_SERVER if run.ollama_version == OLLAMA_SERVER_ERA else OLLAMA

    def check(self, spec: ModelSpec, run: InferenceRun) -> list[str]:
        check_parallelism(run)
        warns = list(ollama_settings(spec, run).warnings)
        if run.sched_spread and run.pp == 1:
            warns.append("sched_spread: one GPU (pp 1); OLLAMA_SCHED_SPREAD changes nothing")
        if run.fit_target_mib != LLAMA_FIT_TARGET_MIB:
            warns.append(
                "fit_target_mib: v0.12.10 places the layers itself (llm/memory.go), no --fit: ignored"
            )
        return warns

    def estimate(
        self,
        spec: ModelSpec,
        run: InferenceRun,
        warnings: tuple[str, ...],
        gpu: GpuMemory | None,
        wb: WeightBytes,
    ) -> Estimate:
        # Ollama places layers in the free memory its discovery reports: NVML's free
        # (ml/backend/ggml/ggml/src/mem_nvml.cpp ggml_nvml_get_device_memory: nvmlDeviceGetMemoryInfo's free
        # leaves out the driver's reserve) or cudaMemGetInfo's: on an idle GPU, CUDA's total
        capacity = gpu.cuda_bytes if gpu else None
        s, pred, plc = ollama_plan(spec, run, wb, capacity)
        n = spec.num_layers + 1  # Ollama counts the output layer
        # a num_gpu the user sets goes to llama.cpp as is (llm/server.go: the estimate's count only replaces
        # num_gpu = -1), so it may exceed what Ollama predicts fits
        layers = plc.layers if run.num_gpu is None else min(run.num_gpu, n)
        notes = [*warnings, *placement_notes(run, plc, layers, n, capacity)]
        lrun = run.model_copy(
            update={
                "engine": "llama.cpp",
                "batch": s.parallel,
                "seq": s.num_ctx,
                "new_tokens": 0,
                "n_gpu_layers": layers,
                "n_batch": s.batch,
                "n_ubatch": min(s.batch, LLAMA_DEFAULT_UBATCH),
                "flash_attn": s.flash,
                "kv_dtype": _KV_LLAMA[s.kv_type],
                "cache_type_k": None,  # Ollama sets one type for K and V
                "cache_type_v": None,
                "kv_offload": True,
                "mla_cache": "full",  # Ollama's library DeepSeek GGUFs predate key_length_mla
            }
        )
        if has_state(spec):
            notes.append(recurrent_note(spec, pred, s.parallel))
        est = OLLAMA_RUNNER.estimate(spec, lrun, tuple(notes), gpu, wb)
        facts = {
            **est.facts,
            "offloaded": f"{layers}/{n}",
            "ollama_layers": plc.layers,  # Ollama's own layers.offload
            "layers_requested": -1 if run.num_gpu is None else run.num_gpu,  # Ollama's layers.requested
            "num_ctx": s.num_ctx,
            "num_parallel": s.parallel,
            "kv_cells": s.num_ctx * s.parallel,
            "num_batch": s.batch,
            "flash_attention": s.flash,
            "kv_cache_type": s.kv_type,
            "ollama_required_full": plc.total,
            "ollama_required_partial": plc.vram,
            "ollama_kv": sum(pred.kv),
            **({"ollama_kv_recurrent": pred.kv_recurrent} if has_state(spec) else {}),
            "ollama_graph_full": pred.graph_full if len(plc.split) < 2 else pred.graph_partial,
            "ollama_graph_partial": pred.graph_partial,
            "ollama_weights_repeating": sum(pred.layer_bytes),
            "ollama_weights_nonrepeating": pred.output_bytes,
            "ollama_source": _SRC,
        }
        if run.pp > 1:  # the GPUs Ollama loads on, its layers.split and memory.required.allocations
            facts |= {
                "ollama_gpus": sum(1 for k in plc.split if k) or len(plc.split),
                "ollama_split": ",".join(str(k) for k in plc.split),
                "ollama_allocations": ",".join(str(a) for a in plc.allocations),
            }
            est = split_estimate(spec, lrun, wb, est, plc.split, layers)
        return est.model_copy(update={"engine": self.name, "facts": facts})

    def fit_levers(self, spec: ModelSpec, run: InferenceRun, fits: Callable[..., bool]) -> list[Lever]:
        """Flash attention with a q8_0 KV cache (Ollama's own advice for a model that does not fit), and
        num_gpu: the most layers on the GPU that fit, the rest on the CPU."""
        out: list[Lever] = []
        server = run.ollama_version == OLLAMA_SERVER_ERA
        if (
            flash_supported(spec)
            and not (run.flash_attention != "off" if server else ollama_settings(spec, run).flash)
            and fits(flash_attention="on", kv_dtype="q8_0")
        ):
            upd: dict[str, object] = {"flash_attention": "on", "kv_dtype": "q8_0"}
            out.append((5, "flash", "OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE=q8_0", upd))
        n = spec.num_layers + 1
        best = largest(lambda k: fits(num_gpu=k), 0, n)
        if best is not None and best < n:
            out.append((6, "offload", f"{n - best} layers on the CPU (num_gpu {best})", {"num_gpu": best}))
        return out

    def kv_cache_dtype(self, spec: ModelSpec, run: InferenceRun) -> str:
        """OLLAMA_KV_CACHE_TYPE where Ollama honours it (v0.12.10: flash attention on), else f16."""
        if run.ollama_version == OLLAMA_SERVER_ERA:
            return kv_label(*kv_types(run.model_copy(update={"kv_dtype": server_kv_type(run)})))
        return ollama_settings(spec, run).kv_type

    def batch_limit(self, run: InferenceRun) -> tuple[int, str] | None:
        """With OLLAMA_NUM_PARALLEL set, Ollama serves that many requests at once and queues the rest
        (server/sched.go: a runner takes numParallel requests; llm/server.go NewLlamaServer sizes the KV cache
        num_ctx x numParallel): a larger batch needs no more memory."""
        if run.num_parallel is None:
            return None
        return run.num_parallel, f"OLLAMA_NUM_PARALLEL={run.num_parallel}: Ollama queues more requests"

    def needed_bytes(self, est: Estimate, share: GpuShare) -> int:
        """v0.30+: what the GPU needs for llama-server's --fit to keep every layer and expert on it."""
        return LLAMA_CPP.needed_bytes(est, share)

    def admits(self, est: Estimate) -> bool:
        """A fit means every layer on the GPU (Ollama would run the others on the CPU), unless num_gpu asked
        for fewer."""
        done, _, total = str(est.facts.get("offloaded", "0/1")).partition("/")
        on_gpu = done == total and not est.facts.get(
            "fit_cpu_expert_layers"
        )  # v0.30+: experts in host memory
        return on_gpu or est.facts.get("layers_requested", -1) != -1

    def expresses(
        self, spec: ModelSpec, run: InferenceRun, source: str, checkpoint: str | None = None
    ) -> str | None:
        """A GGUF weight format of a model with an Ollama library tag (or a Hugging Face GGUF repository,
        ``hf.co/<repo>:<type>``), or a GGUF file (``FROM`` in a Modelfile)."""
        why = super().expresses(spec, run, source, checkpoint)
        if why is not None or run.weights == "file":
            return why
        if source.startswith(("/", "./", "../", "~")) or "\\" in source:
            return f"Ollama pulls a model by name; {source} is a local model that is not a GGUF file"
        if ollama_tag(source, run.weights).startswith("hf.co/") and "gguf" not in source.lower():
            return (
                f"{source} has no Ollama library tag gpumem knows, and Ollama pulls hf.co/<repo>:<type> only "
                "from a GGUF repository"
            )
        return None

    # the run fields Ollama's server, model name and parameters cannot say (Runtime.unexpressed)
    unexpressed = (
        ("batch", "the requests sent to the server"),
        ("seq", "the requests' prompt tokens"),
        ("new_tokens", "the requests' new tokens"),
        ("compute_dtype", "Ollama has no compute dtype option (its kernels choose)"),
        ("cuda_context_mib", "the driver's CUDA context"),
        ("gpu_arch", "the GPU the driver runs on"),
        ("ollama_version", "the Ollama release installed"),
    )

    def command(self, model: str, run: InferenceRun, est: Estimate) -> str:
        env = []
        num_ctx, parallel = est.facts.get("num_ctx"), est.facts.get("num_parallel")
        if run.num_ctx is not None or num_ctx != OLLAMA_DEFAULT_NUM_CTX:
            env.append(f"OLLAMA_CONTEXT_LENGTH={run.num_ctx or num_ctx}")
        if run.num_parallel is not None or parallel != 1:  # a run's own 1 too: read back, None is the batch
            env.append(f"OLLAMA_NUM_PARALLEL={run.num_parallel or parallel}")
        if run.flash_attention != "auto":
            env.append(f"OLLAMA_FLASH_ATTENTION={int(run.flash_attention == 'on')}")
        if run.kv_dtype != "auto":  # a type the run names, f16 too (read back as named, not as auto)
            env.append(f"OLLAMA_KV_CACHE_TYPE={KV_OLLAMA.get(run.kv_dtype.lower(), run.kv_dtype)}")
        if run.gpu_overhead_mib:
            env.append(f"OLLAMA_GPU_OVERHEAD={run.gpu_overhead_mib * MiB}")
        if run.pp > 1:  # the GPUs Ollama may split the layers over
            env.append("CUDA_VISIBLE_DEVICES=" + ",".join(str(i) for i in range(run.pp)))
        if run.sched_spread:
            env.append("OLLAMA_SCHED_SPREAD=1")
        if run.ollama_version == OLLAMA_SERVER_ERA and run.fit_target_mib != LLAMA_FIT_TARGET_MIB:
            env.append(f"LLAMA_ARG_FIT_TARGET={run.fit_target_mib}")  # passed on to llama-server
        lines = [shlex.join([*env, "ollama", "serve"])]
        if run.weights == "file":  # a GGUF file: a Modelfile names it (docs/modelfile.md FROM)
            base = model.replace("\\", "/").rsplit("/", 1)[-1]
            base = base[:-5] if base.lower().endswith(".gguf") else base
            name = "".join(c if c.isalnum() or c in "._-" else "-" for c in base.lower()) or "model"
            lines += [
                f"printf 'FROM %s\\n' {shlex.quote(model)} > Modelfile",
                shlex.join(["ollama", "create", name, "-f", "Modelfile"]),
                shlex.join(["ollama", "run", name]),
            ]
        else:
            lines.append(shlex.join(["ollama", "run", ollama_tag(model, run.weights)]))
        if run.num_gpu is not None:
            lines.append(f"/set parameter num_gpu {run.num_gpu}")
        if run.num_batch is not None:
            lines.append(f"/set parameter num_batch {run.num_batch}")
        return self.with_unsaid(run, lines)


OLLAMA = Ollama()


class OllamaServer(Ollama):
    """Ollama v0.30+ (``ollama_version`` 0.30+): llama-server under Ollama's arguments and defaults
    (:mod:`.ollama_server`), sized by the llama.cpp profile, so it runs what llama.cpp runs: every hybrid
    whose state llama.cpp sizes, Llama 4's chunked layers in llama.cpp's SWA cache; not mllama."""

    state_mixers = LlamaCpp.state_mixers
    state_refusals = MappingProxyType({})
    cross_attention_refusal = refusals.OLLAMA_SERVER_CROSS_ATTENTION  # no mllama in llama.cpp
    # DeepSeek-V4: llama.cpp's llama_kv_cache_dsv4 (PR #24162, merged by June 2026, before the pinned b10488)
    compressed_attention = LlamaCpp.compressed_attention

    def check(self, spec: ModelSpec, run: InferenceRun) -> list[str]:
        check_parallelism(run)
        lightning = any(k.mixer == "lightning" for k in model_kinds(spec).state)
        return [refusals.OLLAMA_SERVER_LIGHTNING] if lightning else []

    def estimate(
        self,
        spec: ModelSpec,
        run: InferenceRun,
        warnings: tuple[str, ...],
        gpu: GpuMemory | None,
        wb: WeightBytes,
    ) -> Estimate:
        s = server_settings(spec, run, gpu, wb)
        gpus, gpus_note = server_gpus(spec, run, gpu, wb, s.num_ctx * s.parallel)
        n = spec.num_layers + 1  # -ngl counts the output layer
        lrun = run.model_copy(
            update={
                "engine": "llama.cpp",
                "batch": s.parallel,
                "seq": s.num_ctx,
                "new_tokens": 0,
                "pp": 1,
                "n_gpu_layers": -1 if run.num_gpu is None else run.num_gpu,  # -ngl only when num_gpu is set
                "fit": "on" if run.num_gpu is None else "off",
                "n_batch": s.batch,
                "n_ubatch": s.batch,
                "flash_attn": s.flash,
                "kv_dtype": s.kv_dtype,
                "cache_type_k": None,  # one type for K and V
                "cache_type_v": None,
                "kv_offload": True,
                # Ollama's library DeepSeek GGUFs predate key_length_mla
                "mla_cache": "full" if model_kinds(spec).latent else "latent",
            }
        )
        notes = (*warnings, *s.warnings, *([gpus_note] if gpus_note else []), *LLAMA_CPP.check(spec, lrun))
        split: tuple[int, ...] = ()
        if gpus > 1:  # llama-server's layer split over the GPUs (and its --fit when num_gpu is not set)
            plc = (
                fit_split(spec, lrun, wb, gpus, gpu.cuda_bytes - _context(lrun), run.fit_target_mib)
                if run.num_gpu is None and gpu is not None
                else SplitFit((1,) * gpus, n if run.num_gpu is None else min(run.num_gpu, n), frozenset(), "")
            )
            split = plc.split
            lrun = lrun.model_copy(update={"n_gpu_layers": plc.n_gpu_layers, "fit": "off"})
            notes = (*notes, *([plc.note] if plc.note else []))
        est = LLAMA_CPP.estimate(spec, lrun, notes, gpu, wb)
        if split:
            est = split_estimate(spec, lrun, wb, est, split, lrun.n_gpu_layers, True, plc.cpu_experts, True)
            est = est.model_copy(update={"facts": split_fit_facts(spec, wb, plc, est.facts)})
        ngl = int(est.facts.get("fit_n_gpu_layers", lrun.n_gpu_layers))
        layers = n if ngl < 0 else min(ngl, n)
        facts = {
            **est.facts,
            "offloaded": f"{layers}/{n}",
            "layers_requested": -1 if run.num_gpu is None else run.num_gpu,
            "num_ctx": s.num_ctx,
            "num_parallel": s.parallel,
            "kv_cells": s.num_ctx * s.parallel,
            "num_batch": s.batch,
            "flash_attention": s.flash,
            "kv_cache_type": kv_label(*kv_types(lrun)),
            "ollama_version": OLLAMA_SERVER_ERA,
            "llama_cpp_build": OLLAMA_LLAMA_CPP,
            "ollama_source": _SERVER_SRC,
            **({"llama_split": ",".join(str(k) for k in split)} if split else {}),
        }
        return est.model_copy(update={"engine": self.name, "facts": facts})


OLLAMA_SERVER = OllamaServer()
