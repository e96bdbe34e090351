"""The processes on one GPU (or MIG instance), for the NVML backend (:mod:`gpumem_gui.hardware.nvml`).

NVML's compute and graphics lists are merged per pid (a process in both is ``"compute+graphics"`` with the
larger of its two sizes); ``NoPermission`` on the compute list makes the processes unknown (``None``), on the
graphics list it leaves the compute processes alone. Names come from ``nvmlSystemGetProcessName``, else from
``/proc/<pid>/comm``, and are cached for as long as the pid is seen on some GPU.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpumem_gui.hardware.nvml_calls import NvmlCalls, text
from gpumem_gui.hardware.snapshot import GpuProcess, ProcessKind


class ProcessReader:
    """Reads process lists through ``calls``; ``proc_root`` is where ``/proc`` is."""

    def __init__(self, calls: NvmlCalls, proc_root: Path) -> None:
        self._calls = calls
        self._proc_root = proc_root
        self._names: dict[int, str | None] = {}

    def forget_all_but(self, seen_pids: set[int]) -> None:
        """Drop the cached names of processes no GPU showed in the last snapshot."""
        self._names = {pid: n for pid, n in self._names.items() if pid in seen_pids}

    def _process_list(self, handle: Any, fn_name: str) -> list[Any] | None:
        """One NVML process list; None when not supported. NoPermission propagates."""
        for name in (fn_name, f"{fn_name}_v2"):
            fn = getattr(self._calls.nv, name, None)
            if fn is None:
                continue
            try:
                return list(fn(handle))
            except Exception as e:
                # the binding's default (v3) missing in an older driver: try the _v2 entry point
                if self._calls.is_unsupported(e):
                    continue
                raise
        return None

    def processes(self, handle: Any, seen_pids: set[int]) -> tuple[GpuProcess, ...] | None:
        """The processes using ``handle``'s memory (their pids added to ``seen_pids``); None if unknown."""
        try:
            compute = self._process_list(handle, "nvmlDeviceGetComputeRunningProcesses")
        except Exception as e:
            if self._calls.is_code(e, "NO_PERMISSION"):
                return None
            raise
        if compute is None:
            return None
        try:
            graphics = self._process_list(handle, "nvmlDeviceGetGraphicsRunningProcesses") or []
        except Exception as e:
            if not self._calls.is_code(e, "NO_PERMISSION"):
                raise
            graphics = []
        merged = _merge(((compute, "compute"), (graphics, "graphics")))
        seen_pids.update(merged)
        return tuple(
            GpuProcess(pid=pid, name=self._process_name(pid), used_bytes=used, kind=kind)
            for pid, (used, kind) in sorted(merged.items())
        )

    def _process_name(self, pid: int) -> str | None:
        if pid in self._names:
            return self._names[pid]
        name: str | None = None
        try:
            full = self._calls.optional("nvmlSystemGetProcessName", pid)
        except Exception:
            full = None
        if full:
            name = os.path.basename(text(full).rstrip("/")) or None
        if name is None:
            try:
                name = (
                    (self._proc_root / str(pid) / "comm")
                    .read_text(encoding="utf-8", errors="replace")
                    .strip()
                )
            except OSError:
                name = None
        self._names[pid] = name or None
        return name or None


def _merge(
    lists: tuple[tuple[list[Any], ProcessKind], ...],
) -> dict[int, tuple[int | None, ProcessKind]]:
    """pid -> (bytes used, kind) over NVML's process lists; a pid in two lists is ``compute+graphics``."""
    merged: dict[int, tuple[int | None, ProcessKind]] = {}
    for procs, kind in lists:
        for p in procs:
            pid = int(p.pid)
            used = getattr(p, "usedGpuMemory", None)
            used = int(used) if used is not None else None
            if pid in merged:
                known = [u for u in (merged[pid][0], used) if u is not None]
                merged[pid] = (max(known) if known else None, "compute+graphics")
            else:
                merged[pid] = (used, kind)
    return merged
