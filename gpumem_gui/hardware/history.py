"""A bounded, per-GPU history of used memory, fed by snapshots (for sparklines). Pure Python, no Qt.

Each device (by :attr:`~gpumem_gui.hardware.snapshot.GpuDevice.key`, so MIG instances have their own) keeps
``(taken_at, used_bytes)`` points no older than ``max_age_s`` (default 5 minutes) behind the newest snapshot,
and never more than ``max_points``. A lost GPU or an unknown reading adds a ``None`` point (a gap). A device
that stops appearing is forgotten once its newest point is older than ``max_age_s``. If the clock jumps
backwards, the whole history starts again.
"""

from __future__ import annotations

from collections import deque

from gpumem_gui.hardware.snapshot import GpuSnapshot

Point = tuple[float, int | None]


class MemoryHistory:
    """Used memory over time, per device; feed it with :meth:`add`."""

    def __init__(self, max_age_s: float = 300.0, max_points: int = 10_000) -> None:
        if max_age_s <= 0:
            raise ValueError("max_age_s must be positive")
        if max_points < 1:
            raise ValueError("max_points must be at least 1")
        self.max_age_s = float(max_age_s)
        self.max_points = int(max_points)
        self._series: dict[str, deque[Point]] = {}
        self._totals: dict[str, int | None] = {}
        self._newest: float | None = None

    def add(self, snapshot: GpuSnapshot) -> None:
        """Record every device of ``snapshot``; drop what is now too old."""
        t = snapshot.taken_at
        if self._newest is not None and t < self._newest:
            self.clear()  # the clock went backwards: start again
        self._newest = t
        for device in snapshot.devices:
            series = self._series.get(device.key)
            if series is None:
                series = self._series[device.key] = deque(maxlen=self.max_points)
            series.append((t, device.used_bytes))
            if device.total_bytes is not None:
                self._totals[device.key] = device.total_bytes
        self._evict(t - self.max_age_s)

    def _evict(self, cutoff: float) -> None:
        for key in list(self._series):
            series = self._series[key]
            while series and series[0][0] < cutoff:
                series.popleft()
            if not series:
                del self._series[key]
                self._totals.pop(key, None)

    def keys(self) -> list[str]:
        """Devices with history, in first-seen order."""
        return list(self._series)

    def series(self, key: str) -> tuple[Point, ...]:
        """``(taken_at, used_bytes or None)`` points of one device, oldest first."""
        return tuple(self._series.get(key, ()))

    def total_bytes(self, key: str) -> int | None:
        """The device's last known total memory (for scaling a sparkline)."""
        return self._totals.get(key)

    def peak_used_bytes(self, key: str) -> int | None:
        values = [u for _, u in self._series.get(key, ()) if u is not None]
        return max(values) if values else None

    def clear(self) -> None:
        self._series.clear()
        self._totals.clear()
        self._newest = None

    def __len__(self) -> int:
        return sum(len(s) for s in self._series.values())
