"""The llama.cpp runtime: a model buffer, a KV buffer and a compute buffer per GPU, from GGUF files.

``src/llama-model.cpp`` ``load_tensors``: the offloaded layers (``-ngl``; the token embedding stays in host
memory, the output layer is offloaded with the last layer) form the model buffer; ``src/llama-kv-cache.cpp``
gives ``n_ctx`` cells to every offloaded layer; the compute buffer is sized by ``ggml-alloc`` for one
``n_ubatch`` micro-batch.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats import WeightBytes, check_kv_dtype
from gpumem_gui.core.gpu_memory import GpuMemory
from gpumem_gui.core.monotone import largest
from gpumem_gui.core.results.estimate import Component, Estimate, GpuShare, Phase
from gpumem_gui.core.results.nontorch import context_bytes
from gpumem_gui.core.runtimes import llamacpp_dsv4, refusals
from gpumem_gui.core.runtimes.base import Lever, Runtime, component
from gpumem_gui.core.runtimes.llamacpp_compute import OP_OFFLOAD_MIN_BATCH, compute_buffer
from gpumem_gui.core.runtimes.llamacpp_fit import fit_needed_bytes, fit_single_gpu
from gpumem_gui.core.runtimes.llamacpp_kv import (  # noqa: F401 (kv_types, kv_label: re-exported)
    KV_FLAGS,
    LLAMA_DEFAULT_KV,
    kv_buffers,
    kv_caches,
    kv_label,
    kv_row_widths,
    kv_types,
)
from gpumem_gui.core.runtimes.llamacpp_state import state_component, state_facts
from gpumem_gui.core.runtimes.ollama_models import gguf_weights_id
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.runtimes.state_pools import llamacpp_state_buffers
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import count_params
from gpumem_gui.core.spec.state import has_state


def hf_gguf_weights(tag: str) -> str | None:
    """The weight format a ``-hf <repo>:<tag>`` GGUF type names (None: not a type gpumem knows)."""
    try:
        return gguf_weights_id(tag)
    except GpumemInputError:
        return None


_FLOAT_KV = ("fp16", "f16", "fp32", "f32", "bf16")
# layers without KV cells in llama_memory_hybrid (filter_attn = !is_recurrent(il), and Nemotron-H's MLP-only
# layers, n_ff(il) != 0); cross-attention layers keep their cells as before


def gpu_blocks(spec: ModelSpec, run: InferenceRun, output_first: bool = True) -> tuple[int, bool]:
    """(blocks on the GPU, whether the output layer is) for ``-ngl``: the last blocks, and the output layer
    counted first, as llama.cpp lays them out (``src/llama-model.cpp`` ``load_tensors``:
    ``i_gpu_start = n_layer + 1 - n_gpu_layers``, ``dev_output = get_layer_buft_list(n_layer)``: -ngl k holds
    the output layer and the last k - 1 blocks); ``output_first`` False: Ollama v0.12.10's own layout
    (``llm/server.go`` ``createGPULayers``: the last k blocks, the output layer only with every block)."""
    n, ngl = spec.num_layers, run.n_gpu_layers
    if ngl < 0 or ngl > n:
        return n, True
    if output_first:
        return max(ngl - 1, 0), ngl > 0
    return ngl, False


def _head_bytes(spec: ModelSpec, wb: WeightBytes) -> int:
    """The output norm and output layer; a tied output layer is its own copy of token_embd
    (src/llama-model.cpp: output = create_tensor(tok_embd's name, TENSOR_DUPLICATED) on the output's
    device)."""
    embeddings = sum(
        wb.by_component.get(k, 0) for k in ("embedding", "position_embedding", "embedding_extra", "vision")
    )
    head = wb.total_bytes - sum(wb.per_layer) - embeddings
    return head + (wb.by_component.get("embedding", 0) if spec.tie_word_embeddings else 0)


def _experts_bytes(spec: ModelSpec, wb: WeightBytes, blocks: frozenset[int]) -> int:
    """The routed experts of ``blocks`` (``--fit``'s ffn_*_exps overrides), each MoE layer an equal share."""
    n = spec.num_moe_layers
    share = wb.by_component.get("routed_experts", 0) // n if n else 0
    return share * sum(1 for i in blocks if spec.is_moe_layer(i))


def _offload(
    spec: ModelSpec,
    run: InferenceRun,
    wb: WeightBytes,
    cpu_experts: frozenset[int] = frozenset(),
    output_first: bool = True,
) -> tuple[int, int, int]:
    """(offloaded blocks, model bytes on the GPU, model bytes in host memory) of :func:`gpu_blocks`'s layout;
    ``cpu_experts``: the offloaded blocks whose routed experts ``--fit`` keeps in host memory."""
    n_layers = spec.num_layers
    offloaded, on_gpu = gpu_blocks(spec, run, output_first)
    model_gpu = sum(wb.per_layer[n_layers - offloaded :]) + (_head_bytes(spec, wb) if on_gpu else 0)
    model_gpu -= _experts_bytes(spec, wb, frozenset(i for i in cpu_experts if i >= n_layers - offloaded))
    # a tied output layer on the GPU is a copy: token_embd itself stays in host memory (published Ollama log
    # of llama3.2:3b: CPU model buffer 308.23 MiB = token_embd, CHANGELOG.md, 0.1.0-dev.3); with the output
    # layer in host memory too, the duplicate maps the same file range (CPU_Mapped counts it once)
    copy = wb.by_component.get("embedding", 0) if spec.tie_word_embeddings and on_gpu else 0
    return offloaded, model_gpu, wb.total_bytes - model_gpu + copy


def _compute_buffer(
    spec: ModelSpec,
    run: InferenceRun,
    output: bool = True,
    wb: WeightBytes | None = None,
    chunked: bool = True,
    host_experts: int = 0,
    output_first: bool = True,
) -> Component:
    """The GPU's compute buffer (:func:`.llamacpp_compute.compute_buffer`), one KQ mask per KV cache (the
    full-attention one and llama_kv_cache_iswa's SWA one). ``output`` False: a GPU of a layer split that
    does not hold the output layer (no logits stage). ``wb`` given: a single GPU under ``-ngl``
    (:func:`gpu_blocks`), where the output layer and the layers left in host memory are copied in for a
    micro-batch of at least OP_OFFLOAD_MIN_BATCH tokens (ggml_backend_sched op offload); ``host_experts``:
    one layer's routed experts that ``--fit`` left in host memory, copied in the same way."""
    cells = kv_caches(spec, run, chunked)
    full = [c for layers, c in cells if model_kinds(spec).bounds(chunked)[layers[0]] is None]
    swa = [c for layers, c in cells if model_kinds(spec).bounds(chunked)[layers[0]] is not None]
    caches = tuple(max(group) for group in (full, swa) if group)
    offload = min(run.n_ubatch, run.batch * run.tokens) >= OP_OFFLOAD_MIN_BATCH
    if wb is None or gpu_blocks(spec, run, output_first) == (spec.num_layers, True):
        return compute_buffer(spec, run, caches, output=output, host_layer=host_experts if offload else 0)
    blocks, on_gpu = gpu_blocks(spec, run, output_first)
    host_layer = max(*wb.per_layer[: spec.num_layers - blocks], host_experts, 0) if offload else 0
    head = _head_bytes(spec, wb) if offload and not on_gpu else 0
    return compute_buffer(
        spec, run, caches, output=on_gpu or offload, output_weight=head, host_layer=host_layer
    )


def _one(spec: ModelSpec, wb: WeightBytes, experts: frozenset[int]) -> int:
    """One MoE layer's routed experts when ``--fit`` left some in host memory (op offload copies it)."""
    return _experts_bytes(spec, wb, frozenset([min(experts)])) if experts else 0


def _device_bytes(
    spec: ModelSpec, run: InferenceRun, wb: WeightBytes, experts: frozenset[int], chunked: bool, first: bool
) -> int:
    """What llama.cpp's no-alloc probe projects on the GPU (common/fit.cpp
    common_get_device_memory_data: model + context + compute of ``llama_memory_breakdown``)."""
    offloaded, model_gpu, _ = _offload(spec, run, wb, experts, first)
    kv_gpu = kv_buffers(spec, run, offloaded, chunked)[0]
    rs = llamacpp_state_buffers(spec, run.batch, spec.num_layers - offloaded, run.kv_offload)["gpu_bytes"]
    one = _one(spec, wb, experts)
    compute = _compute_buffer(spec, run, wb=wb, chunked=chunked, host_experts=one, output_first=first).bytes
    return model_gpu + kv_gpu + rs + compute


class LlamaCpp(Runtime):
    name = "llama.cpp"
    compressed_attention = True  # DeepSeek-V4: llama_kv_cache_dsv4 (runtimes/llamacpp_dsv4.py)
    label = "llama.cpp"
    # llama_memory_recurrent's r / s widths (runtimes/state_pools.py llamacpp_state_widths)
    state_mixers = frozenset({"gated_deltanet", "kda", "lightning", "mamba1", "mamba2", "short_conv"})
    cross_attention_refusal = refusals.LLAMACPP_CROSS_ATTENTION  # no mllama in llama-arch.cpp
    gguf = True
    fallback_format = "gguf-Q4_K_M"
    # chunked-local layers keep one chunk (+ a micro-batch) of cells, as SWA layers (LLAMA_SWA_TYPE_CHUNKED)
    chunked_local = True
    # -ngl counts the output layer first (src/llama-model.cpp load_tensors: i_gpu_start = n_layer + 1 - ngl)
    output_first = True

    def check(self, spec: ModelSpec, run: InferenceRun) -> list[str]:
        """-ctk/-ctv must be types llama.cpp takes (an error); a quantized V cache without flash attention is
        refused by llama.cpp at start (src/llama-context.cpp, "V cache quantization requires flash_attn"): a
        warning, the buffers are still estimated."""
        v_type = kv_types(run)[1]
        for field, value in (("cache_type_k", run.cache_type_k), ("cache_type_v", run.cache_type_v)):
            if value is not None:
                try:
                    check_kv_dtype(self.name, value)
                except GpumemInputError as e:
                    raise GpumemInputError(
                        str(e).replace("the KV cache", f"the {field[-1].upper()} cache"), field=field
                    ) from None
        warnings = llamacpp_dsv4.check(spec)  # DeepSeek-V4: what is not measured
        if v_type not in _FLOAT_KV and not run.flash_attn:
            warnings.append(
                f"cache_type_v: llama.cpp refuses a quantized V cache ({v_type}) without flash attention "
                "(V cache quantization requires flash_attn); turn -fa on"
            )
        if run.fit == "on" and run.n_gpu_layers >= 0:
            warnings.append(
                f"fit: -ngl {run.n_gpu_layers} is set, so llama.cpp's --fit changes no layers "
                "(common/fit.cpp common_params_fit_impl: n_gpu_layers already set by user); set GPU layers "
                "to all for -ngl auto"
            )
        if run.mla_cache == "full" and model_kinds(spec).latent is None:
            warnings.append("mla_cache: the model has no MLA layers; 'full' changes nothing")
        if any(k.mixer in ("kda", "lightning") for k in model_kinds(spec).state):
            # llama-context.cpp reserves these graphs at one sequence: [TAG_RESERVE_DIAG_DECAY]
            warnings.append(
                "llama.cpp: the KDA / lightning graph's own inputs in the compute buffer (decay tensors "
                "growing with n_ubatch^2) are not modelled; the RS and KV buffers are"
            )
        return warnings

    def estimate(
        self,
        spec: ModelSpec,
        run: InferenceRun,
        warnings: tuple[str, ...],
        gpu: GpuMemory | None,
        wb: WeightBytes,
    ) -> Estimate:
        run, experts, fit_facts, fit_notes = self._fit(spec, run, gpu, wb)
        warnings = (*warnings, *fit_notes)
        offloaded, model_gpu, model_cpu = _offload(spec, run, wb, experts, self.output_first)
        output = (
            " + output" if gpu_blocks(spec, run, self.output_first)[1] and offloaded < spec.num_layers else ""
        )
        kv_gpu, kv_host = kv_buffers(spec, run, offloaded, self.chunked_local)
        k_type, v_type = kv_types(run)
        weights_c = component(
            "weights",
            f"model buffer ({run.weights}, {offloaded}/{spec.num_layers} layers{output} on GPU)",
            model_gpu,
            "offloaded layers' tensors + the output layer where it is offloaded",
            "llama.cpp src/llama-model.cpp load_tensors (token_embd stays in host memory; -ngl counts the "
            "output layer first: i_gpu_start = n_layer + 1 - n_gpu_layers)",
            offloaded=offloaded,
            n_layers=spec.num_layers,
        )
        kv_c = component(
            "kv_cache",
            "KV buffer",
            kv_gpu,
            "n_ctx cells x (K width x K type size + V width x V type size) per layer on the GPU "
            "(offloaded layers, none with --no-kv-offload)",
            "llama.cpp src/llama-kv-cache.cpp",
            n_ctx=run.batch * run.tokens,
            type_k=k_type,
            type_v=v_type,
            host_bytes=kv_host,
        )
        one = _one(spec, wb, experts)
        compute_c = _compute_buffer(spec, run, True, wb, self.chunked_local, one, self.output_first)
        rs = llamacpp_state_buffers(spec, run.batch, spec.num_layers - offloaded, run.kv_offload)
        state_c = state_component(rs) if has_state(spec) else None
        ctx = component(
            "cuda_context",
            "CUDA context",
            context_bytes(run.gpu_arch, run.cuda_context_mib),
            "fixed per process",
            "by GPU generation (gpu_arch) or --cuda-context-mib: see gpumem_gui/core/results/nontorch.py",
        )
        caches = (kv_c,) if state_c is None else (kv_c, state_c)
        comps = (weights_c, *caches, compute_c, ctx)
        peak = model_gpu + kv_gpu + rs["gpu_bytes"] + compute_c.bytes
        total = peak + ctx.bytes
        phases = {
            "load": Phase(name="load", peak_bytes=peak - compute_c.bytes, components=(weights_c, *caches)),
            "decode": Phase(name="decode", peak_bytes=peak, components=(weights_c, *caches, compute_c)),
        }
        return Estimate(
            mode="inference",
            engine=self.name,
            phases=phases,
            peak_phase="decode",
            peak_bytes=peak,
            total_bytes=total,
            components=comps,
            per_gpu=(GpuShare(index=0, role="GPU 0", peak_bytes=peak, total_bytes=total, components=comps),),
            kv_cache_bytes=kv_gpu,
            warnings=warnings,
            facts={
                "cpu_bytes": model_cpu,
                "offloaded_layers": offloaded,
                "params_total": count_params(spec).total,
                # the KV of layers left on the CPU (or all of it with --no-kv-offload), when there is any
                **({"kv_host_bytes": kv_host} if kv_host else {}),
                **(state_facts(rs) if state_c is not None else {}),
                **fit_facts,
            },
        )

    def _fit(
        self, spec: ModelSpec, run: InferenceRun, gpu: GpuMemory | None, wb: WeightBytes
    ) -> tuple[InferenceRun, frozenset[int], dict[str, object], tuple[str, ...]]:
        """``--fit on`` with ``-ngl auto``: the run with the layers llama.cpp's fit picks in the GPU's free
        memory (CUDA's total less the process's CUDA context), the blocks whose routed experts it keeps in
        host memory, its facts and its note (:mod:`.llamacpp_fit`)."""
        if run.fit == "off" or run.n_gpu_layers >= 0:
            return run, frozenset(), {}, ()
        if gpu is None:
            return (
                run,
                frozenset(),
                {},
                ("--fit: no GPU memory given; every layer is taken to be on the GPU",),
            )
        free = gpu.cuda_bytes - context_bytes(run.gpu_arch, run.cuda_context_mib)

        def used(ngl: int, cpu: frozenset[int]) -> int:
            at = run.model_copy(update={"n_gpu_layers": ngl})
            return _device_bytes(spec, at, wb, cpu, self.chunked_local, self.output_first)

        moe = frozenset(i for i in range(spec.num_layers) if spec.is_moe_layer(i))
        plc = fit_single_gpu(spec.num_layers, moe, free, run.fit_target_mib, used)
        facts: dict[str, object] = {
            "fit_projected_bytes": plc.projected,
            "fit_n_gpu_layers": plc.n_gpu_layers,
            "fit_cpu_expert_layers": len(plc.cpu_experts),
        }
        return run.model_copy(update={"n_gpu_layers": plc.n_gpu_layers}), plc.cpu_experts, facts, (plc.note,)

    def fit_levers(self, spec: ModelSpec, run: InferenceRun, fits: Callable[..., bool]) -> list[Lever]:
        """Leave layers in host memory: the most layers on the GPU that still fit (``-ngl``, the output layer
        counted as one)."""
        n = spec.num_layers + 1
        best = largest(lambda k: fits(n_gpu_layers=k), 0, n)
        if best is None or best >= n:
            return []
        return [(6, "offload", f"offload {n - best} layers to the CPU (-ngl {best})", {"n_gpu_layers": best})]

    def needed_bytes(self, est: Estimate, share: GpuShare) -> int:
        """With --fit on, what the GPU needs for llama.cpp's fit to change nothing (every layer and expert on
        it); else the estimate's total."""
        ctx = sum(c.bytes for c in share.components if c.key == "cuda_context")
        return fit_needed_bytes(est.facts, ctx) or share.total_bytes

    def kv_cache_dtype(self, spec: ModelSpec, run: InferenceRun) -> str:
        """-ctk / -ctv as given, else llama.cpp's f16 (not the compute dtype)."""
        return kv_label(*kv_types(run))

    # the run fields llama-server has no option for (Runtime.unexpressed): -c holds each slot's prompt + new
    # tokens together; the GGUF file's MLA layout; a split over GPUs is llama.cpp's own (-sm, -ts)
    unexpressed = (
        ("seq", "each slot's context (-c / -np) is prompt + new tokens"),
        ("new_tokens", "each slot's context (-c / -np) is prompt + new tokens"),
        ("tp", "llama.cpp splits the layers over the visible GPUs itself"),
        ("pp", "llama.cpp splits the layers over the visible GPUs itself"),
        ("ep", "llama.cpp has no expert parallelism"),
        ("mla_cache", "the GGUF conversion's MLA layout"),
        ("compute_dtype", "llama.cpp has no compute dtype option (its kernels choose)"),
        ("cuda_context_mib", "the driver's CUDA context"),
        ("gpu_arch", "the GPU the driver runs on"),
    )

    def expresses(
        self, spec: ModelSpec, run: InferenceRun, source: str, checkpoint: str | None = None
    ) -> str | None:
        """A GGUF file (weights = file), or a GGUF type of a Hugging Face GGUF repository (``-hf
        <repo>:<type>``, common/arg.cpp: llama.cpp downloads that file)."""
        why = super().expresses(spec, run, source, checkpoint)
        if why is not None or run.weights == "file":
            return why
        if source.lower().endswith(".gguf"):
            return f"{source} holds its own GGUF types: llama.cpp loads it as it is (weights = file)"
        if "gguf" not in source.lower() or source.startswith(("/", "./", "../", "~")) or "\\" in source:
            return (
                f"llama.cpp loads a GGUF file; {source} is not a Hugging Face GGUF repository (-hf "
                "<repo>:<type>): convert it with convert_hf_to_gguf.py and open the file"
            )
        if hf_gguf_weights(run.weights.removeprefix("gguf-")) != run.weights:
            return f"-hf <repo>:<type> names a GGUF type; {run.weights} is a llama-quantize mix, not a type"
        return None

    def command(self, model: str, run: InferenceRun, est: Estimate) -> str:
        k_type, v_type = (KV_FLAGS.get(t, t) for t in kv_types(run))
        file = run.weights == "file" or model.lower().endswith(".gguf")  # else a GGUF repository's type
        where = ["-m", model] if file else ["-hf", f"{model}:{run.weights.removeprefix('gguf-')}"]
        args = [
            "llama-server",
            *where,
            "-c",
            str(run.batch * run.tokens),
            "-ngl",  # common/arg.cpp -ngl: an exact number, 'auto' or 'all'
            ("auto" if run.fit == "on" else "all") if run.n_gpu_layers < 0 else str(run.n_gpu_layers),
            "-ctk",
            k_type,
            "-ctv",
            v_type,
            "-b",
            str(run.n_batch),
            "-ub",
            str(run.n_ubatch),
            "-fa",
            "on" if run.flash_attn else "off",
        ]
        if run.batch > 1:
            args += ["-np", str(run.batch)]
        if not run.kv_offload:
            args.append("-nkvo")
        if run.swa_full:
            args.append("--swa-full")
        if run.fit == "on":
            args += ["--fit", "on", "--fit-target", str(run.fit_target_mib)]
        return self.with_unsaid(run, [shlex.join(args)])


LLAMA_CPP = LlamaCpp()
