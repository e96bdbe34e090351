"""The published inference-engine logs of ``validation/data/engine_logs/`` against our estimate: one
:class:`LogRow` per published figure of vLLM, SGLang, llama.cpp and Ollama.

This is the one comparison: ``tests/test_{vllm,sglang,llamacpp,ollama}_logs.py`` hold their accuracy bars on
these rows and section (i) of ``validation/validate.py`` shows them (``engines.py``), so the tests and the
report cannot disagree. Each data file's ``about`` says what its points and metric kinds are.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from gpumem_gui.core.gpu_memory import GpuMemory
from gpumem_gui.core.readers.catalog import find_gpu, load_gpu_catalog
from gpumem_gui.core.results.estimate import Estimate
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run
from gpumem_gui.core.runtimes.llamacpp import kv_row_widths

from .common import DATA_DIR, REPO, GiB, MiB, spec_for

ENGINE_LOGS = DATA_DIR / "engine_logs"
UNIT_BYTES: dict[str, float] = {"GiB": GiB, "MiB": MiB}  # the other units are counts (tokens, x, ...)
FILES = {
    "vLLM": "vllm",
    "SGLang": "sglang",
    "llama.cpp": "llamacpp",
    "Ollama": "ollama",
}  # engine -> data file


@dataclass(frozen=True)
class LogRow:
    """One published figure and ours for the same setup, both in ``unit``."""

    engine: str  # vLLM | SGLang | llama.cpp | Ollama
    point: str  # the point's id in its data file
    file: str  # the data file, relative to the repository
    source: str
    model: str  # the gpumem catalog model the estimate used
    gpu: str
    tp: int
    metric: str  # the file's metric kind
    published: float
    ours: float
    unit: str  # GiB | MiB | tokens | x | blocks | requests | elements | layers
    reason: str | None = None  # why the figure is off (the data's ``outside``: known off by more than 15 %)
    shown: str | None = None  # Ollama: the figure as printed (``3.7 GiB``), matched when ours rounds to it
    note: str | None = None  # the point's ``notes`` (what the data says of the log), whatever the error

    @property
    def raw_err(self) -> float:
        if not self.published:  # a count of zero (a CPU-only run offloads 0 layers): exact or infinitely off
            return 0.0 if self.ours == self.published else math.inf
        return (self.ours - self.published) / self.published

    @property
    def as_shown(self) -> bool:
        """Ours rounds to the figure the log printed (to half its last digit: Ollama's HumanBytes2)."""
        if self.shown is None:
            return False
        decimals = len(self.shown.split()[0].partition(".")[2])
        return abs(self.ours - self.published) <= 0.5 * 10**-decimals + 1e-9

    @property
    def err(self) -> float:
        """The error that counts: 0 for a figure ours rounds to, else relative to the published figure."""
        return 0.0 if self.as_shown else self.raw_err

    @property
    def scale(self) -> float:
        """Bytes per ``unit`` (1 for counts)."""
        return UNIT_BYTES.get(self.unit, 1.0)


def _doc(name: str) -> dict[str, Any]:
    return json.loads((ENGINE_LOGS / f"{name}.json").read_text())


def document(engine: str) -> dict[str, Any]:
    """An engine's data file (``about``, ``points``; SGLang's also ``constants``)."""
    return _doc(FILES[engine])


def file_of(engine: str) -> str:
    """The engine's data file, relative to the repository."""
    return str((ENGINE_LOGS / f"{FILES[engine]}.json").relative_to(REPO))


# ---- vLLM ------------------------------------------------------------------------------------------------


def _vllm_capacity(value: object) -> GpuMemory | int | None:
    """The log's total GPU memory: a GPU catalog id (its nvidia-smi and CUDA totals), or the GiB vLLM printed
    (CUDA's total, the one vLLM reads)."""
    if value is None:
        return None
    if isinstance(value, str):
        return find_gpu(value).gpu_memory
    return round(float(value) * GiB)  # type: ignore[arg-type]


def vllm_ours(point: dict[str, Any]) -> dict[str, float]:
    """Our number for every vLLM metric kind of one point (GiB, tokens, x or blocks)."""
    run = make_run(**point["run"])
    est = estimate_inference(spec_for(point["model"]), run, capacity=_vllm_capacity(point["capacity_gib"]))
    comp = {c.key: c.bytes / GiB for c in est.components}
    f = est.facts
    out = {k: comp[k] for k in ("weights", "activations", "non_torch", "cudagraph")}
    if "kv_pool_bytes" in f:
        out |= {
            "kv_pool": f["kv_pool_bytes"] / GiB,  # type: ignore[operator]
            "kv_tokens": f["kv_tokens"],
            "concurrency": f["max_concurrency"],
            "gpu_blocks": f["gpu_blocks"],
        }  # type: ignore[dict-item]
    if "pool_gib" in point and "kv_block_bytes" in f:  # sliding-window layers: vLLM's KV groups
        blocks = int(point["pool_gib"] * GiB // f["kv_block_bytes"])  # type: ignore[operator]
        # the block size vLLM raised for a hybrid with state layers, else the run's
        out["kv_tokens_for_pool"] = blocks // f["kv_groups"] * f["block_size"]  # type: ignore[operator]
        out["concurrency_for_pool"] = blocks / f["kv_blocks_per_request"]  # type: ignore[operator]
    elif "pool_gib" in point:  # the token count vLLM derives from the pool it logged: the per-rank page alone
        page = run.block_size * f["kv_bytes_per_token"]  # type: ignore[operator]
        tokens = int(point["pool_gib"] * GiB // page) * run.block_size
        out["kv_tokens_for_pool"] = tokens
        out["concurrency_for_pool"] = tokens / f["max_model_len"]  # type: ignore[operator]
    return out


def _vllm_rows() -> list[LogRow]:
    rows = []
    for p in _doc("vllm")["points"]:
        o = vllm_ours(p)
        for m in p["metrics"]:
            rows.append(_row("vLLM", p, p["gpu"], m["kind"], m["value"], o[m["kind"]], m["unit"]))
    return rows


# ---- SGLang ----------------------------------------------------------------------------------------------

SGLANG_UNITS = {"max_total_num_tokens": "tokens", "max_running_requests": "requests"}  # the others: *_gib


def sglang_gpu_bytes(gpu: str) -> GpuMemory:
    """The memory of a GPU catalog id, as SGLang's point names it: nvidia-smi's total (SGLang's defaults) and
    CUDA's (its pool)."""
    return next(g.gpu_memory for g in load_gpu_catalog() if g.id == gpu)


def sglang_ours(point: dict[str, Any]) -> dict[str, float]:
    """Our number for every SGLang metric of one point (GiB or counts)."""
    est = estimate_inference(
        spec_for(point["model"]), make_run(**point["run"]), capacity=sglang_gpu_bytes(point["gpu"])
    )
    comp = {c.key: c.bytes for c in est.components}
    return {
        "max_total_num_tokens": est.facts["max_total_num_tokens"],  # type: ignore[dict-item]
        "pre_load_free_gib": est.facts["pre_load_free_bytes"] / GiB,  # type: ignore[operator]
        "load_gib": comp["weights"] / GiB,
        "kv_gib": comp["kv_cache"] / GiB,
        "cuda_graph_gib": comp["cudagraph"] / GiB,
        "max_running_requests": est.facts["max_running_requests"],  # type: ignore[dict-item]
    }


def _sglang_rows() -> list[LogRow]:
    rows = []
    for p in _doc("sglang")["points"]:
        o = sglang_ours(p)
        for kind, value in p["measured"].items():
            unit = SGLANG_UNITS.get(kind, "GiB")
            rows.append(_row("SGLang", p, p["gpu"], kind, value, o[kind], unit))
    return rows


# ---- llama.cpp -------------------------------------------------------------------------------------------


_LLAMACPP_BUFFERS = {  # a buffer line's kind -> our component (or fact)
    "model_buffer": "weights",
    "host_buffer": "cpu_bytes",
    "kv_buffer": "kv_cache",
    "compute_buffer": "compute_buffer",
}


def _llamacpp_rows() -> list[LogRow]:
    """The per-layer K and V row widths of ``llama_kv_cache_init`` (elements), and KV / compute buffer lines
    (MiB) of logs not in section (b) (the buffer lines of validation/data/published_inference.json)."""
    rows = []
    for p in _doc("llamacpp")["points"]:
        spec, run = spec_for(p["model"]), make_run(**p["run"])
        k, v = kv_row_widths(spec, run)
        ours: dict[str, float] = {"kv_width_k": k, "kv_width_v": v}
        if any(m["kind"] in _LLAMACPP_BUFFERS for m in p["metrics"]):
            est = estimate_inference(spec, run)
            comp = {c.key: c.bytes for c in est.components} | {"cpu_bytes": est.facts["cpu_bytes"]}
            ours |= {kind: comp[key] / MiB for kind, key in _LLAMACPP_BUFFERS.items()}  # type: ignore[operator]
        for m in p["metrics"]:
            gpu = p.get("gpu", "not stated")
            unit = m.get("unit", "elements")
            rows.append(_row("llama.cpp", p, gpu, m["kind"], m["value"], ours[m["kind"]], unit))
    return rows


# ---- Ollama ----------------------------------------------------------------------------------------------

_OLLAMA_COMPONENT = {
    "llamacpp_model": "weights",
    "llamacpp_kv": "kv_cache",
    "llamacpp_compute": "compute_buffer",
}


@cache
def ollama_estimate(pid: str) -> Estimate:
    """The estimate of one Ollama point, on the free memory its log printed (null: every layer on the GPU)."""
    p = next(q for q in _doc("ollama")["points"] if q["id"] == pid)
    free = None if p["free_gib"] is None else round(p["free_gib"] * GiB)
    return estimate_inference(spec_for(p["model"]), make_run(**p["run"]), free)


def ollama_ours(est: Estimate, kind: str) -> float:
    """Our figure of an Ollama metric ``kind``, in bytes (layers: a count)."""
    if kind == "ollama_layers":
        return int(est.facts["ollama_layers"])  # type: ignore[arg-type]
    if kind in _OLLAMA_COMPONENT:
        return next(c.bytes for c in est.components if c.key == _OLLAMA_COMPONENT[kind])
    if kind == "llamacpp_host":
        return float(est.facts["cpu_bytes"])  # type: ignore[arg-type]
    if kind.startswith("ollama_allocation_"):  # GPU i's entry of memory.required.allocations
        return float(str(est.facts["ollama_allocations"]).split(",")[int(kind.rpartition("_")[2])])
    return float(est.facts[kind])  # type: ignore[arg-type]


def _ollama_rows() -> list[LogRow]:
    rows = []
    for p in _doc("ollama")["points"]:
        est = ollama_estimate(p["id"])
        for m in p["metrics"]:
            ours = ollama_ours(est, m["kind"]) / UNIT_BYTES.get(m["unit"], 1.0)
            shown = None if m["unit"] == "layers" else m["shown"]
            rows.append(_row("Ollama", p, p["gpu"], m["kind"], m["value"], ours, m["unit"], shown))
    return rows


# ---- all -------------------------------------------------------------------------------------------------


def _row(
    engine: str,
    p: dict[str, Any],
    gpu: str,
    kind: str,
    value: float,
    ours: float,
    unit: str,
    shown: str | None = None,
) -> LogRow:
    return LogRow(
        engine=engine,
        point=p["id"],
        file=file_of(engine),
        source=p["source"],
        model=p["model"],
        gpu=gpu,
        tp=int(p["run"].get("tp", 1)),
        metric=kind,
        published=float(value),
        ours=float(ours),
        unit=unit,
        reason=p.get("outside", {}).get(kind),
        shown=shown,
        note=p.get("notes"),
    )


ENGINES: dict[str, Callable[[], list[LogRow]]] = {
    "vLLM": _vllm_rows,
    "SGLang": _sglang_rows,
    "llama.cpp": _llamacpp_rows,
    "Ollama": _ollama_rows,
}


@cache
def engine_rows(engine: str) -> tuple[LogRow, ...]:
    """Every published figure of one engine's log file, in the file's order."""
    return tuple(ENGINES[engine]())


@cache
def quotes(engine: str) -> dict[str, tuple[str, str]]:
    """Each point's (source, quote) by id: how section (i) finds a line section (b) also compares."""
    return {p["id"]: (p["source"], p.get("quote", "")) for p in _doc(FILES[engine])["points"]}
