"""What every inference runtime shares: the :class:`Runtime` protocol, and the weights each rank loads.

A runtime (one module per engine: :mod:`.transformers`, :mod:`.vllm`, :mod:`.llamacpp`) says which weight
formats and KV dtypes it takes, checks a run, estimates it, tells a fit what a GPU must hold and which levers
it has, and writes its own launch command. Nothing outside these modules branches on the engine's name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats import WeightBytes, WeightFormat, list_weight_formats, weight_bytes
from gpumem_gui.core.readers.weights import WeightsInventory
from gpumem_gui.core.replay.buffers import buffers_bytes
from gpumem_gui.core.results.estimate import Component, Estimate, Explanation, GpuShare, Phase
from gpumem_gui.core.runtimes import refusals
from gpumem_gui.core.spec.kinds import CompressedAttention, CrossAttention, LayerKind, RecurrentState
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.parallel import Degrees, stage_layers
from gpumem_gui.core.spec.params import COMPONENTS, count_params

if TYPE_CHECKING:
    from gpumem_gui.core.gpu_memory import GpuMemory
    from gpumem_gui.core.runtimes.run import InferenceRun

# one candidate change a runtime offers a fit: (rank, kind, description, the run fields it sets)
Lever = tuple[int, str, str, dict[str, object]]


class Runtime(ABC):
    """One inference engine. Subclasses set the attributes and implement :meth:`estimate` and
    :meth:`command`; the other methods are the defaults most engines share."""

    name: str = ""
    label: str = ""
    gguf: bool = False  # loads GGUF files (llama.cpp) rather than safetensors formats
    fallback_format: str = "nf4"  # the common 4-bit format a fit names when no format fits
    # the estimate depends on the GPU's memory (vLLM's KV pool); which of its two totals (GpuMemory) the
    # engine reads is each engine's estimate's own: vLLM, SGLang's pool and Ollama's placement read CUDA's,
    # SGLang's GPU-size defaults nvidia-smi's; a fit verdict compares with CUDA's (fit.GpuTarget.available)
    sizes_from_capacity: bool = False
    even_stages: bool = True  # pp stages take equal layer counts (Ollama splits them by free memory)
    # What this engine's profile models, by kind (spec/kinds.py): the model kinds it serves, the recurrent
    # mixers whose per-sequence state it sizes, whether it holds cross-attention layers' vision cache and
    # attention layers of several head shapes (Gemma 4). Checks ask these, never the engine's name.
    model_kinds: frozenset[str] = frozenset({"decoder", "hybrid"})
    state_mixers: frozenset[str] = frozenset()
    state_tp: bool = False  # shards the state layers by (attention) tensor parallelism (SGLang's mamba pool)
    cross_attention_cache: bool = False
    mixed_head_shapes: bool = False
    # DeepSeek-V4's compressed attention (spec/compressed.py): whether this engine's profile models its cache
    compressed_attention: bool = False
    # the one-line refusals of what this engine does not run or gpumem does not model for it (refusals.py)
    cross_attention_refusal: str = ""
    state_refusals: Mapping[str, str] = MappingProxyType({})
    compressed_attention_refusal: str = refusals.COMPRESSED_ATTENTION  # after "<engine> <mode>: "

    def for_run(self, run: InferenceRun) -> Runtime:
        """The profile that sizes ``run``: this one, or the one of the engine version the run names (Ollama's
        ``ollama_version``); its capabilities decide what the run's model may be."""
        return self

    def serves(self, model_kind: str) -> bool:
        """Whether this engine runs a model of ``model_kind`` (ModelKinds.model)."""
        return model_kind in self.model_kinds

    def supports(self, kind: LayerKind) -> bool:
        """Whether this engine's profile models layers of ``kind``: a recurrent state when it sizes that
        mixer's pool, cross-attention when it keeps the vision cache; every kind of attention."""
        if isinstance(kind, RecurrentState):
            return kind.mixer in self.state_mixers
        if isinstance(kind, CrossAttention):
            return self.cross_attention_cache
        if isinstance(kind, CompressedAttention):
            return self.compressed_attention
        return True

    def check_layer_kinds(self, spec: ModelSpec, mode: str = "inference") -> None:
        """One line refusing a model whose compressed attention (DeepSeek-V4) this engine does not model,
        saying what the engine itself does with it."""
        if not all(self.supports(k) for k in model_kinds(spec).of(CompressedAttention)):
            raise GpumemInputError(f"{self.name} {mode}: {self.compressed_attention_refusal}", field="model")

    def check_state(self, spec: ModelSpec, pp: int) -> None:  # noqa: B027 (a hook: none by default)
        """This engine's own limits on a hybrid whose mixers it supports (one-line errors)."""

    def state_refusal(self, kind: RecurrentState) -> str:
        """The one-line error for a state kind this engine, which sizes some others, does not model: the
        engine's own reason (:attr:`state_refusals`), else a generic line."""
        return self.state_refusals.get(kind.mixer) or (
            f"{self.name}: the recurrent state of {kind.mixer} layers is not modelled for this engine; use "
            "the transformers engine"
        )

    def formats(self) -> list[WeightFormat]:
        """The weight formats this engine loads."""
        return [f for f in list_weight_formats() if f.id.startswith("gguf-") == self.gguf]

    def expresses(
        self, spec: ModelSpec, run: InferenceRun, source: str, checkpoint: str | None = None
    ) -> str | None:
        """Whether this engine's own command can express ``run`` on the model opened from ``source`` (a
        Hugging Face id, a path) published in weight format ``checkpoint`` (None: a float checkpoint, or
        unknown): None when it can, else the reason in one line. By default an engine loads the weight
        formats :meth:`formats` lists (and the model's own files)."""
        name = self.label or self.name
        gguf_file = source.lower().endswith(".gguf")
        if run.weights == "file":
            if gguf_file == self.gguf:
                return None
            return f"{name} loads {'a GGUF file' if self.gguf else 'Hugging Face weights'}, not {source}"
        if any(f.id == run.weights for f in self.formats()):
            return None
        return (
            f"{name} loads {'GGUF' if self.gguf else 'Hugging Face (safetensors)'} weights, not {run.weights}"
        )

    def quantizes_experts(self, run: InferenceRun) -> bool:
        """Whether the run's weight format quantizes routed experts on this engine."""
        return True

    def check(self, spec: ModelSpec, run: InferenceRun) -> list[str]:
        """Engine-specific checks: errors raise :class:`GpumemInputError`, soft problems are returned."""
        return []

    @abstractmethod
    def estimate(
        self,
        spec: ModelSpec,
        run: InferenceRun,
        warnings: tuple[str, ...],
        gpu: GpuMemory | None,
        wb: WeightBytes,
    ) -> Estimate:
        """The estimate of ``spec`` under ``run`` on one GPU of ``gpu``'s memory (None: unknown)."""

    def needed_bytes(self, est: Estimate, share: GpuShare) -> int:
        """What one GPU must have for the run (vLLM: its whole budget)."""
        return share.total_bytes

    def admits(self, est: Estimate) -> bool:
        """Whether the engine starts and runs the batch at all, beyond the bytes (vLLM: enough KV pages)."""
        return True

    def max_concurrency(self, est: Estimate) -> float | None:
        return None

    def kv_cache_dtype(self, spec: ModelSpec, run: InferenceRun) -> str:
        """The KV cache's element type(s) this engine really uses for ``run``, as a report states them (by
        default the run's own: ``auto`` is the compute dtype)."""
        return run.kv_dtype_resolved

    def batch_limit(self, run: InferenceRun) -> tuple[int, str] | None:
        """The most sequences this engine runs at once under ``run``'s own settings, and why (None: the run's
        batch itself is that number); a fit's largest batch stops there, since more sequences wait in a queue
        and take no memory."""
        return None

    def fit_levers(self, spec: ModelSpec, run: InferenceRun, fits: Callable[..., bool]) -> list[Lever]:
        """Changes only this engine has (llama.cpp: layers left on the CPU); ``fits(**update)``."""
        return []

    @abstractmethod
    def command(self, model: str, run: InferenceRun, est: Estimate) -> str:
        """The engine's own launch command (or load call) for the run."""

    # Run fields this engine's command cannot say, and why (data per engine; the command names each one set
    # away from its default in a comment line, :meth:`unsaid_line`, and the import leaves it at its default)
    unexpressed: tuple[tuple[str, str], ...] = ()

    def unsaid_line(self, run: InferenceRun) -> str | None:
        """``# gpumem: ...`` naming the run's values that :attr:`unexpressed` says the command cannot carry
        (None when all are at their defaults); a shell comment, which every importer skips."""
        fields = type(run).model_fields
        by_why: dict[str, list[str]] = {}  # fields that share a reason are named together
        for name, why in self.unexpressed:
            if getattr(run, name) != fields[name].default:
                by_why.setdefault(why, []).append(f"{name} {getattr(run, name)}")
        said = [f"{', '.join(names)} ({why})" for why, names in by_why.items()]
        return f"# gpumem, not in this command: {'; '.join(said)}" if said else None

    def with_unsaid(self, run: InferenceRun, lines: list[str]) -> str:
        """The command's lines, after the comment line of what it cannot say (if any)."""
        note = self.unsaid_line(run)
        return "\n".join([note, *lines] if note else lines)


# the formats a PyTorch server (vLLM, SGLang) loads a float checkpoint in: its --dtype, the compute dtype
FLOAT_WEIGHTS = ("bf16", "fp16", "fp32")
# --dtype value -> compute dtype, the same choices in both servers (vllm/config/model.py ModelDType; SGLang
# python/sglang/srt/server_args.py --dtype: auto, half, float16, bfloat16, float, float32; "auto" is the
# checkpoint's dtype); the first spelling of each is the one a command gpumem writes uses
SERVER_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "half": "fp16", "float": "fp32"}


def server_weights_refusal(
    label: str, run: InferenceRun, checkpoint: str | None, online: dict[str, str]
) -> str | None:
    """Why a PyTorch server (vLLM, SGLang) cannot load the run's weights as the run has them (None: it can).
    Both cast a float checkpoint to ``--dtype`` (vllm/config/model.py ``_verify_quantization``; SGLang's
    ``configs/model_config.py`` copy of it), quantize on load only by the ``--quantization`` methods in
    ``online`` (method -> weight format), and read any other format from a checkpoint published in it
    (``checkpoint``: the model's own quantized format, None for a float checkpoint), which it loads as
    published whatever ``--dtype`` says (vllm/config/model.py ``_verify_quantization``)."""
    w = run.weights
    if w in ("file", checkpoint):
        return None
    if checkpoint is not None:  # a quantized checkpoint loads as published (its quantization_config)
        return (
            f"{label} loads this checkpoint in its published format {checkpoint} (its quantization_config), "
            f"not as {w}"
        )
    if w == run.compute_dtype or w in online.values():
        return None
    if w in FLOAT_WEIGHTS:
        return (
            f"{label} casts float weights to --dtype: weights {w} with compute dtype {run.compute_dtype} "
            f"are loaded as {run.compute_dtype} (set the weights to {run.compute_dtype})"
        )
    ways = " or ".join(dict.fromkeys(online.values()))
    return (
        f"{label} quantizes on load only to {ways}; {w} weights come from a checkpoint published in that "
        "format (open that checkpoint)"
    )


def server_dtype_args(run: InferenceRun, online: dict[str, str]) -> list[str]:
    """``--quantization`` (a method that quantizes on load) and ``--dtype`` for a PyTorch server's command:
    the dtype is written for a float or on-load-quantized checkpoint, and left to the server's ``auto`` (the
    checkpoint's) only for a checkpoint in its own quantized format at the default bf16."""
    args = []
    if run.weights in online.values() and run.weights not in FLOAT_WEIGHTS:
        args += ["--quantization", next(k for k, v in online.items() if v == run.weights)]
    if run.compute_dtype != "bf16" or run.weights in (run.compute_dtype, *online.values()):
        args += ["--dtype", next(k for k, v in SERVER_DTYPES.items() if v == run.compute_dtype)]
    return args


def component(key: str, label: str, n: int, formula: str, source: str, **inputs: object) -> Component:
    """One breakdown entry (bytes clamped at 0) with its formula, inputs and source."""
    return Component(
        key=key,
        label=label,
        bytes=max(0, int(n)),
        explain=Explanation(formula=formula, inputs=inputs, source=source),
    )


def weights_per_rank(wb: WeightBytes, tp: int) -> int:
    """Bytes one tensor-parallel rank loads: everything divided but the (replicated) norms."""
    norms = wb.by_component.get("norms", 0)
    return round((wb.total_bytes - norms) / tp + norms)


def weights_from_files(spec: ModelSpec, inv: WeightsInventory) -> WeightBytes:
    """The exact bytes of the model's own files (safetensors/GGUF headers), in the shape formulas give."""
    by = dict.fromkeys(COMPONENTS, 0)
    per_layer = [0] * spec.num_layers
    for t in inv.tensors:
        by[t.component if t.component in by else "embedding_extra"] += t.nbytes
        if t.layer is not None and t.layer < spec.num_layers:
            per_layer[t.layer] += t.nbytes
    params = count_params(spec).total
    return WeightBytes(
        format="file",
        total_bytes=inv.total_bytes,
        params=params,
        quantized_params=0,
        quantized_bytes=0,
        by_component=by,
        per_layer=tuple(per_layer),
        by_storage=dict(inv.bytes_by_dtype),
        bits_per_param=inv.total_bytes * 8 / params if params else 0.0,
        explain=Explanation(
            formula="sum of every tensor's bytes in the file headers (the files win over any formula)",
            inputs={"files": len(inv.files), "tensors": inv.tensor_count, "quantization": inv.quantization},
            source=f"{inv.format} headers of {inv.source}",
        ),
    )


def run_weight_bytes(
    spec: ModelSpec, run: InferenceRun, quantize_experts: bool, file_weights: WeightsInventory | None = None
) -> WeightBytes:
    """Weight bytes of the run: the files' exact bytes for ``weights='file'``, else the format's formula."""
    if run.weights == "file":
        if file_weights is None:
            from gpumem_gui.core.errors import GpumemInputError

            raise GpumemInputError(
                "'file' needs a model opened from .safetensors or .gguf files", field="weights"
            )
        return weights_from_files(spec, file_weights)
    return weight_bytes(spec, run.weights, compute_dtype_bytes=run.dt, quantize_experts=quantize_experts)


def load_phase(
    spec: ModelSpec, run: InferenceRun, quantize_experts: bool, degrees: Degrees, stage: int, wb: WeightBytes
) -> tuple[Component, Phase]:
    """The weights component of one rank of ``stage`` and the load phase that holds only it."""
    if run.weights == "file":  # the files' own bytes (the inventory is no cache key)
        return _build_load_phase(spec, run.weights, degrees, stage, wb)
    return _format_load_phase(spec, run.weights, run.dt, quantize_experts, degrees, stage)


@lru_cache(maxsize=1024)
def _format_load_phase(
    spec: ModelSpec, weights: str, dt: int, quantize_experts: bool, degrees: Degrees, stage: int
) -> tuple[Component, Phase]:
    """:func:`load_phase` of a weight format: it depends only on the spec, the format and the split, so
    every estimate of them shares one (immutable) result."""
    wb = weight_bytes(spec, weights, compute_dtype_bytes=dt, quantize_experts=quantize_experts)
    return _build_load_phase(spec, weights, degrees, stage, wb)


def _build_load_phase(
    spec: ModelSpec, weights: str, degrees: Degrees, stage: int, wb: WeightBytes
) -> tuple[Component, Phase]:
    comp = _weights_component(spec, weights, degrees, stage, wb)
    return comp, Phase(name="load", peak_bytes=comp.bytes, components=(comp,))


def _weights_component(spec: ModelSpec, weights: str, run: Degrees, stage: int, wb: WeightBytes) -> Component:
    layers = stage_layers(spec, run.pp, stage, run.remainder)
    layer_bytes = sum(wb.per_layer[i] for i in layers)
    outside = wb.total_bytes - sum(wb.per_layer)  # embeddings, final norm, lm_head, vision
    # embeddings (and vision) on the first stage, final norm + lm_head on the last; tied heads share the table
    first, last = stage == 0, stage == run.pp - 1
    emb = (
        wb.by_component.get("embedding", 0)
        + wb.by_component.get("position_embedding", 0)
        + wb.by_component.get("embedding_extra", 0)
        + wb.by_component.get("vision", 0)
    )
    head = outside - emb
    stage_outside = (emb if first else 0) + (head if last else 0)
    if spec.tie_word_embeddings and last and not first:
        stage_outside += wb.by_component.get("embedding", 0)  # the last stage needs its own copy of the table
    sharded = layer_bytes + stage_outside
    per_rank = _tp_share(spec, run, wb, layers, sharded)
    return Component(
        key="weights",
        label=f"weights ({weights})",
        bytes=per_rank + (buffers_bytes(spec) if first else 0),
        explain=Explanation(
            formula=wb.explain.formula
            + (f"; split over tp={run.tp} x pp={run.pp}" if run.tp * run.pp > 1 else "")
            + "; + rotary buffers",
            inputs={
                **wb.explain.inputs,
                "tp": run.tp,
                "pp": run.pp,
                "ep": run.ep,
                "stage_layers": len(layers),
            },
            source=wb.explain.source,
        ),
    )


def _tp_share(spec: ModelSpec, run: Degrees, wb: object, layers: range, stage_bytes: int) -> int:
    """Bytes of one TP/EP rank: linears and embeddings divided, norms replicated, experts over ep x tp."""
    if run.tp == 1 and run.ep == 1:
        return stage_bytes
    by = wb.by_component  # type: ignore[attr-defined]
    total = wb.total_bytes  # type: ignore[attr-defined]
    frac = stage_bytes / total if total else 0
    norms = by.get("norms", 0) * frac
    experts = by.get("routed_experts", 0) * frac
    rest = stage_bytes - norms - experts
    expert_ranks = run.ep * (run.tp if run.ep == 1 else 1)
    return round(rest / run.tp + norms + experts / expert_ranks)
