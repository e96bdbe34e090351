"""SGLang's memory lines at startup, one record per TP rank and startup.

Source: ``sglang/srt/model_executor/model_runner.py`` (``init_torch_distributed``: "Init torch distributed
ends. mem usage=N GB"; ``load_model``: "Load weight begin. avail mem=F GB", "Load weight end. ...
avail mem=F GB, mem usage=W GB."; ``init_memory_pool``: "Memory pool end. avail mem=F GB"), its
``cuda_graph_runner.py`` ("Capture cuda graph end. Time elapsed: S s. mem usage=G GB. avail mem=F GB.")
and ``sglang/srt/mem_cache/memory_pool.py`` ("KV Cache is allocated. #tokens: n, K size: a GB, V size: b
GB", or "KV size: c GB" for a latent (MLA) pool). SGLang's "GB" is 2^30 bytes: ``get_available_gpu_memory``
returns ``torch.cuda.mem_get_info()[0] / (1 << 30)`` and memory_pool.py divides by ``GB = 1024 * 1024 *
1024``. The free figure kept is the last one the rank states (its free memory when the log was pasted);
SGLang states no total.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpumem_gui.core.observed.draft import Draft
from gpumem_gui.core.observed.engine_log import read_log

_N = r"(\d+(?:\.\d+)?)"
_LINES: tuple[tuple[str, re.Pattern[str], tuple[str, ...]], ...] = (
    ("dist", re.compile(rf"Init torch distributed ends\. mem usage={_N} GB"), ("non_torch",)),
    ("load_begin", re.compile(rf"Load weight begin\. avail mem={_N} GB"), ("free_bytes",)),
    (
        "load_end",
        re.compile(rf"Load weight end\..{{0,300}}?avail mem={_N} GB, mem usage={_N} GB"),
        ("free_bytes", "weights"),
    ),
    (
        "kv",
        re.compile(rf"KV Cache is allocated\..{{0,300}}?K size: {_N} GB, V size: {_N} GB"),
        ("kv_cache_k", "kv_cache_v"),
    ),
    ("kv_mla", re.compile(rf"KV Cache is allocated\..{{0,300}}?\bKV size: {_N} GB"), ("kv_cache",)),
    ("pool_end", re.compile(rf"Memory pool end\. avail mem={_N} GB"), ("free_bytes",)),
    (
        "graph_end",
        re.compile(rf"Capture cuda graph end\..{{0,300}}?mem usage={_N} GB\. avail mem={_N} GB"),
        ("cuda_graphs", "free_bytes"),
    ),
)
_MARKERS = (" GB",)


def find(text: str) -> Iterator[tuple[int, Draft]]:
    """Every SGLang rank's memory lines in ``text``: (offset of its first line, record)."""
    return read_log(text, "sglang", _read_line, _MARKERS)


def _read_line(d: Draft, line: str) -> list[str]:
    for kind, pattern, targets in _LINES:
        m = pattern.search(line)
        if m is None:
            continue
        for target, number in zip(targets, m.groups(), strict=True):
            what = f"SGLang {kind} {target.removesuffix('_bytes')}"
            if target.endswith("_bytes"):
                d.size(target, number, "GiB", what)  # SGLang's "GB" is 2^30 bytes (module docstring)
            else:
                d.part(target, number, "GiB", what)
        return [kind]
    return []
