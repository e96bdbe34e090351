"""vLLM's memory lines at startup (and the one that refuses to start), one record per worker and startup.

Sources (vLLM's own log calls; sizes in GiB = 2^30: ``GiB_bytes = 1 << 30`` in ``vllm/utils``, and the V0
"GB" of ``model_runner.py`` is ``/ float(2**30)`` too):

* V0 ``worker.py`` ``determine_num_available_blocks`` (2025): "the current vLLM instance can use
  total_gpu_memory (T GiB) x gpu_memory_utilization (u) = B GiB" and "model weights take W GiB;
  non_torch_memory takes N GiB; PyTorch activation peak memory takes A GiB; the rest of the memory reserved
  for KV Cache is K GiB." (a negative K or N is printed as such: named unread);
* the same figures as ``vllm/pull/10511`` printed them one per line ("total_gpu_memory     79.22GiB", ...
  "available_kv_cache_memory    53.29GiB");
* V1 ``gpu_worker.py``: "Available KV cache memory: K GiB", ``gpu_model_runner.py`` "Model loading took W
  GiB", the startup check "Free memory on device [cuda:d ](F/T GiB) on startup" (its refusal, "... is less
  than desired GPU memory utilization (u, B GiB)", from ``v1/worker/utils.py`` ``request_memory``), and
  "Actual usage is W GiB for weight, A GiB for peak activation, N GiB for non-torch memory, and G GiB for
  CUDAGraph memory"; "Graph capturing finished in S secs, took G GiB".

T -> total_bytes (CUDA's total, torch.cuda.mem_get_info), F -> free_bytes, B (T x u, the instance's budget)
-> allowed_bytes; W, N, A, K, G -> parts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpumem_gui.core.observed.draft import Draft
from gpumem_gui.core.observed.engine_log import read_log

_N = r"(-?\d+(?:\.\d+)?)\s*"  # a GiB figure as vLLM prints it ("%.2f" or "%.4f"; negative when it overdraws)
_LINES: tuple[tuple[str, re.Pattern[str], tuple[str, ...]], ...] = (
    (
        "budget",
        re.compile(rf"total_gpu_memory \({_N}GiB\) x gpu_memory_utilization \([\d.]+\) = {_N}GiB"),
        ("total_bytes", "allowed_bytes"),
    ),
    (
        "split",
        re.compile(
            rf"model weights take {_N}GiB; non_torch_memory takes {_N}GiB; PyTorch activation peak memory "
            rf"takes {_N}GiB; the rest of the memory reserved for KV Cache is {_N}GiB"
        ),
        ("weights", "non_torch", "activation_peak", "kv_cache"),
    ),
    ("total", re.compile(rf"\btotal_gpu_memory\s+{_N}GiB"), ("total_bytes",)),
    ("budget_line", re.compile(rf"the current vLLM instance can use\s+{_N}GiB"), ("allowed_bytes",)),
    ("weights_line", re.compile(rf"model weights take\s+{_N}GiB\s*$"), ("weights",)),
    ("non_torch_line", re.compile(rf"\bnon_torch_memory\s+{_N}GiB"), ("non_torch",)),
    ("activation_line", re.compile(rf"PyTorch activation peak memory\s+{_N}GiB"), ("activation_peak",)),
    ("kv_line", re.compile(rf"available_kv_cache_memory\s+{_N}GiB"), ("kv_cache",)),
    ("kv_v1", re.compile(rf"Available KV cache memory: {_N}GiB"), ("kv_cache",)),
    ("load", re.compile(rf"(?:Model loading|Loading model weights) took {_N}(?:GiB|GB)"), ("weights",)),
    (
        "free",  # "Free memory on device cuda:1 (19.77/22.05 GiB) on startup" (older: "on device (")
        re.compile(rf"Free memory on device(?: [a-z]+:(\d{{1,4}}))? \({_N}/{_N}GiB\) on startup"),
        ("gpu_index", "free_bytes", "total_bytes"),
    ),
    (
        "desired",
        re.compile(rf"desired GPU memory utilization(?: is)? \([\d.]+, {_N}GiB\)", re.I),
        ("allowed_bytes",),
    ),
    (
        "actual",
        re.compile(
            rf"Actual usage is {_N}GiB for weight, {_N}GiB for peak activation, {_N}GiB for non-torch "
            rf"memory, and {_N}GiB for CUDAGraph memory"
        ),
        ("weights", "activation_peak", "non_torch", "cuda_graphs"),
    ),
    ("graphs", re.compile(rf"Graph capturing finished in \d+ secs, took {_N}GiB"), ("cuda_graphs",)),
)
_MARKERS = ("GiB", " GB")  # every line read states a size in one of these


def find(text: str) -> Iterator[tuple[int, Draft]]:
    """Every vLLM worker's memory lines in ``text``: (offset of its first line, record)."""
    return read_log(text, "vllm", _read_line, _MARKERS)


def _read_line(d: Draft, line: str) -> list[str]:
    kinds = []
    for kind, pattern, targets in _LINES:
        m = pattern.search(line)
        if m is None:
            continue
        kinds.append(kind)
        for target, number in zip(targets, m.groups(), strict=True):
            what = f"vLLM {target.removesuffix('_bytes')}"
            if target == "gpu_index":
                d.gpu_index = int(number) if number is not None else None
            elif target.endswith("_bytes"):
                d.size(target, number, "GiB", what)
            else:
                d.part(target, number, "GiB", what)
    return kinds
