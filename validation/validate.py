"""Validation report: gpumem's inference and training estimates against measured and published numbers.

Run ``.venv/bin/python validation/validate.py [--out docs/validation.md] [--subset] [--refresh-peers]``
(``make validate`` writes ``docs/validation.md``).

* (a) every inference point of the PyTorch-measured grids (``groundtruth.json`` and
  ``tests/reference/extra/grid_infer.json``): our ``peak_bytes`` against the measured peak, our
  ``kv_cache_bytes`` against the measured DynamicCache;
* (b) every inference point of ``published/published.json`` we can reproduce, through the curated
  :data:`PUBLISHED` mapping below (which model spec, which run, which of our numbers is the published one);
  the others are listed with the reason;
* (c) optional peers (llm-analysis, accelerate's meta-model size) on the grid points, read from
  ``validation/peers.json``, which ``--refresh-peers`` rebuilds in scratch virtual environments (never the
  project's).

* (d) every training point of both grids (``groundtruth.json`` and ``extra/grid_train.json``): the step's
  peak and each phase's peak (forward / backward / optimizer) against ours, and the published fine-tuning
  points we can reproduce, through :data:`PUBLISHED_TRAINING` (full fine-tune, LoRA, QLoRA; torchtune,
  torchtitan, fsdp_qlora, HF docs; two fits/OOM bounds and one largest-context bound).

The output is deterministic: rows are sorted and nothing but the versions block depends on the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # a source tree that was never installed
    sys.path.insert(0, str(REPO))

from gpumem_gui.core.formats import gguf_plan  # noqa: E402
from gpumem_gui.core.monotone import gallop  # noqa: E402
from gpumem_gui.core.readers.catalog import find_gpu, find_model  # noqa: E402
from gpumem_gui.core.readers.hf_config import load_config_file, spec_from_config  # noqa: E402
from gpumem_gui.core.reference_points import inference_run_for_point, training_run_for_point  # noqa: E402
from gpumem_gui.core.results.estimate import Estimate  # noqa: E402
from gpumem_gui.core.runtimes.inference import InferenceRun, estimate_inference, make_run  # noqa: E402
from gpumem_gui.core.spec.model import ModelSpec  # noqa: E402
from gpumem_gui.core.training import (  # noqa: E402
    TrainingRun,
    estimate_training,
    make_training_run,
    simulate_rank,
)

MiB = 1 << 20
GiB = 1 << 30
REASON_THRESHOLD = 0.05  # rows off by more than this carry a one-line reason
EXTRA = REPO / "tests" / "reference" / "extra"
PEERS_FILE = Path(__file__).resolve().parent / "peers.json"
PEERS_VENV = Path(os.environ.get("GPUMEM_PEERS_VENV", "/tmp/peers-venv"))
GT_VENV = Path(os.environ.get("GPUMEM_GT_VENV", "/tmp/gt-venv"))


def reference_dir() -> Path:
    """``$GPUMEM_REFERENCE``, else ``../shared/reference`` beside the checkout, else the vendored copy."""
    env = os.environ.get("GPUMEM_REFERENCE")
    if env:
        return Path(env)
    shared = REPO.parent / "shared" / "reference"
    if (shared / "groundtruth.json").is_file():
        return shared
    return REPO / "tests" / "reference"


def _config_dirs() -> tuple[Path, ...]:
    return (reference_dir() / "configs", REPO / "tests" / "reference" / "configs", EXTRA / "configs")


def config_path(name: str) -> Path:
    for d in _config_dirs():
        if (d / f"{name}.json").is_file():
            return d / f"{name}.json"
    raise FileNotFoundError(f"no config {name}.json in {', '.join(str(d) for d in _config_dirs())}")


# ---- rows ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One comparison: a measured (or published) number and ours for the same setup."""

    table: str  # "grid" | "llama.cpp" | "vllm"
    kind: str  # what kind of number (summary lines are per kind)
    sort_key: tuple
    setup: str
    measured: float
    ours: float
    unit: str = "bytes"  # bytes | tokens | blocks | x
    bytes_per_unit: float = 1.0  # to express an error in GiB (tokens -> KV bytes)
    metric: str = ""  # the published line, verbatim
    reason: str = ""
    source: str = ""
    kv_measured: int | None = None
    kv_ours: int | None = None
    phases: tuple[tuple[float, float], ...] = ()  # training: (measured, ours) per phase

    @property
    def err(self) -> float:
        return (self.ours - self.measured) / self.measured if self.measured else math.inf

    @property
    def err_gib(self) -> float:
        return (self.ours - self.measured) * self.bytes_per_unit / GiB


@dataclass
class Report:
    grid: list[Row] = field(default_factory=list)
    published: list[Row] = field(default_factory=list)
    mapping: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    not_reproduced: list[tuple[str, str, str, str]] = field(default_factory=list)
    train: list[Row] = field(default_factory=list)
    train_phases: list[Row] = field(default_factory=list)
    train_published: list[Row] = field(default_factory=list)
    train_mapping: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    train_bounds: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    peers: list[dict] = field(default_factory=list)
    train_peers: list[dict] = field(default_factory=list)
    peers_note: str = ""
    versions: dict[str, str] = field(default_factory=dict)


# ---- (a) the measured grids -------------------------------------------------------------------------------

MODE_LOGITS = {"infer_prefill": "all", "infer_prefill_last_logit": "last"}


def grid_points(subset: bool = False) -> list[tuple[str, dict]]:
    """Inference points of both grids as (file label, point); ``subset``: a few small, fast ones."""
    out: list[tuple[str, dict]] = []
    for label, path in (
        ("groundtruth.json", reference_dir() / "groundtruth.json"),
        ("extra/grid_infer.json", EXTRA / "grid_infer.json"),
    ):
        for p in json.loads(path.read_text())["grid"]:
            if p["mode"] in MODE_LOGITS and "peak_bytes" in p:
                out.append((label, p))
    if subset:
        keep = {
            ("Qwen__Qwen2.5-0.5B", 1, 512, "sdpa"),
            ("meta-llama__Llama-3.2-1B", 1, 512, "eager"),
            ("openai-community__gpt2", 4, 1024, "sdpa"),
        }
        out = [(f, p) for f, p in out if (p["model"], p["batch"], p["seq"], p["attn_implementation"]) in keep]
    return out


def _short(model: str) -> str:
    return model.split("__", 1)[-1]


def grid_setup(p: dict) -> str:
    mode = "all logits" if p["mode"] == "infer_prefill" else "last logit"
    attn = p.get("attn_implementation_used") or p["attn_implementation"]
    return f"{_short(p['model'])} · prefill, {mode} · b{p['batch']} s{p['seq']} · {attn}"


def _grid_reason(p: dict, est: Estimate) -> str:
    """Where the gap is, from the measured breakdown and our components."""
    bd = p.get("peak_breakdown_bytes", {})
    w_meas = bd.get("Parameter", 0) + bd.get("Buffer", 0)
    w_ours = est.component("weights").bytes  # type: ignore[union-attr]
    act_meas = bd.get("Activation", 0) + bd.get("Other", 0)
    act_ours = est.peak_bytes - w_ours
    return (
        f"weights ours {w_ours / GiB:.3f} vs measured {w_meas / GiB:.3f} GiB; activations at the peak ours "
        f"{act_ours / GiB:.3f} vs measured {act_meas / GiB:.3f} GiB ({est.phases[est.peak_phase].note})"
    )


def grid_rows(subset: bool = False) -> list[Row]:
    rows = []
    specs: dict[str, ModelSpec] = {}
    for label, p in grid_points(subset):
        spec = specs.get(p["model"]) or load_config_file(config_path(p["model"]))
        specs[p["model"]] = spec
        est = estimate_inference(spec, inference_run_for_point(p))
        row = Row(
            table="grid",
            kind="peak live tensors (MemTracker = max_memory_allocated)",
            sort_key=(p["model"], p["mode"], p["batch"], p["seq"], p["attn_implementation"]),
            setup=grid_setup(p),
            measured=p["peak_bytes"],
            ours=est.peak_bytes,
            source=label,
            kv_measured=p.get("kv_cache_bytes"),
            kv_ours=est.kv_cache_bytes,
        )
        if abs(row.err) > REASON_THRESHOLD:
            row = _replace(row, reason=_grid_reason(p, est))
        rows.append(row)
    return sorted(rows, key=lambda r: r.sort_key)


def _replace(row: Row, **upd: object) -> Row:
    return Row(**{**row.__dict__, **upd})


# ---- (b) published points ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ctx:
    """What a reason function may look at."""

    spec: ModelSpec
    run: InferenceRun
    est: Estimate
    capacity: int | None
    measured: float
    ours: float
    unit_bytes: float = 1.0  # bytes one unit of the measured number stands for (tokens -> KV bytes)


Reason = Callable[[Ctx], str]


@dataclass(frozen=True)
class Metric:
    quote: str  # verbatim text of the published quote; its last number (and unit) is the measured value
    kind: str
    ours: str  # which of our numbers: see OURS
    reason: Reason | None = None  # why, for rows off by more than REASON_THRESHOLD
    note: str = ""  # shown in the reason column whatever the error


@dataclass(frozen=True)
class Mapping:
    id: str
    model: str  # catalog id, or "config:<name>" for a config in tests/reference
    twin: str  # "" when the published model itself is used; else why the spec stands for it
    run: dict
    capacity: str | float | None  # GPU catalog id, or GiB the log states; None: not a vLLM run
    metrics: tuple[Metric, ...]
    assumptions: str = ""


def _c(key: str) -> Callable[[Estimate], float]:
    return lambda e: e.component(key).bytes  # type: ignore[union-attr]


OURS: dict[str, tuple[str, Callable[[Estimate], float]]] = {
    "weights": ("weights component (on the GPU)", _c("weights")),
    "cpu_bytes": ("facts.cpu_bytes (weights left in host memory)", lambda e: e.facts["cpu_bytes"]),  # type: ignore[dict-item]
    "all_weights": (
        "weights + cpu_bytes (the whole model)",
        lambda e: _c("weights")(e) + e.facts["cpu_bytes"],
    ),  # type: ignore[operator]
    "kv_cache": ("kv_cache component", _c("kv_cache")),
    "compute_buffer": ("compute_buffer component", _c("compute_buffer")),
    "activations": ("activations component", _c("activations")),
    "non_torch": ("non_torch component", _c("non_torch")),
    "kv_pool_bytes": ("facts.kv_pool_bytes", lambda e: e.facts["kv_pool_bytes"]),  # type: ignore[dict-item]
    "kv_tokens": ("facts.kv_tokens", lambda e: e.facts["kv_tokens"]),  # type: ignore[dict-item]
    "gpu_blocks": ("facts.kv_tokens / 16", lambda e: e.facts["kv_tokens"] / 16),  # type: ignore[operator]
    "max_concurrency": ("facts.max_concurrency", lambda e: e.facts["max_concurrency"]),  # type: ignore[dict-item]
}

K_LC_MODEL = "llama.cpp model buffer (weights)"
K_LC_HOST = "llama.cpp host buffer (token_embd)"
K_LC_SIZE = "GGUF model size (all tensors)"
K_LC_KV = "llama.cpp KV buffer"
K_LC_COMPUTE = "llama.cpp compute buffer"
K_V_WEIGHTS = "vLLM weights (torch allocated)"
K_V_ACT = "vLLM profiled activation peak"
K_V_NONTORCH = "vLLM non-torch memory"
K_V_KVBYTES = "vLLM KV cache bytes"
K_V_TOKENS = "vLLM KV tokens"
K_V_BLOCKS = "vLLM # GPU blocks"
K_V_CONC = "vLLM max concurrency"


def _compute_reason(note: str = "") -> Reason:
    def reason(c: Ctx) -> str:
        r, s = c.run, c.spec
        ub = min(r.n_ubatch, r.batch * r.tokens)
        terms = {"logits": ub * s.vocab_size * 4}
        terms["KQ scores"] = 0 if r.flash_attn else ub * r.batch * r.tokens * s.num_attention_heads * 4
        terms["FFN/hidden"] = c.ours - sum(terms.values())
        parts = " + ".join(f"{k} {v / MiB:.1f}" for k, v in terms.items() if v)
        big_name, big = max(terms.items(), key=lambda kv: kv[1])
        text = f"our compute-buffer formula is a calibrated approximation: a sum ({parts} MiB)"
        if c.measured < c.ours:
            text += (
                f"; the log ({c.measured / MiB:.1f} MiB) is nearer our largest single term ({big_name} "
                f"{big / MiB:.1f} MiB) than the sum: ggml's graph allocator frees each stage's tensors and "
                "reuses the memory, so the buffer is a max over graph stages, not a sum of them"
            )
        else:
            text += f"; the log is {(c.measured - c.ours) / MiB:.0f} MiB larger, so a graph stage is missing"
        return text + (f"; {note}" if note else "")

    return reason


def _mix_reason(c: Ctx) -> str:
    """Which layer tensors our quantization mix bumps above the base type (the usual GGUF size gap)."""
    plan = [t for t in gguf_plan(c.spec, c.run.weights) if t.layer is not None]
    by_type: dict[str, int] = {}
    for t in plan:
        by_type[t.ggml_type] = by_type.get(t.ggml_type, 0) + t.nbytes
    base = max(by_type, key=lambda k: by_type[k])
    bumped: dict[str, int] = {}
    for t in plan:
        if t.ggml_type != base and t.ggml_type.startswith(("Q6", "Q8")):
            role = t.name.split(".")[2]
            bumped[role] = bumped.get(role, 0) + t.nbytes
    top = ", ".join(f"{k} {v / MiB:.0f} MiB" for k, v in sorted(bumped.items(), key=lambda kv: -kv[1])[:3])
    return (
        f"ours is {(c.ours - c.measured) / MiB:+.0f} MiB; our mix (current llama-quantize rules) keeps these "
        f"layer tensors above {base}: {top}. A file made by another llama.cpp version can differ in these "
        "choices; its header (gpumem inspect x.gguf) gives the exact bytes"
    )


def _vllm_act_reason(note: str) -> Reason:
    def reason(c: Ctx) -> str:
        ex = c.est.component("activations").explain  # type: ignore[union-attr]
        return (
            f"ours = {ex.inputs['T']} tokens x (2h + max(3F, qkv + q)) x 2 B + sampler "
            f"{ex.inputs['max_num_seqs']} x vocab x 10 B (a formula, not the profiled forward); {note}"
        )

    return reason


def _vllm_pool_reason(c: Ctx) -> str:
    """Implied non-KV memory of the log against ours, from the budget."""
    e = c.est
    budget = int(e.facts["budget_bytes"])  # type: ignore[arg-type]
    implied_non_kv = budget - c.measured * c.unit_bytes
    ours_non_kv = budget - int(e.facts["kv_pool_bytes"])  # type: ignore[arg-type]
    parts = ", ".join(
        f"{k} {e.component(k).bytes / GiB:.2f}"  # type: ignore[union-attr]
        for k in ("weights", "activations", "non_torch", "cudagraph")
    )
    return (
        f"budget {budget / GiB:.2f} GiB (gpu_memory_utilization {c.run.gpu_memory_utilization} x "
        f"{(c.capacity or 0) / GiB:.2f} GiB); the log implies {implied_non_kv / GiB:.2f} GiB outside the KV "
        f"pool, ours is {ours_non_kv / GiB:.2f} GiB ({parts} GiB)"
    )


def _l40s_reason(c: Ctx) -> str:
    return (
        _vllm_pool_reason(c) + "; the log states neither gpu_memory_utilization nor the batch limits (0.9 "
        "and our defaults assumed) nor its activation/non-torch split, so the gap cannot be pinned on one "
        "term (vLLM v1 of Apr 2025 compiles the model with torch.compile; its profile may differ from v0's)"
    )


PUBLISHED: tuple[Mapping, ...] = (
    Mapping(
        id="inf-llamacpp-openllama7b-f16",
        model="meta-llama/Llama-2-7b-hf",
        twin="open_llama_7b_v2 has Llama-2-7b's dimensions (4096 hidden, 32 layers, 32 heads MHA, FFN 11008, "
        "vocab 32000, untied); the 250 MiB token_embd (32000 x 4096 x 2 B) confirms the vocab",
        run={
            "engine": "llama.cpp",
            "weights": "gguf-F16",
            "seq": 2048,
            "kv_dtype": "f16",
            "n_batch": 512,
            "n_ubatch": 512,
            "flash_attn": False,
        },
        capacity=None,
        metrics=(
            Metric("CUDA0 buffer size = 12603.02 MiB", K_LC_MODEL, "weights"),
            Metric("CPU buffer size = 250.00 MiB", K_LC_HOST, "cpu_bytes"),
            Metric("model size = 12.55 GiB", K_LC_SIZE, "all_weights"),
            Metric("KV self size = 1024.00 MiB", K_LC_KV, "kv_cache"),
            Metric(
                "CUDA0 compute buffer size = 164.00 MiB", K_LC_COMPUTE, "compute_buffer", _compute_reason()
            ),
        ),
        assumptions="n_ctx 2048, n_ubatch 512 (build 2459 predates n_ubatch: n_batch 512), no flash "
        "attention (stated), 33/33 layers offloaded",
    ),
    Mapping(
        id="inf-llamacpp-llama2-7b-q4_k_m",
        model="meta-llama/Llama-2-7b-hf",
        twin="",
        run={
            "engine": "llama.cpp",
            "weights": "gguf-Q4_K_M",
            "seq": 2048,
            "kv_dtype": "f16",
            "n_batch": 512,
            "n_ubatch": 512,
            "flash_attn": False,
        },
        capacity=None,
        metrics=(
            Metric("CPU buffer size = 3891.24 MiB", K_LC_MODEL, "all_weights"),
            Metric("model size = 3.80 GiB", K_LC_SIZE, "all_weights"),
            Metric("KV self size = 1024.00 MiB", K_LC_KV, "kv_cache"),
            Metric(
                "CPU compute buffer size = 164.01 MiB",
                K_LC_COMPUTE,
                "compute_buffer",
                _compute_reason("this is the CPU backend's graph (a llamafile CPU run)"),
            ),
        ),
        assumptions="a CPU-only run: its one CPU model buffer holds every tensor, so it is compared with "
        "our whole model (GPU buffer + host part); n_ctx 2048, n_ubatch 512, no flash attention (old build)",
    ),
    Mapping(
        id="inf-llamacpp-mixtral-8x7b-q5_k_m-metal",
        model="mistralai/Mixtral-8x7B-v0.1",
        twin="the -Instruct-v0.1 model has the base model's architecture",
        run={
            "engine": "llama.cpp",
            "weights": "gguf-Q5_K_M",
            "seq": 512,
            "kv_dtype": "f16",
            "n_batch": 512,
            "n_ubatch": 512,
            "flash_attn": False,
        },
        capacity=None,
        metrics=(
            Metric("Metal buffer size = 30649.55 MiB", K_LC_MODEL, "weights", _mix_reason),
            Metric("CPU buffer size = 85.94 MiB", K_LC_HOST, "cpu_bytes"),
            Metric("model size = 30.02 GiB", K_LC_SIZE, "all_weights", _mix_reason),
            Metric("KV self size = 64.00 MiB", K_LC_KV, "kv_cache"),
            Metric(
                "Metal compute buffer size = 115.50 MiB",
                K_LC_COMPUTE,
                "compute_buffer",
                _compute_reason("Metal backend; flash attention assumed off (the log does not say)"),
            ),
        ),
        assumptions="n_ctx 512 (from the KV size), n_ubatch 512, no flash attention (not stated), "
        "33/33 layers",
    ),
    Mapping(
        id="inf-llamacpp-deepseek-v3-0324-mla-kv",
        model="deepseek-ai/DeepSeek-V3",
        twin="DeepSeek-V3-0324 is a re-trained DeepSeek-V3 with the same architecture (61 layers, MLA "
        "kv_lora_rank 512, rope 64)",
        run={
            "engine": "llama.cpp",
            "weights": "gguf-Q2_K",
            "seq": 16384,
            "kv_dtype": "f16",
            "n_batch": 2048,
            "n_ubatch": 1024,
            "flash_attn": True,
        },
        capacity=None,
        metrics=(
            Metric("KV self size = 2074.00 MiB", K_LC_KV, "kv_cache"),
            Metric(
                "CUDA0 compute buffer size = 3285.00 MiB",
                K_LC_COMPUTE,
                "compute_buffer",
                _compute_reason(
                    "with flash attention the formula has no attention term at all, and MLA with 128 heads "
                    "over 16384 cells at n_ubatch 1024 is where one would be largest (not modelled); the "
                    "run is also split over 4 GPUs + CPU-resident experts, which our single-GPU llama.cpp "
                    "profile does not model"
                ),
            ),
        ),
        assumptions="weights not compared (unsloth's dynamic Q2_K_XL is no standard ftype; Q2_K stands in, "
        "the KV and compute buffers do not depend on it); n_ctx 16384, KV f16, n_ubatch 1024, flash "
        "attention on (stated)",
    ),
    Mapping(
        id="inf-vllm-llama3-8b-tp1-weights",
        model="meta-llama/Meta-Llama-3-8B",
        twin="",
        run={"engine": "vllm", "seq": 8192, "max_model_len": 8192, "max_num_batched_tokens": 8192},
        capacity=79.22,
        metrics=(
            Metric("model weights take   14.96GiB", K_V_WEIGHTS, "weights"),
            Metric(
                "non_torch_memory 1.79GiB",
                K_V_NONTORCH,
                "non_torch",
                note="not independent: this line is the source of our non-torch constant",
            ),
            Metric(
                "PyTorch activation peak memory 1.26GiB",
                K_V_ACT,
                "activations",
                _vllm_act_reason(
                    "vLLM measures the torch peak of one dummy forward of 8192 tokens (v0, Dec 2024), which "
                    "also holds the rotary cache, the sampler's temporaries and allocator rounding"
                ),
            ),
            Metric(
                "available_kv_cache_memory 53.29GiB",
                K_V_KVBYTES,
                "kv_pool_bytes",
                _vllm_pool_reason,
            ),
        ),
        assumptions="capacity 79.22 GiB (the log's total_gpu_memory), gpu_memory_utilization 0.90 (stated), "
        "max_model_len 8192; v0 without chunked prefill profiles max(max_model_len, 2048) = 8192 tokens. "
        "The non-torch 1.79 GiB is the calibration source of our constant (not an independent check)",
    ),
    Mapping(
        id="inf-vllm-llama31-8b-l40s-weights",
        model="meta-llama/Llama-3.1-8B",
        twin="Llama-3.1-8B-Instruct has the base model's architecture",
        run={"engine": "vllm", "seq": 32768, "max_model_len": 32768},
        capacity="L40S",
        metrics=(
            Metric("Model loading took 14.9889 GiB", K_V_WEIGHTS, "weights"),
            Metric("GPU KV cache size: 158,656 tokens", K_V_TOKENS, "kv_tokens", _l40s_reason),
            Metric(
                "Maximum concurrency for 32,768 tokens per request: 4.84x",
                K_V_CONC,
                "max_concurrency",
                _l40s_reason,
            ),
        ),
        assumptions="capacity from the GPU catalog (L40S, 46068 MiB as nvidia-smi reports it); "
        "gpu_memory_utilization 0.9 and max_num_batched_tokens/max_num_seqs at our defaults (the log states "
        "none of them); max_model_len 32768",
    ),
    Mapping(
        id="inf-vllm-llama2-7b-blocks",
        model="meta-llama/Llama-2-7b-hf",
        twin="",
        run={
            "engine": "vllm",
            "compute_dtype": "fp16",
            "seq": 4096,
            "max_model_len": 4096,
            "max_num_batched_tokens": 4096,
        },
        capacity="A100-80GB",
        metrics=(
            Metric(
                "This PR: # GPU blocks: 7351",
                K_V_BLOCKS,
                "gpu_blocks",
                _vllm_pool_reason,
            ),
        ),
        assumptions="capacity from the GPU catalog (A100-80GB, 81920 MiB); fp16, gpu_memory_utilization 0.9, "
        "block 16 (stated); v0 profiles max(max_model_len, 2048) = 4096 tokens",
    ),
)

NOT_REPRODUCED: dict[str, str] = {
    "inf-hf-octocoder-bf16": "gpt_bigcode (StarCoder: MQA, learned positions) has no config reader in gpumem",
    "inf-hf-octocoder-int8": "gpt_bigcode has no config reader in gpumem",
    "inf-hf-octocoder-4bit": "gpt_bigcode has no config reader in gpumem",
    "tr-hf-bert-large-loaded": "BERT is an encoder (no causal-LM reader); the reading is nvidia-smi after a "
    "Trainer run (context + cached training blocks), not an inference state",
    "tr-hf-bert-large-fp32-bs4": "BERT is an encoder with a classification head: gpumem reads causal-LM "
    "configs only; the reading is also nvidia-smi after training (context + allocator cache of a V100)",
    "tr-hf-bert-large-fp16-bs4": "BERT is an encoder: no config reader (causal LMs only); nvidia-smi after "
    "training",
    "tr-hf-bert-large-fp32-bs4-adam8bit": "BERT is an encoder: no config reader (causal LMs only); "
    "nvidia-smi after training",
    "tr-axo-gptoss-20b-lora-1gpu": "gpt-oss is neither in the catalog nor in the reference configs, and "
    "the run's memory is set by what we do not model: MXFP4 experts dequantized to bf16, activation "
    "offloading, Cut Cross Entropy, sample packing; the figure is an approximate '~44 GiB' reserved",
}


def _is_training(entry: dict) -> bool:
    mode = (entry.get("mode") or "").lower()
    return not (mode.startswith("inference") or mode.startswith("weights only"))


def _parse_value(text: str) -> tuple[float, str]:
    """The last number of a quoted log line and its unit: bytes for MiB/GiB, else a count."""
    m = list(re.finditer(r"(\d[\d,]*(?:\.\d+)?)\s*(MiB|GiB|tokens|x)?", text))
    if not m:
        raise ValueError(f"no number in {text!r}")
    num, unit = m[-1].group(1), m[-1].group(2)
    value = float(num.replace(",", ""))
    if unit == "MiB":
        return value * MiB, "bytes"
    if unit == "GiB":
        return value * GiB, "bytes"
    if unit == "tokens":
        return value, "tokens"
    if unit == "x":
        return value, "x"
    return value, "blocks"


def _label(quote: str) -> str:
    """A published line without its value: 'KV self size = 1024.00 MiB' -> 'KV self size'."""
    return re.sub(r"[\s:=]*\d[\d,]*(?:\.\d+)?\s*(?:MiB|GiB|tokens|x)?\s*$", "", quote)


def _spec_for(model: str) -> ModelSpec:
    if model.startswith("config:"):
        return load_config_file(config_path(model.removeprefix("config:")))
    entry = find_model(model)
    if entry is None:
        raise KeyError(f"{model} is not in the model catalog")
    return entry.spec


def _capacity(m: Mapping) -> int | None:
    if m.capacity is None:
        return None
    if isinstance(m.capacity, str):
        return find_gpu(m.capacity).memory_bytes
    return round(m.capacity * GiB)


def _run_text(run: dict, capacity: int | None) -> str:
    text = ", ".join(f"{k}={v}" for k, v in run.items())
    return text + (f", capacity={capacity / GiB:.2f} GiB" if capacity else "")


def published_rows(
    entries: list[dict], ids: Iterable[str] | None = None
) -> tuple[list[Row], list[tuple[str, str, str, str, str]]]:
    """Rows for the mapped published points (all, or ``ids``) and the mapping table's lines."""
    by_id = {e["id"]: e for e in entries}
    wanted = set(ids) if ids is not None else None
    rows: list[Row] = []
    mapping: list[tuple[str, str, str, str, str]] = []
    for m in PUBLISHED:
        if wanted is not None and m.id not in wanted:
            continue
        entry = by_id[m.id]
        spec = _spec_for(m.model)
        capacity = _capacity(m)
        run = make_run(**m.run)
        est = estimate_inference(spec, run, capacity)
        numbers = "; ".join(f"{_label(mt.quote)} ↔ {OURS[mt.ours][0]}" for mt in m.metrics)
        mapping.append(
            (
                m.id,
                f"{m.model}" + (f" (twin: {m.twin})" if m.twin else " (the published model)"),
                _run_text(m.run, capacity),
                numbers,
                m.assumptions,
            )
        )
        table = "vllm" if run.engine == "vllm" else "llama.cpp"
        for i, mt in enumerate(m.metrics):
            if mt.quote not in entry["quote"]:
                raise ValueError(f"{m.id}: {mt.quote!r} is not in the published quote")
            measured, unit = _parse_value(mt.quote)
            ours = float(OURS[mt.ours][1](est))
            per_unit = 1.0
            if unit in ("tokens", "blocks", "x"):
                per_tok = float(est.facts["kv_bytes_per_token"])  # type: ignore[arg-type]
                per_unit = {"tokens": per_tok, "blocks": 16 * per_tok}.get(
                    unit,
                    per_tok * float(est.facts["max_model_len"]),  # type: ignore[arg-type]
                )
            row = Row(
                table=table,
                kind=mt.kind,
                sort_key=(m.id, i),
                setup=f"{m.id}: {entry['model']}",
                measured=measured,
                ours=ours,
                unit=unit,
                bytes_per_unit=per_unit,
                metric=mt.quote,
                source=m.id,
                reason=mt.note,
            )
            if abs(row.err) > REASON_THRESHOLD:
                ctx = Ctx(spec, run, est, capacity, measured, ours, per_unit)
                why = mt.reason(ctx) if mt.reason else "no reason recorded: investigate"
                row = _replace(row, reason=f"{mt.note}; {why}" if mt.note else why)
            rows.append(row)
    return sorted(rows, key=lambda r: r.sort_key), sorted(mapping)


def published_leftovers(
    entries: list[dict],
) -> tuple[list[tuple[str, str, str, str]], list[tuple[str, str, str]]]:
    """Inference points we do not reproduce (with the reason) and the training points (one line each)."""
    mapped = {m.id for m in PUBLISHED} | {m.id for m in PUBLISHED_TRAINING}
    not_rep, training = [], []
    for e in entries:
        if e["id"] in mapped:
            continue
        if _is_training(e) and e["id"] not in NOT_REPRODUCED:
            training.append((e["id"], e["model"], f"{e['mode']}; {e['metric']}"))
            continue
        why = NOT_REPRODUCED.get(e["id"], "not mapped yet")
        not_rep.append((e["id"], e["model"], e["mode"], why))
    return sorted(not_rep), sorted(training)


# ---- (d) training: the measured grids and the published fine-tuning points -------------------------------

TRAIN_PHASES = ("forward", "backward", "optimizer")
K_TRAIN_PEAK = "training peak (MemTracker = max_memory_allocated)"
K_TRAIN_PHASE = "training phase peaks (forward / backward / optimizer)"


def train_grid_points(subset: bool = False) -> list[tuple[str, dict]]:
    """Training points of both grids (``train_*`` and ``lora_*`` modes); ``subset``: two small ones."""
    out: list[tuple[str, dict]] = []
    for label, path in (
        ("groundtruth.json", reference_dir() / "groundtruth.json"),
        ("extra/grid_train.json", EXTRA / "grid_train.json"),
    ):
        for p in json.loads(path.read_text())["grid"]:
            if p["mode"].startswith(("train", "lora")) and "peak_bytes" in p:
                out.append((label, p))
    if subset:
        keep = {
            ("Qwen__Qwen2.5-0.5B", "train_amp_adamw", 1, 512, "sdpa"),
            ("Qwen__Qwen2.5-0.5B", "lora_bf16", 2, 1024, "sdpa"),
        }
        out = [
            (f, p)
            for f, p in out
            if (p["model"], p["mode"], p["batch"], p["seq"], p["attn_implementation"]) in keep
        ]
    return out


def train_grid_setup(p: dict) -> str:
    mode = p["mode"]
    what = {
        "train_amp_adamw": "full, amp-bf16, AdamW",
        "train_amp_adamw_gc": "full, amp-bf16, AdamW, grad ckpt",
        "train_bf16_adamw": "full, bf16, AdamW",
        "lora_amp": "LoRA, amp-bf16",
        "lora_amp_gc": "LoRA, amp-bf16, grad ckpt",
        "lora_bf16": "LoRA, bf16",
    }.get(mode, mode)
    if "lora_rank" in p:
        t = p["lora_targets"]
        what += f" r{p['lora_rank']} {t if t == 'all-linear' else '+'.join(t)}"
    if p.get("config_override"):
        what += ", dropout off"
    attn = p.get("attn_implementation_used") or p["attn_implementation"]
    return f"{_short(p['model'])} · {what} · b{p['batch']} s{p['seq']} · {attn}"


def _train_estimate(spec: ModelSpec, p: dict) -> tuple[int, dict[str, int], str, Estimate | None]:
    """(peak, phase peaks, peak phase, estimate) for a measured point. A point measured with dropout on
    the CPU replays CPU dropout (a noise tensor of the input's dtype), not CUDA's bool mask."""
    run = training_run_for_point(p)
    if p.get("dropout_kernel") == "cpu":
        res, _, _ = simulate_rank(spec, run, cpu_dropout=True)
        phases = {ph: res.phases[ph].total for ph in TRAIN_PHASES}
        top = max(phases, key=lambda k: phases[k])
        return phases[top], phases, top, None
    est = estimate_training(spec, run)
    phases = {ph: est.phases[ph].peak_bytes for ph in TRAIN_PHASES}
    return est.peak_bytes, phases, est.peak_phase, est


def _train_grid_reason(p: dict, phases: dict[str, int], top: str) -> str:
    meas = p["phase_peaks_bytes"]
    worst = max(TRAIN_PHASES, key=lambda ph: abs(phases[ph] - meas[ph]["Total"]) / meas[ph]["Total"])
    bd = meas[worst]
    parts = ", ".join(f"{k} {v / GiB:.3f}" for k, v in bd.items() if k != "Total" and v > MiB)
    return (
        f"{worst} phase: ours {phases[worst] / GiB:.3f} GiB vs measured {bd['Total'] / GiB:.3f} GiB ({parts} "
        f"GiB); our peak phase is {top}"
    )


def train_grid_rows(subset: bool = False) -> tuple[list[Row], list[Row]]:
    """(peak rows, phase rows) for the training points of both grids."""
    peaks: list[Row] = []
    phases_out: list[Row] = []
    specs: dict[str, ModelSpec] = {}
    for label, p in train_grid_points(subset):
        spec = specs.get(p["model"]) or load_config_file(config_path(p["model"]))
        specs[p["model"]] = spec
        peak, phases, top, _ = _train_estimate(spec, p)
        key = (
            p["model"],
            p["mode"],
            p["batch"],
            p["seq"],
            p["attn_implementation"],
            p.get("lora_rank", 0),
            json.dumps(p.get("lora_targets")),
            bool(p.get("config_override")),
        )
        setup = train_grid_setup(p)
        ph_rows = []
        for i, ph in enumerate(TRAIN_PHASES):
            ph_rows.append(
                Row(
                    table="train-phase",
                    kind=K_TRAIN_PHASE,
                    sort_key=(*key, i),
                    setup=f"{setup} · {ph}",
                    measured=p["phase_peaks_bytes"][ph]["Total"],
                    ours=phases[ph],
                    source=label,
                )
            )
        row = Row(
            table="train",
            kind=K_TRAIN_PEAK,
            sort_key=key,
            setup=setup,
            measured=p["peak_bytes"],
            ours=peak,
            source=label,
            phases=tuple((r.measured, r.ours) for r in ph_rows),
        )
        if abs(row.err) > REASON_THRESHOLD or any(abs(r.err) > REASON_THRESHOLD for r in ph_rows):
            row = _replace(row, reason=_train_grid_reason(p, phases, top))
        peaks.append(row)
        phases_out.extend(ph_rows)
    return sorted(peaks, key=lambda r: r.sort_key), sorted(phases_out, key=lambda r: r.sort_key)


K_T_ALLOC = "published training peak, allocated / active"
K_T_RESERVED = "published training peak, reserved"
K_T_MAXSEQ = "published largest trainable sequence"

# which of our numbers stands for each kind of published figure
TRAIN_OURS = {
    "peak": "peak_bytes (live tensors at the peak = max_memory_allocated; active_bytes.all.peak is the same "
    "figure at block granularity)",
    "fwd_bwd": "max(forward, backward) phase peak with first_step=True and SGD (no optimizer states exist: "
    "the log times forward + backward only)",
    "reserved": "total_bytes − cuda_context = peak + cuBLAS workspace + allocator reserve "
    "(max_memory_reserved counts every block the caching allocator holds, workspaces included, but never "
    "the CUDA context)",
    "max_seq": "the largest seq whose total_bytes fits the GPU (galloping search, as fit_training)",
    "fits": "total_bytes ≤ the usable memory the point states",
}


@dataclass(frozen=True)
class TCtx:
    spec: ModelSpec
    run: TrainingRun
    est: Estimate
    measured: float
    ours: float


def _g(est: Estimate, *keys: str) -> str:
    """Our components at the peak, in GiB, for a reason line."""
    out = []
    for k in keys:
        c = est.component(k)
        if c is not None and c.bytes:
            out.append(f"{k} {c.bytes / GiB:.2f}")
    return ", ".join(out) + " GiB"


@dataclass(frozen=True)
class TMetric:
    label: str  # the published figure, as the point states it
    value: float  # bytes, or tokens for max_seq, or 1/0 for fits
    kind: str
    ours: str  # a TRAIN_OURS key
    reason: Callable[[TCtx], str] | None = None


@dataclass(frozen=True)
class TMapping:
    id: str
    model: str  # catalog id, or "gpt2-large" (built from gpt2's config)
    twin: str
    run: dict
    metrics: tuple[TMetric, ...]
    assumptions: str
    gpu: str | None = None  # catalog GPU for max_seq / fits
    usable_gib: float | None = None  # fits: the usable memory the point states


GB = 1e9
_TT_AC = (
    "torchtune's row adds torch.compile and chunked cross-entropy (the loss in 8 chunks: no full fp32 "
    "logits or their gradient), which we do not model"
)


def _tt_reason(extra: str) -> Callable[[TCtx], str]:
    def reason(c: TCtx) -> str:
        return (
            f"ours {c.ours / GiB:.2f} GiB at the {c.est.peak_phase} peak "
            f"({_g(c.est, 'parameters', 'gradients')}; "
            f"{_g(c.est, 'optimizer_states', 'activations', 'logits', 'temporaries')}); {extra}"
        )

    return reason


PUBLISHED_TRAINING: tuple[TMapping, ...] = (
    TMapping(
        id="tr-tt-llama2-7b-qlora-4090",
        model="meta-llama/Llama-2-7b-hf",
        twin="",
        run={
            "method": "qlora",
            "precision": "bf16",
            "optimizer": "adamw",
            "batch": 4,
            "seq": 2048,
            "grad_ckpt": True,
            "lora_rank": 8,
            "lora_targets": "all-linear",
        },
        metrics=(
            TMetric(
                "Peak Memory per GPU 12.3 GB",
                12.3 * GB,
                K_T_ALLOC,
                "peak",
                _tt_reason(
                    "torchtune's NF4 (torchao) dequantizes each linear's weight in the autograd function "
                    "and its 2024 QLoRA recipe ran under torch.compile (**), whose saved buffers we do not "
                    "model; the table does not say whether its 'peak memory' is allocated, active or "
                    "reserved"
                ),
            ),
        ),
        assumptions="torchtune qlora_llama2_7b: r=8 on q/k/v/o + MLP (= all-linear), bf16 base and "
        "adapters, AdamW, activation checkpointing; GB = 1e9 bytes (torchtune of that period)",
    ),
    TMapping(
        id="tr-tt-llama2-7b-lora-4090",
        model="meta-llama/Llama-2-7b-hf",
        twin="",
        run={
            "method": "lora",
            "precision": "bf16",
            "optimizer": "adamw",
            "batch": 4,
            "seq": 2048,
            "grad_ckpt": True,
            "lora_rank": 8,
            "lora_targets": ("q_proj", "v_proj"),
        },
        metrics=(
            TMetric(
                "Peak Memory per GPU 21.3 GB",
                21.3 * GB,
                K_T_ALLOC,
                "peak",
                _tt_reason(
                    "the gap is near our whole logits + loss term: if the figure is reserved (not stated) "
                    "the allocator's cached blocks explain it; torchtune's recipe also keeps the fp32 "
                    "logits of the whole batch alive in its loss"
                ),
            ),
        ),
        assumptions="torchtune lora_llama2_7b: r=8 on q/v, bf16, AdamW, activation checkpointing; GB = 1e9",
    ),
    TMapping(
        id="tr-tt-llama2-7b-full-4090",
        model="meta-llama/Llama-2-7b-hf",
        twin="",
        run={
            "precision": "bf16",
            "optimizer": "paged-adamw-8bit",
            "batch": 4,
            "seq": 2048,
            "grad_ckpt": True,
        },
        metrics=(
            TMetric(
                "Peak Memory per GPU 24.1 GB",
                24.1 * GB,
                K_T_ALLOC,
                "peak",
                lambda c: (
                    "ours keeps every gradient until the step "
                    f"({_g(c.est, 'gradients', 'optimizer_states')}); torchtune's optimizer_in_bwd=True "
                    "steps and frees each parameter's gradient inside backward (not modelled), and "
                    "PagedAdamW pages its states to host once the 24 GB card is full, so the figure is the "
                    "card's limit rather than the run's demand"
                ),
            ),
        ),
        assumptions="torchtune full_finetune_single_device low-memory recipe: bf16, bitsandbytes PagedAdamW "
        "(8-bit states assumed), activation checkpointing; GB = 1e9",
    ),
    TMapping(
        id="tr-tt-llama32-3b-packed",
        model="meta-llama/Llama-3.2-3B",
        twin="",
        run={"precision": "bf16", "optimizer": "adamw", "batch": 2, "seq": 4096},
        metrics=(TMetric("Peak Memory Active 60.0 GiB", 60.0 * GiB, K_T_ALLOC, "peak", _tt_reason("")),),
        assumptions="torchtune full_finetune_single_device, bf16 params/grads/AdamW states (foreach), packed "
        "to 2 x 4096 tokens, no checkpointing, no compile (first ablation row after the baseline)",
    ),
    TMapping(
        id="tr-tt-llama32-3b-ac",
        model="meta-llama/Llama-3.2-3B",
        twin="",
        run={"precision": "bf16", "optimizer": "adamw", "batch": 2, "seq": 4096, "grad_ckpt": True},
        metrics=(TMetric("Peak Memory Active 24.9 GiB", 24.9 * GiB, K_T_ALLOC, "peak", _tt_reason(_TT_AC)),),
        assumptions="as tr-tt-llama32-3b-packed + activation checkpointing (the cumulative row also has "
        "torch.compile and chunked cross-entropy, not modelled)",
    ),
    TMapping(
        id="tr-tt-llama32-3b-adamw8bit",
        model="meta-llama/Llama-3.2-3B",
        twin="",
        run={"precision": "bf16", "optimizer": "adamw-8bit", "batch": 2, "seq": 4096, "grad_ckpt": True},
        metrics=(
            TMetric(
                "Peak Memory Active 17.6 GiB",
                17.6 * GiB,
                K_T_ALLOC,
                "peak",
                _tt_reason(
                    _TT_AC + "; the row also steps the optimizer inside backward (optimizer_in_bwd: no "
                    "full set of gradients) and offloads activations to the CPU"
                ),
            ),
        ),
        assumptions="as tr-tt-llama32-3b-ac + bitsandbytes 8-bit AdamW (cumulative: compile, chunked CE, "
        "optimizer in backward and activation offloading also on, none modelled)",
    ),
    TMapping(
        id="tr-tt-llama32-3b-lora",
        model="meta-llama/Llama-3.2-3B",
        twin="",
        run={
            "method": "lora",
            "precision": "bf16",
            "optimizer": "adamw",
            "batch": 2,
            "seq": 4096,
            "grad_ckpt": True,
            "lora_rank": 64,
            "lora_targets": ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        },
        metrics=(
            TMetric(
                "Peak Memory Active 8.5 GiB",
                8.5 * GiB,
                K_T_ALLOC,
                "peak",
                _tt_reason(
                    "most of ours is the full fp32 logits and the loss's temporaries, which chunked "
                    "cross-entropy never materialises, plus saved layer inputs that activation offloading "
                    "moves to the CPU (neither modelled)"
                ),
            ),
        ),
        assumptions="torchtune llama3_2/3B_lora_single_device: r=64 on q/v/o + MLP, bf16, AdamW, AC; the "
        "cumulative row also has compile, chunked CE and activation offloading (not modelled)",
    ),
    TMapping(
        id="tr-titan-llama31-8b-fsdp8",
        model="meta-llama/Llama-3.1-8B",
        twin="",
        run={
            "precision": "amp-bf16",
            "optimizer": "adamw",
            "batch": 2,
            "seq": 8192,
            "grad_ckpt": True,
            "attn": "flash",
            "fsdp": "full_shard",
            "dp": 8,
        },
        metrics=(
            TMetric(
                "max_reserved 82.4 GiB",
                82.4 * GiB,
                K_T_RESERVED,
                "reserved",
                lambda c: (
                    "torchtitan's op-level selective checkpointing keeps more than our full checkpointing "
                    f"and less than none: without checkpointing ours is {_no_ckpt_reserved(c) / GiB:.1f} "
                    "GiB, so the measured 82.4 lies between; FSDP2's MixedPrecision gathers bf16 params per "
                    f"layer where our amp-bf16 keeps autocast bf16 copies ({_g(c.est, 'weight_copies')}); "
                    "multi-GPU sharding is modelled from the FSDP source only"
                ),
            ),
        ),
        assumptions="FSDP2 FULL_SHARD over 8 GPUs, fp32 sharded params with bf16 compute (amp-bf16 stands "
        "for it), AdamW, flash SDPA; selective (op) AC modelled as full AC (no SAC in gpumem)",
    ),
    TMapping(
        id="tr-titan-llama31-8b-cp1-32k",
        model="meta-llama/Llama-3.1-8B",
        twin="",
        run={
            "precision": "amp-bf16",
            "optimizer": "adamw",
            "batch": 1,
            "seq": 32768,
            "grad_ckpt": True,
            "attn": "flash",
            "fsdp": "full_shard",
            "dp": 8,
        },
        metrics=(
            TMetric(
                "max_reserved 83.9 GiB",
                83.9 * GiB,
                K_T_RESERVED,
                "reserved",
                lambda c: (
                    f"ours {_g(c.est, 'logits', 'weight_copies', 'activations')}: float8 linears and "
                    "torch.compile (stated) change the saved activations and the weight casts, neither "
                    "modelled; multi-GPU sharding is modelled from the FSDP source only"
                ),
            ),
        ),
        assumptions="FSDP 8, CP 1, full AC, batch 1 x 32768 tokens, flash SDPA; float8 and compile not "
        "modelled (amp-bf16 stands for the bf16 compute)",
    ),
    TMapping(
        id="tr-aq-llama2-7b-qlora-bs1-512",
        model="meta-llama/Llama-2-7b-hf",
        twin="",
        run={
            "method": "qlora",
            "precision": "bf16",
            "optimizer": "adamw",
            "batch": 1,
            "seq": 512,
            "grad_ckpt": True,
            "lora_rank": 64,
            "lora_targets": "all-linear",
            "fsdp": "full_shard",
            "dp": 2,
        },
        metrics=(
            TMetric(
                "peak reserved 4.98 GiB",
                4.98 * GiB,
                K_T_RESERVED,
                "reserved",
                lambda c: (
                    f"ours {_g(c.est, 'parameters', 'gathered_parameters', 'optimizer_states')} per GPU; the "
                    "log's reserved_after_model_wrap is 3.72 GiB (weights shard + overhead), so our per-GPU "
                    "share of the NF4 base + bf16 embeddings is the larger part of the gap (fsdp_qlora "
                    "shards the quantized storage as plain bf16-typed bytes); sharding modelled from source "
                    "only"
                ),
            ),
        ),
        assumptions="fsdp_qlora train.py: FSDP full_shard on 2 GPUs, NF4 base, LoRA r=64 on all linears, "
        "bf16, torch AdamW, reentrant checkpointing (modelled as non-reentrant)",
    ),
    TMapping(
        id="tr-aq-llama2-7b-lora-bs1-2048",
        model="meta-llama/Llama-2-7b-hf",
        twin="",
        run={
            "method": "lora",
            "precision": "bf16",
            "optimizer": "adamw",
            "batch": 1,
            "seq": 2048,
            "grad_ckpt": True,
            "lora_rank": 64,
            "lora_targets": "all-linear",
            "fsdp": "full_shard",
            "dp": 2,
        },
        metrics=(
            TMetric("peak allocated 9.16 GiB", 9.16 * GiB, K_T_ALLOC, "peak"),
            TMetric(
                "peak reserved 10.22 GiB",
                10.22 * GiB,
                K_T_RESERVED,
                "reserved",
                lambda c: (
                    "our allocated peak is +3 % but our reserve is small "
                    f"({_g(c.est, 'allocator_reserve')}); the log's reserved − allocated is 1.06 GiB (10.22 "
                    "− 9.16): caching-allocator fragmentation from FSDP's per-layer all-gather buffers, "
                    "which our reserve term (calibrated on single-GPU steps) does not model"
                ),
            ),
        ),
        assumptions="fsdp_qlora train.py: FSDP full_shard on 2 GPUs, bf16 base, LoRA r=64 on all linears, "
        "torch AdamW, reentrant checkpointing (modelled as non-reentrant)",
    ),
    TMapping(
        id="tr-hf-gpt2-large-eager-bs1-1024",
        model="gpt2-large",
        twin="openai-community/gpt2's config with gpt2-large's n_embd 1280, n_layer 36, n_head 20 (the "
        "catalog has no gpt2-large)",
        run={
            "precision": "bf16",
            "optimizer": "sgd",
            "first_step": True,
            "batch": 1,
            "seq": 1024,
            "attn": "eager",
        },
        metrics=(
            TMetric(
                "peak memory 8682.26 MB (max_memory_allocated)",
                8682.26 * MiB,
                K_T_ALLOC,
                "fwd_bwd",
                lambda c: (
                    "GPT-2's default dropout 0.1 is assumed on (our bool masks and scaled copies); with "
                    f"dropout off ours is {_gpt2_nodrop(c) / MiB:.0f} MiB. The benchmark script's model mode "
                    "and its loss are not stated"
                ),
            ),
        ),
        assumptions="pure fp16 model (bf16 has the same bytes), forward + backward only (no optimizer "
        "states), eager attention, the architecture's default dropout; 'MB' read as MiB",
    ),
    TMapping(
        id="bound-hf-fa2-llama31-8b-qlora-maxctx-80gb",
        model="meta-llama/Llama-3.1-8B",
        twin="the -Instruct model has the base model's architecture",
        run={
            "method": "qlora",
            "precision": "bf16",
            "optimizer": "adamw-8bit",
            "batch": 1,
            "seq": 4096,
            "grad_ckpt": True,
            "attn": "flash",
            "lora_rank": 32,
            "lora_targets": "all-linear",
        },
        gpu="A100-80GB",
        metrics=(
            TMetric(
                "max sequence length 28,454 tokens at 80 GB",
                28454,
                K_T_MAXSEQ,
                "max_seq",
                lambda c: (
                    "low-confidence bound: the HF column's optimizer, checkpointing and padding are not "
                    "stated (adamw-8bit and checkpointing assumed, as unsloth's notebooks); at our maximum "
                    "the fp32 logits and loss dominate "
                    f"({_g(c.est, 'logits', 'temporaries', 'activations')}), and transformers of Jan 2025 "
                    "also upcast the logits inside the model"
                ),
            ),
        ),
        assumptions="QLoRA r=32 on q/k/v/o/gate/up/down, NF4 base, bf16, flash-attention 2, batch 1, "
        "checkpointing and 8-bit AdamW assumed; fits = total_bytes ≤ 80 GiB",
    ),
    TMapping(
        id="bound-hf-llama7b-4bit-nf4-nogc-512-fits",
        model="meta-llama/Llama-2-7b-hf",
        twin="LLaMA-1 7B has Llama-2-7B's dimensions (4096 hidden, 32 layers, 32 heads, FFN 11008, "
        "vocab 32000)",
        run={
            "method": "qlora",
            "precision": "bf16",
            "optimizer": "adamw",
            "batch": 1,
            "seq": 512,
            "attn": "eager",
            "lora_rank": 16,
            "lora_targets": ("q_proj", "v_proj"),
        },
        gpu="T4",
        usable_gib=15.0,
        metrics=(TMetric("No OOM", 1, "fits", "fits"),),
        assumptions="NF4 base, bf16 compute, no checkpointing, batch 1 (grad accumulation 4 does not add "
        "memory), eager; LoRA r=16 on q/v assumed (the gist's adapters are small either way)",
    ),
    TMapping(
        id="bound-hf-llama7b-4bit-nf4-nogc-1024-oom",
        model="meta-llama/Llama-2-7b-hf",
        twin="LLaMA-1 7B has Llama-2-7B's dimensions",
        run={
            "method": "qlora",
            "precision": "bf16",
            "optimizer": "adamw",
            "batch": 1,
            "seq": 1024,
            "attn": "eager",
            "lora_rank": 16,
            "lora_targets": ("q_proj", "v_proj"),
        },
        gpu="T4",
        usable_gib=15.0,
        metrics=(TMetric("OOM", 0, "fits", "fits"),),
        assumptions="as the 512-token point, at 1024 tokens",
    ),
)


def _no_ckpt_reserved(c: TCtx) -> float:
    est = estimate_training(c.spec, c.run.model_copy(update={"grad_ckpt": False}))
    return _ours_train(est, "reserved")


def _gpt2_nodrop(c: TCtx) -> float:
    est = estimate_training(c.spec, c.run.model_copy(update={"dropout": 0.0}))
    return _ours_train(est, "fwd_bwd")


def _ours_train(est: Estimate, key: str) -> float:
    if key == "peak":
        return est.peak_bytes
    if key == "fwd_bwd":
        return max(est.phases["forward"].peak_bytes, est.phases["backward"].peak_bytes)
    if key == "reserved":
        ctx = est.component("cuda_context")
        return est.total_bytes - (ctx.bytes if ctx is not None else 0)
    raise KeyError(key)


def _train_spec(model: str) -> ModelSpec:
    if model == "gpt2-large":
        cfg = json.loads(config_path("openai-community__gpt2").read_text())
        cfg.update(n_embd=1280, n_layer=36, n_head=20)
        return spec_from_config(cfg, name="openai-community/gpt2-large")
    return _spec_for(model)


def _max_seq(spec: ModelSpec, run: TrainingRun, capacity: int) -> int | None:
    def fits(s: int) -> bool:
        return estimate_training(spec, run.model_copy(update={"seq": s})).total_bytes <= capacity

    return gallop(fits, run.seq, 1, 1 << 20)


def _train_run_text(run: dict, gpu: str | None) -> str:
    def v(x: object) -> str:
        return "+".join(x) if isinstance(x, tuple) else str(x)

    return ", ".join(f"{k}={v(x)}" for k, x in run.items()) + (f", gpu={gpu}" if gpu else "")


def published_training_rows(
    entries: list[dict], ids: Iterable[str] | None = None
) -> tuple[list[Row], list[tuple[str, str, str, str, str]], list[tuple[str, str, str, str, str]]]:
    """Rows for the mapped published training points, the mapping lines, and the fits/OOM verdicts."""
    by_id = {e["id"]: e for e in entries}
    wanted = set(ids) if ids is not None else None
    rows: list[Row] = []
    mapping: list[tuple[str, str, str, str, str]] = []
    bounds: list[tuple[str, str, str, str, str]] = []
    for m in PUBLISHED_TRAINING:
        if wanted is not None and m.id not in wanted:
            continue
        entry = by_id[m.id]
        spec = _train_spec(m.model)
        run = make_training_run(**m.run)
        est = estimate_training(spec, run)
        numbers = "; ".join(f"{mt.label} ↔ {TRAIN_OURS[mt.ours]}" for mt in m.metrics)
        model = m.model + (f" (twin: {m.twin})" if m.twin else " (the published model)")
        mapping.append((m.id, model, _train_run_text(m.run, m.gpu), numbers, m.assumptions))
        for i, mt in enumerate(m.metrics):
            if mt.ours == "fits":
                usable = (m.usable_gib or 0) * GiB
                ok = est.total_bytes <= usable
                agree = "agree" if ok == bool(mt.value) else "DISAGREE"
                bounds.append(
                    (
                        m.id,
                        f"{entry['model']} · {_train_run_text(m.run, m.gpu)}",
                        mt.label,
                        f"{'fits' if ok else 'OOM'}: total {est.total_bytes / GiB:.2f} GiB of {m.usable_gib} "
                        f"GiB (peak {est.peak_bytes / GiB:.2f} GiB)",
                        agree,
                    )
                )
                continue
            if mt.ours == "max_seq":
                ours = float(_max_seq(spec, run, find_gpu(m.gpu or "").memory_bytes) or 0)
                est = estimate_training(spec, run.model_copy(update={"seq": int(ours)}))
                unit, per_unit = "tokens", 0.0
            else:
                ours = float(_ours_train(est, mt.ours))
                unit, per_unit = "bytes", 1.0
            row = Row(
                table="train-published",
                kind=mt.kind,
                sort_key=(m.id, i),
                setup=f"{m.id}: {entry['model']}",
                measured=float(mt.value),
                ours=ours,
                unit=unit,
                bytes_per_unit=per_unit,
                metric=mt.label,
                source=m.id,
            )
            if abs(row.err) > REASON_THRESHOLD:
                ctx = TCtx(spec, run, est, row.measured, ours)
                row = _replace(row, reason=mt.reason(ctx) if mt.reason else "no reason recorded: investigate")
            rows.append(row)
    return sorted(rows, key=lambda r: r.sort_key), sorted(mapping), sorted(bounds)


# ---- (c) peers --------------------------------------------------------------------------------------------

_LLM_ANALYSIS_CODE = r"""
import dataclasses, json, sys, importlib.metadata as md
from llm_analysis import config as C
from llm_analysis.analysis import infer, train
C.gpu_configs["unbounded"] = dataclasses.replace(
    C.get_gpu_config_by_name("h100-sxm-80gb"), name="unbounded", mem_per_GPU_in_GB=1e6)
req = json.load(sys.stdin)
for name, cfg in req["models"].items():
    C.model_configs[name] = C.ModelConfig(**cfg)
out = {"version": md.version("llm-analysis"), "points": {}}
for p in req["points"]:
    try:
        r = infer(model_name=p["model"], gpu_name="unbounded", dtype_name="w16a16e16", log_level="ERROR",
                  batch_size_per_gpu=p["batch"], seq_len=p["seq"], num_tokens_to_generate=1)
        w, kv = r["weight_memory_per_gpu"], r["kv_cache_memory_per_gpu"]
        pre, dec = r["prefill_activation_memory_per_gpu"], r["decode_activation_memory_per_gpu"]
        out["points"][p["key"]] = {"weights": w, "kv": kv, "prefill_act": pre, "peak": w + max(pre, kv + dec)}
    except Exception as e:
        out["points"][p["key"]] = {"error": (type(e).__name__ + ": " + str(e))[:160]}
out["train_points"] = {}
for p in req.get("train_points", []):
    try:
        r = train(model_name=p["model"], gpu_name="unbounded", dtype_name="w16a16e16", log_level="ERROR",
                  batch_size_per_gpu=p["batch"], seq_len=p["seq"], total_num_tokens=p["batch"] * p["seq"],
                  dp_size=1, total_num_gpus=1, activation_recomputation=p["recompute"],
                  master_weights_dtype_bytes=p["master_bytes"], other_op_bytes=p["other_op_bytes"])
        out["train_points"][p["key"]] = {
            "states": r["(weight+op_state+grad)_memory_per_gpu"], "act": r["activation_memory_per_gpu"],
            "peak": r["(weight+op_state+grad+act)_memory_per_gpu"]}
    except Exception as e:
        out["train_points"][p["key"]] = {"error": (type(e).__name__ + ": " + str(e))[:160]}
print("@@JSON@@" + json.dumps(out))
"""

_ACCELERATE_CODE = r"""
import json, os, shutil, sys, tempfile, warnings, importlib.metadata as md
warnings.filterwarnings("ignore")
import torch
from transformers import AutoConfig, AutoModel
from accelerate import init_empty_weights
from accelerate.utils import calculate_maximum_sizes
out = {"version": md.version("accelerate"), "transformers": md.version("transformers"), "models": {}}
for name, path in json.load(sys.stdin).items():
    d = tempfile.mkdtemp()
    try:
        shutil.copy(path, os.path.join(d, "config.json"))
        cfg = AutoConfig.from_pretrained(d)
        with init_empty_weights():
            model = AutoModel.from_config(cfg, dtype=torch.float32)
        total, largest = calculate_maximum_sizes(model)
        out["models"][name] = {"total_fp32": int(total), "largest_layer_fp32": int(largest[0])}
    except Exception as e:
        out["models"][name] = {"error": (type(e).__name__ + ": " + str(e))[:160]}
    finally:
        shutil.rmtree(d, ignore_errors=True)
print("@@JSON@@" + json.dumps(out))
"""


def _llm_analysis_config(spec: ModelSpec, max_seq: int) -> dict:
    """The most llm-analysis's ModelConfig can take of our spec (it knows no gating, sliding or MLA)."""
    ffn = spec.moe.expert_intermediate_size if spec.moe else spec.intermediate_size
    return {
        "name": spec.name,
        "num_layers": spec.num_layers,
        "n_head": spec.num_attention_heads,
        "hidden_dim": spec.hidden_size,
        "vocab_size": spec.vocab_size,
        "max_seq_len": max(spec.max_position_embeddings, max_seq),
        "num_key_value_heads": spec.num_kv_heads,
        "ffn_embed_dim": ffn,
        "expansion_ratio": ffn / spec.hidden_size,
        "model_type": spec.model_type,
        "moe_num_experts": spec.moe.num_experts if spec.moe else 1,
        "moe_top_k": spec.moe.experts_per_token if spec.moe else 1,
    }


def _run_peer(python: Path, code: str, payload: object) -> dict:
    proc = subprocess.run(
        [str(python), "-c", code],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=tempfile.gettempdir(),
        env={
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error",
        },
    )
    for line in proc.stdout.splitlines():
        if line.startswith("@@JSON@@"):
            return json.loads(line.removeprefix("@@JSON@@"))
    raise RuntimeError(f"{python} failed (rc {proc.returncode}): {proc.stderr.strip()[-400:]}")


def _grid_key(p: dict) -> str:
    return f"{p['model']}|{p['mode']}|b{p['batch']}|s{p['seq']}|{p['attn_implementation']}"


# llm-analysis's train() knobs for the full fine-tune modes of the grid (it has no LoRA): master weights and
# optimizer-state bytes per parameter (its defaults 4 and 8 are AdamW with fp32 master weights; pure bf16
# keeps bf16 weights and bf16 moments), activation_recomputation 2 = FULL (every layer's input kept)
LLM_ANALYSIS_TRAIN: dict[str, dict[str, int]] = {
    "train_amp_adamw": {"master_bytes": 4, "other_op_bytes": 8, "recompute": 0},
    "train_amp_adamw_gc": {"master_bytes": 4, "other_op_bytes": 8, "recompute": 2},
    "train_bf16_adamw": {"master_bytes": 2, "other_op_bytes": 4, "recompute": 0},
}


def accelerate_training_bytes(total_fp32: int, dtype: str) -> int:
    """``accelerate estimate-memory``'s "Training using Adam" in its ``dtype`` row (``float32`` or
    ``float16``, the mixed-precision one) for a model whose fp32 size is ``total_fp32``: the largest of its
    model, gradients, optimizer and step sizes (accelerate/commands/estimate.py, estimate_training_usage):
    fp32 → step = 4 x the fp32 size; float16 → optimizer = step = 2 x the fp32 size."""
    if dtype == "float32":
        sizes = [total_fp32, total_fp32, 2 * total_fp32, 4 * total_fp32]
    else:
        sizes = [total_fp32, total_fp32 + total_fp32 // 2, 2 * total_fp32, 2 * total_fp32]
    return max(sizes)


def refresh_peers() -> dict:
    """Run the peers in their scratch environments; returns what :data:`PEERS_FILE` holds."""
    points = [p for _, p in grid_points()]
    train_points = [p for _, p in train_grid_points() if p["mode"] in LLM_ANALYSIS_TRAIN]
    models = sorted({p["model"] for p in [*points, *train_points]})
    doc: dict = {
        "about": "Peer estimates for the grid points, made by validation/validate.py --refresh-peers in "
        "scratch virtual environments (llm-analysis from PyPI; accelerate + transformers + torch CPU).",
        "llm_analysis": None,
        "accelerate": None,
    }
    la_python = PEERS_VENV / "bin" / "python"
    if la_python.is_file():
        specs = {m: load_config_file(config_path(m)) for m in models}
        max_seq = {m: max(p["seq"] + 1 for p in [*points, *train_points] if p["model"] == m) for m in models}
        payload = {
            "models": {m: _llm_analysis_config(specs[m], max_seq[m]) for m in models},
            "points": [
                {"key": _grid_key(p), "model": p["model"], "batch": p["batch"], "seq": p["seq"]}
                for p in points
            ],
            "train_points": [
                {
                    "key": _grid_key(p),
                    "model": p["model"],
                    "batch": p["batch"],
                    "seq": p["seq"],
                    **LLM_ANALYSIS_TRAIN[p["mode"]],
                }
                for p in train_points
            ],
        }
        doc["llm_analysis"] = _run_peer(la_python, _LLM_ANALYSIS_CODE, payload)
    acc_python = GT_VENV / "bin" / "python"
    if acc_python.is_file():
        doc["accelerate"] = _run_peer(acc_python, _ACCELERATE_CODE, {m: str(config_path(m)) for m in models})
    return doc


def peer_rows(report_grid: list[Row], peers: dict | None) -> tuple[list[dict], str]:
    if not peers:
        return [], (
            f"no peer data ({PEERS_FILE.name} missing): run with --refresh-peers where {PEERS_VENV} has "
            f"llm-analysis and {GT_VENV} has torch + transformers + accelerate"
        )
    la = (peers.get("llm_analysis") or {}).get("points", {})
    acc = (peers.get("accelerate") or {}).get("models", {})
    out = []
    for _, p in grid_points():
        key = _grid_key(p)
        row = next(
            (
                r
                for r in report_grid
                if r.sort_key == (p["model"], p["mode"], p["batch"], p["seq"], p["attn_implementation"])
            ),
            None,
        )
        if row is None:
            continue
        a = acc.get(p["model"], {})
        out.append(
            {
                "setup": row.setup,
                "sort_key": row.sort_key,
                "measured": row.measured,
                "ours": row.ours,
                "llm_analysis": la.get(key, {}).get("peak"),
                "llm_analysis_error": la.get(key, {}).get("error"),
                "accelerate": a["total_fp32"] / 2 if "total_fp32" in a else None,
                "accelerate_error": a.get("error"),
            }
        )
    return sorted(out, key=lambda d: d["sort_key"]), ""


def train_peer_rows(report_train: list[Row], peers: dict | None) -> list[dict]:
    """Peers on the full fine-tune training points (neither peer models LoRA)."""
    if not peers:
        return []
    la = (peers.get("llm_analysis") or {}).get("train_points", {})
    acc = (peers.get("accelerate") or {}).get("models", {})
    out = []
    for _, p in train_grid_points():
        if p["mode"] not in LLM_ANALYSIS_TRAIN or p.get("config_override"):
            continue
        row = next((r for r in report_train if r.sort_key[:5] == _train_point_key(p)), None)
        if row is None:
            continue
        key, a = _grid_key(p), acc.get(p["model"], {})
        out.append(
            {
                "setup": row.setup,
                "sort_key": row.sort_key,
                "measured": row.measured,
                "ours": row.ours,
                "llm_analysis": la.get(key, {}).get("peak"),
                "llm_analysis_error": la.get(key, {}).get("error") if la else "not run (--refresh-peers)",
                "accelerate": accelerate_training_bytes(a["total_fp32"], "float16")
                if "total_fp32" in a
                else None,
                "accelerate_fp32": accelerate_training_bytes(a["total_fp32"], "float32")
                if "total_fp32" in a
                else None,
                "accelerate_error": a.get("error"),
            }
        )
    return sorted(out, key=lambda d: d["sort_key"])


def _train_point_key(p: dict) -> tuple:
    return (p["model"], p["mode"], p["batch"], p["seq"], p["attn_implementation"])


# ---- the report -------------------------------------------------------------------------------------------


def _ver(pkg: str) -> str:
    try:
        return version(pkg)
    except PackageNotFoundError:
        return "not installed"


def collect(subset: bool = False, peers: dict | None = None) -> Report:
    """Everything the report shows; ``subset``: a few grid points and three published points (tests)."""
    rep = Report()
    rep.grid = grid_rows(subset)
    entries = json.loads((reference_dir() / "published" / "published.json").read_text())
    ids = (
        ["inf-llamacpp-openllama7b-f16", "inf-llamacpp-llama2-7b-q4_k_m", "inf-vllm-llama3-8b-tp1-weights"]
        if subset
        else None
    )
    rep.published, rep.mapping = published_rows(entries, ids)
    rep.not_reproduced, leftover = published_leftovers(entries)
    rep.not_reproduced = sorted(
        [
            *rep.not_reproduced,
            *((pid, model, "training", f"not mapped yet ({what})") for pid, model, what in leftover),
        ]
    )
    rep.train, rep.train_phases = train_grid_rows(subset)
    train_ids = (
        ["tr-aq-llama2-7b-lora-bs1-2048", "bound-hf-llama7b-4bit-nf4-nogc-512-fits"] if subset else None
    )
    rep.train_published, rep.train_mapping, rep.train_bounds = published_training_rows(entries, train_ids)
    if not subset:
        rep.peers, rep.peers_note = peer_rows(rep.grid, peers)
        rep.train_peers = train_peer_rows(rep.train, peers)
    gt = json.loads((reference_dir() / "groundtruth.json").read_text())["versions"]
    rep.versions = {
        "gpumem": _ver("gpumem"),
        "python (this run)": platform.python_version(),
        "pydantic": _ver("pydantic"),
        "gguf": _ver("gguf"),
        "reference: torch / transformers": f"{gt.get('torch')} / {gt.get('transformers')}",
    }
    if peers:
        la, acc = peers.get("llm_analysis") or {}, peers.get("accelerate") or {}
        rep.versions["peer: llm-analysis"] = la.get("version", "not run")
        rep.versions["peer: accelerate / transformers"] = (
            f"{acc.get('version', 'not run')} / {acc.get('transformers', '-')}"
        )
    return rep


def _fmt_value(v: float, unit: str) -> str:
    if unit == "bytes":
        return f"{v / GiB:.3f} GiB" if v >= GiB else f"{v / MiB:.2f} MiB"
    if unit == "x":
        return f"{v:.2f}x"
    return f"{v:,.0f} {unit}"


def _pct(x: float) -> str:
    return f"{x * 100:+.2f} %" if round(x * 100, 2) else "+0.00 %"


def _gib_note(r: Row) -> str:
    return f" ({r.err_gib:+.3f} GiB)" if r.bytes_per_unit else ""


def _summary(rows: list[Row]) -> list[str]:
    kinds: dict[str, list[Row]] = {}
    for r in rows:
        kinds.setdefault(r.kind, []).append(r)
    out = []
    for kind in sorted(kinds):
        rs = kinds[kind]
        errs = [abs(r.err) for r in rs]
        worst = max(rs, key=lambda r: abs(r.err))
        out.append(
            f"- **{kind}** ({len(rs)} point{'s' if len(rs) > 1 else ''}): median |error| "
            f"{statistics.median(errs) * 100:.2f} %, worst {_pct(worst.err)}{_gib_note(worst)} at "
            f"{worst.setup}" + (f" — {worst.metric}" if worst.metric else "")
        )
    return out


def _esc(text: str) -> str:
    return text.replace("|", "\\|")


HEADER = """\
# Validation: gpumem's estimates against measurements

Generated by `make validate` (`validation/validate.py`); do not edit by hand. Every number is recomputed
from the current core on each run; rows are sorted, so the file changes only when a number does.

## What was measured, and how

* **Grid (PyTorch-measured, allocated bytes).** The reference (`shared/reference/groundtruth.json` and
  `tests/reference/extra/grid_infer.json`) builds the real transformers {transformers} model inside
  PyTorch's `FakeTensorMode` on the CPU (torch {torch}) and tracks it with PyTorch's own
  `torch.distributed._tools.mem_tracker.MemTracker`: every op runs its shape/dtype logic, nothing is
  allocated, and the tracker counts the storage bytes of every live tensor. Its `peak_bytes` is what
  `torch.cuda.max_memory_allocated()` would report on a GPU, without the CUDA context, cuBLAS
  workspaces and allocator fragmentation. Modes: `infer_prefill` (one `no_grad` forward with
  `use_cache=True`, logits for every position kept) → our `logits="all"`; `infer_prefill_last_logit`
  (`logits_to_keep=1`, what `generate()` does) → `logits="last"`. Weights bf16, `new_tokens=0`, the
  attention implementation transformers actually used (`attn_implementation_used`; Gemma-2 falls back
  to eager). Our `peak_bytes` (live tensors at the peak) is compared with the measured peak, our
  `kv_cache_bytes` with the DynamicCache the forward returned.
* **Published (real logs).** `shared/reference/published/published.json` holds numbers copied from
  public logs and docs, each a different kind of quantity: llama.cpp buffer lines are exact
  allocations (model / KV / compute buffers, no CUDA context); vLLM's profile lines are torch-allocator
  bytes (weights, activation peak), memory outside torch (non-torch), and what is left for the KV cache
  of `gpu_memory_utilization x total`, reported as bytes, tokens, 16-token blocks or concurrency (these
  test the whole budget chain, not only the KV formula). The mapping table says which of our numbers
  stands for each published line, and what was assumed where the log is silent.
* The grid is also the reference the transformers profile was developed against (its tests hold it to
  3 %), so it shows the op-by-op replay is faithful on these setups; the published rows, measured by
  others on real GPUs, are the independent check.
* Error = (ours − measured) / measured. Error GiB converts counts to bytes (tokens x KV bytes per
  token). Rows off by more than {threshold:.0%} carry a reason derived from our components and the
  published notes.
"""

PEERS_INTRO = """\
Same setups, each tool's own inference-memory estimate (bf16), against the measured peak:

* **llm-analysis** (PyPI `llm-analysis`): given the most its `ModelConfig` takes of our spec (layers,
  heads, KV heads, hidden, vocab, FFN width, experts/top-k); its peak here is
  `weights + max(prefill activations, KV + decode activations)`, the two checks its `inference()`
  makes. It models a two-matrix MLP (no gate projection), one shared embedding table, no sliding
  windows and no MLA; its prefill activations are the larger of one layer's and the full logits.
* **accelerate** (`accelerate estimate-memory`'s own code path, run offline from the config file):
  `AutoModel.from_config` on the meta device in fp32, `calculate_maximum_sizes`, halved for 16-bit.
  `AutoModel` is the base model, so an untied LM head is not counted; the tool's page says to add
  "up to an additional 20 %" for inference, shown as a second column.
"""


def render(rep: Report) -> str:
    ref = rep.versions.get("reference: torch / transformers", "? / ?").split(" / ")
    L: list[str] = [HEADER.format(torch=ref[0], transformers=ref[-1], threshold=REASON_THRESHOLD)]
    add = L.append
    add("## Summary")
    add("")
    L.extend(_summary(rep.grid))
    if rep.grid:
        kv_rows = [r for r in rep.grid if r.kv_measured]
        kv_exact = sum(1 for r in kv_rows if r.kv_ours == r.kv_measured)
        kv_errs = [abs((r.kv_ours or 0) - (r.kv_measured or 0)) / (r.kv_measured or 1) for r in kv_rows]
        add(
            f"- **KV cache bytes (DynamicCache)** ({len(kv_rows)} points): {kv_exact} exact to the byte; "
            f"median |error| {statistics.median(kv_errs) * 100:.2f} %, worst {max(kv_errs) * 100:.2f} %"
        )
    L.extend(_summary(rep.published))
    L.extend(_summary([*rep.train, *rep.train_phases]))
    L.extend(_summary(rep.train_published))
    if rep.train_bounds:
        agree = sum(1 for b in rep.train_bounds if b[-1] == "agree")
        add(f"- **published fits / OOM verdicts** ({len(rep.train_bounds)} points): {agree} agree")
    if rep.peers:
        add(
            f"- **peers, inference grid** ({len(rep.peers)} points), median |error|: "
            f"{_peer_summary(rep.peers, INFER_PEER_COLUMNS)}"
        )
    if rep.train_peers:
        add(
            f"- **peers, training grid** ({len(rep.train_peers)} full fine-tune points), median |error|: "
            f"{_peer_summary(rep.train_peers, TRAIN_PEER_COLUMNS)}"
        )
    worst = sorted([*rep.grid, *rep.published, *rep.train, *rep.train_published], key=lambda r: -abs(r.err))[
        :5
    ]
    if worst:
        add("")
        add("Largest errors:")
        add("")
        for r in worst:
            what = f" `{r.metric}`" if r.metric else ""
            add(f"1. {_pct(r.err)}{_gib_note(r)}: {r.setup}{what}")
    add("")
    add(f"## (a) PyTorch-measured grid: {len(rep.grid)} inference points")
    add("")
    add("| setup | measured peak (allocated) | ours | error % | error GiB | KV measured | KV ours | reason |")
    add("|---|---|---|---|---|---|---|---|")
    for r in rep.grid:
        kv_m = _fmt_value(r.kv_measured, "bytes") if r.kv_measured is not None else "-"
        kv_o = _fmt_value(r.kv_ours, "bytes") if r.kv_ours is not None else "-"
        add(
            f"| {r.setup} | {_fmt_value(r.measured, 'bytes')} | {_fmt_value(r.ours, 'bytes')} | "
            f"{_pct(r.err)} | {r.err_gib:+.3f} | {kv_m} | {kv_o} | {_esc(r.reason)} |"
        )
    add("")
    add("## (b) Published inference points")
    add("")
    add("### Mapping")
    add("")
    add("| id | model spec used | run | published line ↔ our number | assumptions |")
    add("|---|---|---|---|---|")
    for mid, model, run, numbers, assumptions in rep.mapping:
        add(f"| {mid} | {_esc(model)} | `{run}` | {_esc(numbers)} | {_esc(assumptions)} |")
    for table, title in (("llama.cpp", "llama.cpp buffers"), ("vllm", "vLLM profiles")):
        rows = [r for r in rep.published if r.table == table]
        if not rows:
            continue
        add("")
        add(f"### {title}")
        add("")
        add("| setup | measured (kind) | ours | error % | error GiB | reason |")
        add("|---|---|---|---|---|---|")
        for r in rows:
            add(
                f"| {_esc(r.setup)} | `{_esc(r.metric)}` ({r.kind}) | {_fmt_value(r.ours, r.unit)} | "
                f"{_pct(r.err)} | {r.err_gib:+.3f} | {_esc(r.reason)} |"
            )
    add("")
    add("### Not reproduced, and why")
    add("")
    add("| id | model | mode | why |")
    add("|---|---|---|---|")
    for pid, model, mode, why in rep.not_reproduced:
        add(f"| {pid} | {_esc(model)} | {_esc(mode)} | {_esc(why)} |")
    add("")
    _render_peers(rep, add)
    add("")
    _render_training(rep, add)
    add("")
    _render_real_gpu(add)
    add("")
    add("## Versions")
    add("")
    for k, v in rep.versions.items():
        add(f"- {k}: {v}")
    add("")
    return "\n".join(L)


TRAIN_INTRO = """\
* **Grid (PyTorch-measured, allocated bytes).** The same FakeTensorMode + MemTracker reference runs one
  optimizer step (steady state: the AdamW states exist before it) of the real transformers model:
  `train_amp_adamw` = fp32 weights under `torch.autocast(bfloat16)`, fp32 gradients and AdamW states
  (foreach) → our `precision="amp-bf16"`; `train_amp_adamw_gc` = the same with non-reentrant
  checkpointing of every decoder layer → `grad_ckpt=True`; `train_bf16_adamw` = everything bf16 →
  `precision="bf16"`; `lora_amp` / `lora_bf16` (`extra/grid_train.json`) = PEFT LoRA on a bf16 base with
  fp32 adapters, with / without autocast → `method="lora"`. Each phase peak is the tracker's peak inside
  that phase; ours is `Estimate.phases[...].peak_bytes`. One LoRA point was measured with CPU dropout
  (a noise tensor instead of CUDA's bool mask) and is replayed that way.
* **Published.** Which of our numbers stands for each published figure: allocated or active ↔
  `peak_bytes`; reserved ↔ `total_bytes − cuda_context` (= peak + cuBLAS workspace + allocator reserve:
  `max_memory_reserved` counts every block the caching allocator holds, the workspaces included, but not
  the CUDA context, so `peak + allocator reserve` alone would miss the workspace and `total` would add a
  context the allocator never sees); nvidia-smi ↔ `total_bytes` (no mapped training point is an nvidia-smi
  reading: the BERT ones are encoders). Multi-GPU rows (FSDP) are per GPU; our sharding is modelled from
  the FSDP / DeepSpeed source, not calibrated on a cluster.
"""


def _render_training(rep: Report, add: Callable[[str], None]) -> None:
    add(f"## (d) Training: {len(rep.train)} PyTorch-measured points and {len(rep.train_mapping)} published")
    add("")
    add(TRAIN_INTRO)
    add("### PyTorch-measured grid")
    add("")
    add(
        "| setup | measured peak | ours | error % | error GiB | forward meas / ours / err | backward meas / "
        "ours / err | optimizer meas / ours / err | reason |"
    )
    add("|---|---|---|---|---|---|---|---|---|")
    for r in rep.train:
        cells = " | ".join(f"{m / GiB:.3f} / {o / GiB:.3f} / {_pct((o - m) / m)}" for m, o in r.phases)
        add(
            f"| {r.setup} | {_fmt_value(r.measured, 'bytes')} | {_fmt_value(r.ours, 'bytes')} | "
            f"{_pct(r.err)} | {r.err_gib:+.3f} | {cells} | {_esc(r.reason)} |"
        )
    add("")
    _render_train_peers(rep, add)
    add("")
    add("### Published training points: mapping")
    add("")
    add("| id | model spec used | run | published figure ↔ our number | assumptions |")
    add("|---|---|---|---|---|")
    for mid, model, run, numbers, assumptions in rep.train_mapping:
        add(f"| {mid} | {_esc(model)} | `{run}` | {_esc(numbers)} | {_esc(assumptions)} |")
    add("")
    add("### Published training points: results")
    add("")
    add("| setup | published (kind) | measured | ours | error % | error GiB | reason |")
    add("|---|---|---|---|---|---|---|")
    for r in rep.train_published:
        gib = f"{r.err_gib:+.3f}" if r.unit == "bytes" else "-"
        add(
            f"| {_esc(r.setup)} | {_esc(r.metric)} ({r.kind}) | {_fmt_value(r.measured, r.unit)} | "
            f"{_fmt_value(r.ours, r.unit)} | {_pct(r.err)} | {gib} | {_esc(r.reason)} |"
        )
    if rep.train_bounds:
        add("")
        add("### Published fits / OOM points")
        add("")
        add("| id | setup | published | ours | verdict |")
        add("|---|---|---|---|---|")
        for b in rep.train_bounds:
            add("| " + " | ".join(_esc(x) for x in b) + " |")


def _render_real_gpu(add: Callable[[str], None]) -> None:
    """Section (e): each ``validation/gpu_results/*.json`` that ``validation/gpu_check.py`` wrote."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import gpu_compare

    add("## (e) Real GPU: allocated, reserved and NVML used")
    add("")
    add(
        "Measured by `validation/gpu_check.py` on a machine with an NVIDIA GPU (models built from their "
        "config.json with random weights, the same inference and training steps as the reference grid); "
        "`validation/gpu_compare.py` maps each figure to ours: allocated ↔ `peak_bytes`, reserved ↔ "
        "`total_bytes − cuda_context`, NVML used ↔ `total_bytes`. This is what calibrates the CUDA context, "
        "cuBLAS workspace and allocator reserve terms."
    )
    add("")
    files = gpu_compare.result_files()
    if not files:
        add(
            "**Not measured yet**: no GPU has been lent to this project so far, so the context (500 MiB), "
            "workspace (32 MiB) and allocator reserve (5 % of the non-weight peak) are the cited defaults "
            "of `gpumem_gui/core/results/overheads.py`, not calibrated. On any NVIDIA machine with torch and "
            "transformers: `python3 validation/gpu_check.py --out validation/gpu_results/<gpu>.json`, then "
            "`make validate`."
        )
        return
    for f in files:
        for line in gpu_compare.render(json.loads(f.read_text())):
            add(line)
        add("")
        add(f"(from `validation/gpu_results/{f.name}`)")
        add("")


PeerColumn = tuple[str, Callable[[dict], float | None], Callable[[dict], str | None]]

INFER_PEER_COLUMNS: list[PeerColumn] = [
    ("gpumem", lambda d: d["ours"], lambda d: None),
    ("llm-analysis", lambda d: d["llm_analysis"], lambda d: d["llm_analysis_error"]),
    ("accelerate", lambda d: d["accelerate"], lambda d: d["accelerate_error"]),
    (
        "accelerate +20 %",
        lambda d: d["accelerate"] * 1.2 if d["accelerate"] is not None else None,
        lambda d: None,
    ),
]
TRAIN_PEER_COLUMNS: list[PeerColumn] = [
    ("gpumem", lambda d: d["ours"], lambda d: None),
    ("llm-analysis", lambda d: d["llm_analysis"], lambda d: d["llm_analysis_error"]),
    ("accelerate, float16 row", lambda d: d["accelerate"], lambda d: d["accelerate_error"]),
    ("accelerate, float32 row", lambda d: d["accelerate_fp32"], lambda d: d["accelerate_error"]),
]


def _peer_errors(rows: list[dict], columns: list[PeerColumn]) -> dict[str, list[float]]:
    """|error| of every tool on every row where it gave a number."""
    errs: dict[str, list[float]] = {c[0]: [] for c in columns}
    for d in rows:
        for name, value, _ in columns:
            v = value(d)
            if v is not None:
                errs[name].append(abs(v - d["measured"]) / d["measured"])
    return errs


def _peer_summary(rows: list[dict], columns: list[PeerColumn]) -> str:
    errs = _peer_errors(rows, columns)
    return "; ".join(
        f"{name} {statistics.median(es) * 100:.1f} % (worst {max(es) * 100:.1f} %)"
        for name, es in errs.items()
        if es
    )


def _peer_table(add: Callable[[str], None], rows: list[dict], columns: list[PeerColumn]) -> None:
    """A setup | measured | one column per tool table, then each tool's median and worst |error|."""
    add("| setup | measured | " + " | ".join(c[0] for c in columns) + " |")
    add("|---|---|" + "---|" * len(columns))

    def cell(v: float | None, meas: float, err_text: str | None) -> str:
        if v is None:
            return f"n/a ({_esc(err_text)})" if err_text else "n/a"
        return f"{v / GiB:.3f} ({_pct((v - meas) / meas)})"

    for d in rows:
        m = d["measured"]
        cells = " | ".join(cell(value(d), m, why(d)) for _, value, why in columns)
        add(f"| {d['setup']} | {m / GiB:.3f} GiB | {cells} |")
    add("")
    for name, es in _peer_errors(rows, columns).items():
        if es:
            add(
                f"- **{name}**: {len(es)} points, median |error| {statistics.median(es) * 100:.1f} %, worst "
                f"{max(es) * 100:.1f} %"
            )


def _render_peers(rep: Report, add: Callable[[str], None]) -> None:
    add("## (c) Peers on the grid points")
    add("")
    if not rep.peers:
        add(rep.peers_note or "Peers were not run.")
        return
    add(PEERS_INTRO)
    _peer_table(add, rep.peers, INFER_PEER_COLUMNS)


TRAIN_PEERS_INTRO = """\
The full fine-tune points of the grid (neither peer models LoRA), each tool's training estimate against the
measured peak (allocated):

* **llm-analysis** `train()`: batch and sequence of the point on one GPU, `dtype_name="w16a16e16"`;
  amp-bf16 → fp32 master weights and fp32 Adam moments (its defaults, `master_weights_dtype_bytes=4`,
  `other_op_bytes=8`), pure bf16 → 2 and 4 bytes; checkpointing → `activation_recomputation=2` (full).
  Its figure is `(weight+op_state+grad+act)_memory_per_gpu`.
* **accelerate** `estimate-memory`'s "Training using Adam" column as its CLI computes it, from the fp32
  size of the meta-device `AutoModel` whatever the batch and sequence: the `float16` row (its
  mixed-precision case: the largest of fp32 model, fp32 + fp16 gradients and 2x fp32 optimizer states, so
  2x the fp32 size) and the `float32` row (4x the fp32 size). Its `--dtypes` has no bfloat16; which row a
  user should read for amp-bf16 is not said, so both are shown.
"""


def _render_train_peers(rep: Report, add: Callable[[str], None]) -> None:
    add("### Peers on the training grid")
    add("")
    if not rep.train_peers:
        add(rep.peers_note or "Peers were not run.")
        return
    add(TRAIN_PEERS_INTRO)
    _peer_table(add, rep.train_peers, TRAIN_PEER_COLUMNS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the Markdown report here (default: stdout)")
    ap.add_argument("--subset", action="store_true", help="a few grid points and three published points")
    ap.add_argument(
        "--refresh-peers",
        action="store_true",
        help=f"rerun llm-analysis ({PEERS_VENV}) and accelerate ({GT_VENV}) and rewrite {PEERS_FILE.name}",
    )
    args = ap.parse_args(argv)
    if args.refresh_peers:
        PEERS_FILE.write_text(json.dumps(refresh_peers(), indent=1, sort_keys=True) + "\n")
    peers = json.loads(PEERS_FILE.read_text()) if PEERS_FILE.is_file() else None
    text = render(collect(subset=args.subset, peers=peers))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
