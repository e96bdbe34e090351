"""PyTorch's own trackers with a peak per phase (and without their per-module snapshots, unused and slow)."""

from __future__ import annotations

from typing import Any


class NoHook:
    """A hook handle that removes nothing (for parameters MemTracker must not hook)."""

    def remove(self) -> None:
        return None


def names(snap: dict[Any, int]) -> dict[str, int]:
    return {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}


def flat(snap: dict[Any, dict[Any, int]]) -> dict[str, int]:
    """A per-device snapshot summed over devices, by category name (Parameter, Activation, ... Total)."""
    out: dict[str, int] = {}
    for d in snap.values():
        for k, v in names(d).items():
            out[k] = out.get(k, 0) + v
    return out


def _phased(base: type) -> type:
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY

    class Phased(base):  # type: ignore[misc, valid-type]
        """``base`` with ``phase_peaks``: the snapshot at the peak of every phase."""

        phase = "load"

        def _update_peak_stats(self, peak_state: Any) -> None:
            for dev, snap in self._curr_mem_snap.items():
                tot = snap[_TOTAL_KEY]
                if self._peak_mem.get(dev, 0) < tot:
                    self._peak_mem[dev] = tot
                    self._peak_mem_snap[dev] = dict(snap)
                rec = self.phase_peaks.get(self.phase)
                if rec is None or tot > rec["Total"]:
                    self.phase_peaks[self.phase] = names(snap)

        def current(self) -> dict[str, int]:
            return flat(self.get_tracker_snapshot("current"))

        def enter(self, phase: str, forward: bool = True) -> None:
            """Start ``phase`` (a phase met again keeps its higher peak); before a forward, module stats are
            reset, as the tracker refuses a module called twice otherwise (decode steps, micro-batches)."""
            if forward:
                self.reset_mod_stats()
            self.phase = phase
            cur = self.current()
            rec = self.phase_peaks.get(phase)
            if rec is None or cur.get("Total", 0) > rec.get("Total", 0):
                self.phase_peaks[phase] = cur

    return Phased


def memory_tracker() -> Any:
    """MemTracker with phase peaks; frozen parameters (a LoRA base) are not hooked for gradients, which
    MemTracker would otherwise try and fail to do."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class Tracker(_phased(MemTracker)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.phase_peaks: dict[str, dict[str, int]] = {}

        def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> Any:
            for p in module.parameters():
                if not p.requires_grad and self._param_to_grad_hook_handles.get(p, None) is None:
                    self._param_to_grad_hook_handles[p] = (NoHook(), NoHook())
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

    return Tracker()


def fsdp_tracker(model: Any, optimizer: Any) -> Any:
    """FSDPMemTracker (sharded and unsharded parameters, all-gather / reduce-scatter buffers) with phase
    peaks."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class Tracker(_phased(FSDPMemTracker)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(model, optimizer)
            self.phase_peaks = {}

    return Tracker()


def restart_peaks(tracker: Any) -> None:
    """Forget every peak so far (the warm-up iteration of a distributed step)."""
    tracker._peak_mem = {}
    tracker._peak_mem_snap = {}
    tracker.phase_peaks = {}
