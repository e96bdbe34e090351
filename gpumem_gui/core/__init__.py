"""The pure estimation core: no Qt, no NVML, no plotting (enforced by import-linter).

This package is the core's public API; the window (``gpumem_gui.ui``), the CLI and the app import from here
only, never from the subpackages (an import-linter contract). The subpackages, from the bottom up:

* ``spec``: what a model is (:class:`ModelSpec` and its architecture traits), its exact parameter tensors,
  its KV-cache geometry, and how it splits over GPUs;
* ``results``: what an estimate is (components with explanations, phases, GPUs) and the per-process
  overheads;
* ``readers``: every input that describes a model (``config.json`` per architecture, safetensors and GGUF
  headers, the catalog, the Hub); the only place that knows architectures by name;
* ``formats``: weight formats and KV-cache dtypes, in bytes;
* ``replay``: the symbolic PyTorch runtime and the one transformers forward that inference and training
  replay;
* ``runtimes``: one module per inference engine (transformers, vLLM, SGLang, llama.cpp, Ollama) behind one
  protocol;
* ``training``: the training run, its framework/sharding profiles and the training estimate;
* ``fit``: verdicts against GPUs, the solvers, sweeps and the JSON documents;
* ``observed``: what a GPU said (an OOM message, nvidia-smi, PyTorch's memory report, an engine's memory
  lines, a memory snapshot pickle), read into :class:`ObservedMemory` records in bytes.

Python API::

    from gpumem_gui.core import load_model, estimate_inference, make_run

    m = load_model("meta-llama/Llama-3.1-8B")  # catalog id, config.json, folder, .safetensors, .gguf, hub id
    m.params.total                                 # exact parameter count (tied weights once)
    est = estimate_inference(m.spec, make_run(batch=4, seq=8192))
    est.peak_bytes, est.components

    from gpumem_gui.core import read_observed

    read_observed(pasted_text).records[0].stated()  # {"total_bytes": ..., "allocated_bytes": ...}

Bad input raises :class:`GpumemInputError` with one line naming the file/field and the problem.
"""

from gpumem_gui.core.cancel import Superseded, cancellable
from gpumem_gui.core.diagnosis.document import DIAGNOSIS_SCHEMA, OBSERVED_KEYS, diagnosis_document
from gpumem_gui.core.diagnosis.explain import Compared, Diagnosis, Prediction, diagnose
from gpumem_gui.core.errors import GpumemError, GpumemInputError, describe_validation_error, short
from gpumem_gui.core.fields import UI, RunField, command_args, run_fields
from gpumem_gui.core.fit import (
    DEFAULT_MARGIN_BYTES,
    Change,
    FitReport,
    GpuTarget,
    Verdict,
    fit_report,
    maxima_phrases,
    verdicts,
)
from gpumem_gui.core.fit.cluster import (
    ClusterFit,
    ClusterGpu,
    HostRoom,
    PlacedRank,
    Placement,
    cluster_fit,
    cluster_summary,
)
from gpumem_gui.core.fit.documents import (
    ESTIMATE_SCHEMA,
    FIT_SCHEMA,
    cluster_document,
    estimate_document,
    fit_document,
    reported_for,
)
from gpumem_gui.core.fit.sweep import (
    MAX_SWEEP_POINTS,
    POINT_COST_S,
    SWEEP_BUDGET_S,
    SweepPoint,
    check_sweep_size,
    estimate_any,
    evenly_spaced,
    sweep,
)
from gpumem_gui.core.fit.targets import (
    MAX_GPUS,
    catalog_target,
    gpu_target_from_text,
    parse_capacity,
    with_target_arch,
)
from gpumem_gui.core.fit.tracked import CATEGORIES, traced_categories, tracked_breakdown
from gpumem_gui.core.fit.training import fit_training
from gpumem_gui.core.formats import (
    KV_DTYPE_INFO,
    KV_DTYPES,
    WeightBytes,
    WeightFormat,
    engine_kv_dtypes,
    get_weight_format,
    list_weight_formats,
    weight_bytes,
)
from gpumem_gui.core.gpu_memory import GpuMemory
from gpumem_gui.core.imports import (
    ImportedRun,
    command_parsers,
    file_parsers,
    import_command,
    import_file,
    read_config,
)
from gpumem_gui.core.monotone import gallop, largest
from gpumem_gui.core.observed import (
    FIGURES,
    PARTS,
    SOURCE_FORMATS,
    ObservedMemory,
    ObservedProcess,
    ObservedReport,
    latest_record,
)
from gpumem_gui.core.observed.advice import Causes, DiagnosisChange
from gpumem_gui.core.observed.apply import (
    REPLACED_BY,
    apply_calibration,
    calibration_applies,
    calibration_note,
)
from gpumem_gui.core.observed.calibration import (
    Calibration,
    Stack,
    calibration_for,
    calibration_from,
    gpu_identity,
)
from gpumem_gui.core.observed.parts import ObservedPart
from gpumem_gui.core.observed.read import MAX_FILE_BYTES as OBSERVED_MAX_BYTES
from gpumem_gui.core.observed.read import (
    observed_file_bytes,
    read_observed,
    read_observed_bytes,
    read_observed_file,
)
from gpumem_gui.core.readers.catalog import (
    CatalogModel,
    GpuInfo,
    driver_gpu_memory,
    find_gpu,
    find_model,
    load_gpu_catalog,
    load_model_catalog,
    resources_dir,
    search_models,
)
from gpumem_gui.core.readers.hf_config import SUPPORTED_MODEL_TYPES, load_config_file, spec_from_config
from gpumem_gui.core.readers.hub import HubClient, looks_like_hub_id
from gpumem_gui.core.readers.loader import LoadedModel, load_model, set_default_hub_client
from gpumem_gui.core.readers.weights import WeightsInventory
from gpumem_gui.core.results.estimate import Component, Estimate, Explanation, GpuShare, Phase, RankClass
from gpumem_gui.core.results.reported import Reported, reported
from gpumem_gui.core.runtimes.base import Runtime
from gpumem_gui.core.runtimes.inference import RUNTIMES, InferenceRun, estimate_inference, make_run, runtime
from gpumem_gui.core.spec.compressed import describe_compressed
from gpumem_gui.core.spec.cross_attention import cross_attention_layers, cross_cache_bytes
from gpumem_gui.core.spec.encoder import ENCODER_HEADS, TaskHead, make_task_head, with_head
from gpumem_gui.core.spec.kinds import ModelKinds
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.kv import (
    has_compressed_cache,
    kv_bytes_per_token_per_layer,
    kv_cache_bytes_transformers,
)
from gpumem_gui.core.spec.model import MLASpec, ModelSpec, MoESpec, VisionSpec
from gpumem_gui.core.spec.params import ParamCounts, count_params
from gpumem_gui.core.spec.seq2seq import cross_cache_bytes_per_source_token
from gpumem_gui.core.spec.state import (
    describe_linear_attention,
    has_state,
    memory_by_layer_type,
    state_bytes_per_sequence,
    state_bytes_per_sequence_per_layer,
    state_parts_per_sequence,
)
from gpumem_gui.core.training import (
    PRECISION_DOC,
    TrainingRun,
    estimate_training,
    make_training_run,
    training_command,
)
from gpumem_gui.core.training.profiles import resolve as resolve_tricks
from gpumem_gui.core.units import GB, KB, MB, GiB, KiB, MiB, SizeUnit, fmt_bytes, fmt_count

__all__ = [
    "CATEGORIES",
    "DEFAULT_MARGIN_BYTES",
    "DIAGNOSIS_SCHEMA",
    "ENCODER_HEADS",
    "ESTIMATE_SCHEMA",
    "FIGURES",
    "FIT_SCHEMA",
    "GB",
    "KB",
    "KV_DTYPES",
    "KV_DTYPE_INFO",
    "MAX_GPUS",
    "MAX_SWEEP_POINTS",
    "MB",
    "OBSERVED_KEYS",
    "OBSERVED_MAX_BYTES",
    "PARTS",
    "POINT_COST_S",
    "PRECISION_DOC",
    "REPLACED_BY",
    "RUNTIMES",
    "SOURCE_FORMATS",
    "SUPPORTED_MODEL_TYPES",
    "SWEEP_BUDGET_S",
    "UI",
    "Calibration",
    "CatalogModel",
    "Causes",
    "Change",
    "ClusterFit",
    "ClusterGpu",
    "Compared",
    "Component",
    "Diagnosis",
    "DiagnosisChange",
    "Estimate",
    "Explanation",
    "FitReport",
    "GiB",
    "GpuInfo",
    "GpuMemory",
    "GpuShare",
    "GpuTarget",
    "GpumemError",
    "GpumemInputError",
    "HostRoom",
    "HubClient",
    "ImportedRun",
    "InferenceRun",
    "KiB",
    "LoadedModel",
    "MLASpec",
    "MiB",
    "MoESpec",
    "ModelKinds",
    "ModelSpec",
    "ObservedMemory",
    "ObservedPart",
    "ObservedProcess",
    "ObservedReport",
    "ParamCounts",
    "Phase",
    "PlacedRank",
    "Placement",
    "Prediction",
    "RankClass",
    "Reported",
    "RunField",
    "Runtime",
    "SizeUnit",
    "Stack",
    "Superseded",
    "SweepPoint",
    "TaskHead",
    "TrainingRun",
    "Verdict",
    "VisionSpec",
    "WeightBytes",
    "WeightFormat",
    "WeightsInventory",
    "apply_calibration",
    "calibration_applies",
    "calibration_for",
    "calibration_from",
    "calibration_note",
    "cancellable",
    "catalog_target",
    "check_sweep_size",
    "cluster_document",
    "cluster_fit",
    "cluster_summary",
    "command_args",
    "command_parsers",
    "count_params",
    "cross_attention_layers",
    "cross_cache_bytes",
    "cross_cache_bytes_per_source_token",
    "describe_compressed",
    "describe_linear_attention",
    "describe_validation_error",
    "diagnose",
    "diagnosis_document",
    "driver_gpu_memory",
    "engine_kv_dtypes",
    "estimate_any",
    "estimate_document",
    "estimate_inference",
    "estimate_training",
    "evenly_spaced",
    "file_parsers",
    "find_gpu",
    "find_model",
    "fit_document",
    "fit_report",
    "fit_training",
    "fmt_bytes",
    "fmt_count",
    "gallop",
    "get_weight_format",
    "gpu_identity",
    "gpu_target_from_text",
    "has_compressed_cache",
    "has_state",
    "import_command",
    "import_file",
    "kv_bytes_per_token_per_layer",
    "kv_cache_bytes_transformers",
    "largest",
    "latest_record",
    "list_weight_formats",
    "load_config_file",
    "load_gpu_catalog",
    "load_model",
    "load_model_catalog",
    "looks_like_hub_id",
    "make_run",
    "make_task_head",
    "make_training_run",
    "maxima_phrases",
    "memory_by_layer_type",
    "model_kinds",
    "observed_file_bytes",
    "parse_capacity",
    "read_config",
    "read_observed",
    "read_observed_bytes",
    "read_observed_file",
    "reported",
    "reported_for",
    "resolve_tricks",
    "resources_dir",
    "run_fields",
    "runtime",
    "search_models",
    "set_default_hub_client",
    "short",
    "spec_from_config",
    "state_bytes_per_sequence",
    "state_bytes_per_sequence_per_layer",
    "state_parts_per_sequence",
    "sweep",
    "traced_categories",
    "tracked_breakdown",
    "training_command",
    "verdicts",
    "weight_bytes",
    "with_head",
    "with_target_arch",
]
