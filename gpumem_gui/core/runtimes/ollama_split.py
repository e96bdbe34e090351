"""Ollama over several GPUs: which of them it loads a model on, which layers each gets, and each GPU's bytes.

Ollama v0.12.10's scheduler (``llm/server.go`` ``pickBestFullFitByLibrary``) sorts the GPUs by free memory
and, unless ``OLLAMA_SCHED_SPREAD`` is set, takes the fewest (1, 2, ...) on which its prediction places every
layer; with the setting, or when no subset holds every layer (``pickBestPartialFitByLibrary``), it takes all
of them. :func:`~.ollama_predict.place_gpus` then gives each GPU a layer count (``layers.split``), and
``createGPULayers`` turns the counts into contiguous layer ranges: block ``i`` of the offloaded range
``[start, stop)`` goes to the first GPU whose cumulative share of the split (float32) exceeds
``(i - start) / (stop - start)``, the output layer being index ``blocks``. llama.cpp's own layer split
(``src/llama-model.cpp`` ``load_tensors``, ``get_layer_buft_list`` with ``--tensor-split``) assigns the same
way. Each GPU then holds its layers' weights, KV cells and recurrent state (a hybrid's r / s rows,
``llama_memory_recurrent`` on each layer's device), a compute buffer for the stages it runs (the logits
only on the GPU with the output layer) and a CUDA context.
"""

from __future__ import annotations

import struct

from gpumem_gui.core.formats import WeightBytes
from gpumem_gui.core.results.estimate import Component, Estimate, GpuShare, Phase
from gpumem_gui.core.results.nontorch import context_bytes
from gpumem_gui.core.runtimes.base import component
from gpumem_gui.core.runtimes.llamacpp import _compute_buffer, _experts_bytes, _offload, _one, kv_buffers
from gpumem_gui.core.runtimes.ollama_predict import Placement, Prediction, place_gpus
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.runtimes.state_pools import llamacpp_state_buffers
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.state import has_state


def choose_gpus(
    pred: Prediction, free: int | None, gpus: int, overhead: int, num_gpu: int | None, spread: bool
) -> Placement:
    """Ollama's placement on the GPUs it picks out of ``gpus`` GPUs with ``free`` bytes each (None:
    unlimited): the fewest that hold every layer (or ``num_gpu`` layers), else all of them."""
    frees = (free,) * gpus
    if not spread:
        need = len(pred.layer_bytes) + 1 if num_gpu is None else num_gpu
        for k in range(1, gpus):
            plc = place_gpus(pred, frees[:k], overhead, num_gpu)
            if plc.layers > 0 and plc.layers >= need:  # predictServerFit
                return plc
    return place_gpus(pred, frees, overhead, num_gpu)


def _f32(x: float) -> float:
    """``x`` rounded to float32, as Go's ``float32`` arithmetic in ``createGPULayers`` rounds it."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def gpu_layers(split: tuple[int, ...], blocks: int, num_gpu: int, output_first: bool = False) -> list[range]:
    """``createGPULayers``: the contiguous layer indices (``blocks`` is the output layer) of each GPU;
    ``output_first``: llama.cpp's own layout of ``-ngl``, which counts the output layer first
    (``src/llama-model.cpp`` ``load_tensors``: ``i_gpu_start = n_layer + 1 - n_gpu_layers``, the same split
    points otherwise: ``upper_bound(splits, (il - i_gpu_start) / act_gpu_layers)``)."""
    total = sum(split)
    if num_gpu <= 0 or total <= 0:
        return [range(0) for _ in split]
    cum, acc = [], 0
    for k in split:
        acc += k
        cum.append(_f32(_f32(float(acc)) / _f32(float(total))))
    start = max(0, blocks + (1 if output_first else 0) - num_gpu)
    stop = min(start + num_gpu, blocks + 1)
    owner: list[list[int]] = [[] for _ in split]
    for i in range(start, stop):
        frac = _f32(_f32(float(i - start)) / _f32(float(stop - start)))
        g = next((j for j, c in enumerate(cum) if frac < c), None)
        if g is not None:
            owner[g].append(i)
    return [range(o[0], o[-1] + 1) if o else range(0) for o in owner]


def gpu_share(
    spec: ModelSpec,
    run: InferenceRun,
    wb: WeightBytes,
    gpu: int,
    layers: range,
    head: int,
    chunked: bool = False,
    cpu_experts: frozenset[int] = frozenset(),
) -> GpuShare:
    """GPU ``gpu``'s llama.cpp buffers for its ``layers`` (``spec.num_layers`` = the output layer);
    ``chunked``: chunked-local layers keep a chunk (llama.cpp; Ollama v0.12.10's engine: every token);
    ``cpu_experts``: the blocks whose routed experts ``--fit`` left in host memory. Their matrix products are
    offloaded to the first GPU, whose compute buffer holds a copy of one layer's experts
    (ggml/src/ggml-backend.cpp ggml_backend_sched_backend_id_from_cur, "1.off": the first backend, in
    priority order, that offloads the op)."""
    n = spec.num_layers
    blocks = range(layers.start, min(layers.stop, n))
    has_output = n in layers
    model = sum(wb.per_layer[i] for i in blocks) + (head if has_output else 0)
    mine = frozenset(i for i in cpu_experts if i in blocks)
    model -= _experts_bytes(spec, wb, mine)
    kv = (
        kv_buffers(spec, run, n - blocks.start, chunked)[0]
        - kv_buffers(spec, run, n - blocks.stop, chunked)[0]
        if blocks
        else 0
    )
    where = f"layers {blocks.start}-{blocks.stop - 1}" if blocks else "no block"
    weights_c = component(
        "weights",
        f"model buffer ({run.weights}, {where}{' + output' if has_output else ''})",
        model,
        "its blocks' tensors + the output layer on the GPU that holds it",
        "llama.cpp src/llama-model.cpp load_tensors (layer split by --tensor-split); ollama llm/server.go "
        "createGPULayers",
        gpu=gpu,
        first_block=blocks.start if blocks else -1,
        blocks=len(blocks),
        output_layer=has_output,
        **({"blocks_experts_in_host_memory": len(mine)} if mine else {}),
    )
    kv_c = component(
        "kv_cache",
        "KV buffer",
        kv,
        "n_ctx cells x (K width x K type size + V width x V type size) per block on this GPU",
        "llama.cpp src/llama-kv-cache.cpp (each layer's cells on its layer's device)",
        n_ctx=run.batch * run.tokens,
        blocks=len(blocks),
    )
    host = _one(spec, wb, cpu_experts) if gpu == 0 else 0
    compute_c = _compute_buffer(spec, run, output=has_output, chunked=chunked, host_experts=host)
    ctx = component(
        "cuda_context",
        "CUDA context",
        context_bytes(run.gpu_arch, run.cuda_context_mib),
        "fixed per process and GPU",
        "by GPU generation (gpu_arch) or --cuda-context-mib: see gpumem_gui/core/results/nontorch.py",
    )
    caches: tuple[Component, ...] = (kv_c,)
    if has_state(spec):  # the recurrent layers' r / s rows of this GPU's blocks
        rs = llamacpp_state_buffers(spec, run.batch, blocks.start, True)["gpu_bytes"] if blocks else 0
        rs -= llamacpp_state_buffers(spec, run.batch, blocks.stop, True)["gpu_bytes"] if blocks else 0
        caches += (
            component(
                "recurrent_state",
                "recurrent state (RS buffer)",
                rs,
                "max(1, n_seq_max) cells x (n_embd_r + n_embd_s) x 4 B per recurrent layer on this GPU",
                "llama.cpp src/llama-memory-recurrent.cpp (each layer's r / s on its layer's device)",
                cells=max(1, run.batch),
                blocks=len(blocks),
            ),
        )
    comps = (weights_c, *caches, compute_c, ctx)
    peak = model + sum(c.bytes for c in caches) + compute_c.bytes
    return GpuShare(
        index=gpu, role=f"GPU {gpu}", peak_bytes=peak, total_bytes=peak + ctx.bytes, components=comps
    )


def head_bytes(spec: ModelSpec, run: InferenceRun, wb: WeightBytes) -> int:
    """The output layer's (and norm's) bytes on the GPU that holds it."""
    return _offload(spec, run.model_copy(update={"n_gpu_layers": -1}), wb)[1] - sum(wb.per_layer)


def split_shares(
    spec: ModelSpec,
    run: InferenceRun,
    wb: WeightBytes,
    split: tuple[int, ...],
    layers: int,
    chunked: bool = False,
    cpu_experts: frozenset[int] = frozenset(),
    output_first: bool = False,
) -> tuple[GpuShare, ...]:
    """Each GPU's share of the layer ``split`` with ``layers`` offloaded (:func:`gpu_share`; ``output_first``:
    llama.cpp's layout, :func:`gpu_layers`)."""
    head = head_bytes(spec, run, wb)
    ranges = gpu_layers(split, spec.num_layers, layers, output_first)
    return tuple(gpu_share(spec, run, wb, g, r, head, chunked, cpu_experts) for g, r in enumerate(ranges))


def split_estimate(
    spec: ModelSpec,
    run: InferenceRun,
    wb: WeightBytes,
    est: Estimate,
    split: tuple[int, ...],
    layers: int,
    chunked: bool = False,
    cpu_experts: frozenset[int] = frozenset(),
    output_first: bool = False,
) -> Estimate:
    """``est`` (llama.cpp's estimate of ``run`` with ``layers`` offloaded, as on one GPU) with one share per
    GPU of the layer ``split`` (--tensor-split), ``cpu_experts`` the blocks whose routed experts stay in host
    memory (``output_first``: llama.cpp's layout, :func:`gpu_layers`); the headline figures are the
    most-loaded GPU's."""
    shares = split_shares(spec, run, wb, split, layers, chunked, cpu_experts, output_first)
    top = max(shares, key=lambda s: s.total_bytes)
    w, kv, compute = (
        next(c for c in top.components if c.key == k) for k in ("weights", "kv_cache", "compute_buffer")
    )
    caches = tuple(c for c in top.components if c.key in ("kv_cache", "recurrent_state"))
    phases = {
        "load": Phase(name="load", peak_bytes=top.peak_bytes - compute.bytes, components=(w, *caches)),
        "decode": Phase(name="decode", peak_bytes=top.peak_bytes, components=(w, *caches, compute)),
    }
    comps: tuple[Component, ...] = top.components
    return est.model_copy(
        update={
            "per_gpu": shares,
            "components": comps,
            "phases": phases,
            "peak_bytes": top.peak_bytes,
            "total_bytes": top.total_bytes,
            "kv_cache_bytes": kv.bytes,
        }
    )


def placement_notes(
    run: InferenceRun, plc: Placement, layers: int, n: int, capacity: int | None
) -> list[str]:
    """What the estimate says about where Ollama puts the layers (``n`` with the output layer)."""
    notes = []
    if capacity is None and run.num_gpu is None:
        notes.append("no GPU memory given: Ollama's placement is taken as every layer on the GPU")
    elif run.num_gpu is None and layers < n:
        notes.append(
            f"Ollama offloads {layers}/{n} layers (it predicts {plc.total / 2**30:.1f} GiB for "
            "all of them); the rest run on the CPU"
        )
    elif run.num_gpu is not None and layers > plc.layers and capacity is not None:
        notes.append(
            f"num_gpu {layers}: more layers than Ollama predicts fit ({plc.layers}); it loads them "
            "anyway and may run out of memory"
        )
    if run.pp > 1 and capacity is not None:
        notes.append(
            f"Ollama loads the model on {len(plc.split)} of the {run.pp} GPUs, layers split "
            f"{','.join(str(k) for k in plc.split)} (--tensor-split)"
        )
    return notes
