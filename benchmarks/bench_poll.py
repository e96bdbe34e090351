"""Cost of one GPU poll, per GPU, on fake backends (no GPU is needed).

Measures our own code's share of a poll; on real hardware each NVML call also costs the driver's time, which
no fake can show.

* ``NvmlBackend.snapshot()`` over the scripted ``pynvml`` stand-in the tests use (``tests/fake_nvml.py``)
  with 1, 2, 4 and 8 GPUs (each with three processes), and an A100 in MIG mode (three instances): the real
  NVML code path (memory v2, utilisation, temperature, power, process lists, MIG walk, CUDA numbering);
  the per-GPU cost is the least-squares slope over the GPU counts.
* ``FakeBackend.snapshot()`` for the shipped scenarios (what ``--fake-gpus`` polls).
* ``GpuPoller.poll_once()`` on the 8-GPU fake backend: the worker's whole poll including the Qt signal
  emission (a ``QCoreApplication``, no window).

    .venv/bin/python benchmarks/bench_poll.py [--min-time 0.5] [--json]

Never run by the test suite (``benchmarks/report.py`` runs it for ``docs/performance.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.fake_nvml: the pynvml stand-in the test suite scripts GPUs with

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from benchmarks.bench_core import fmt_time, measure  # noqa: E402
from gpumem_gui.hardware import FakeBackend  # noqa: E402
from gpumem_gui.hardware.nvml import NvmlBackend  # noqa: E402
from tests.fake_nvml import FakeGpu, FakeNvml, FakeProc, a100_with_migs  # noqa: E402

MiB = 1 << 20
GPU_COUNTS = (1, 2, 4, 8)


def fake_gpus(n: int) -> list[FakeGpu]:
    return [
        FakeGpu(
            name="NVIDIA H100 80GB HBM3",
            uuid=f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000",
            bus_id=f"00000000:{i + 1:02x}:00.0".encode(),
            total=81559 * MiB,
            used=(20_000 + 1000 * i) * MiB,
            compute=[FakeProc(1000 + 10 * i + k, 4096 * MiB) for k in range(3)],
        )
        for i in range(n)
    ]


def nvml_backend(gpus: list[FakeGpu]) -> NvmlBackend:
    names = {p.pid: f"python{p.pid}" for g in gpus for p in g.compute}
    backend = NvmlBackend(
        nvml_module=FakeNvml(gpus, process_names=names),
        cuda_visible_devices=None,
        proc_root=Path("/nonexistent-proc"),
    )
    backend.snapshot()  # lazy init and the static facts (name, UUID, PCI) are read once, on the first poll
    return backend


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def run(min_time: float) -> dict[str, object]:
    nvml: dict[str, float] = {}
    for n in GPU_COUNTS:
        b = nvml_backend(fake_gpus(n))
        nvml[str(n)] = measure(b.snapshot, min_time)[0]
        b.close()
    mig = nvml_backend([a100_with_migs()])
    mig_s = measure(mig.snapshot, min_time)[0]
    mig.close()
    per_gpu = slope([float(n) for n in GPU_COUNTS], [nvml[str(n)] for n in GPU_COUNTS])

    fake: dict[str, float] = {}
    for scenario in ("rtx4090_browser", "8xh100_busy", "a100_mig"):
        fb = FakeBackend(scenario, cuda_visible_devices=None)
        fake[scenario] = measure(fb.snapshot, min_time)[0]
        fb.close()

    from PySide6.QtCore import QCoreApplication

    from gpumem_gui.ui.gpu_poller import GpuPoller

    app = QCoreApplication.instance() or QCoreApplication(sys.argv[:1])
    backend = FakeBackend("8xh100_busy", cuda_visible_devices=None)
    poller = GpuPoller(backend)
    got: list[int] = []
    poller.snapshot_ready.connect(lambda s: got.append(len(s.devices)))
    poll_s = measure(poller.poll_once, min_time)[0]
    backend.close()
    del app
    return {
        "nvml_fake_snapshot_s": nvml,
        "nvml_fake_per_gpu_s": per_gpu,
        "nvml_fake_fixed_s": nvml["1"] - per_gpu,
        "nvml_fake_a100_mig_3_instances_s": mig_s,
        "fake_backend_snapshot_s": fake,
        "poll_once_8xh100_fake_s": poll_s,
        "poll_once_devices": got[-1] if got else 0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds per measurement (default 0.5)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    r = run(args.min_time)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    for n, s in r["nvml_fake_snapshot_s"].items():  # type: ignore[union-attr]
        print(f"NvmlBackend.snapshot(), {n} fake GPU(s): {fmt_time(s)}")
    print(f"  per GPU (slope): {fmt_time(r['nvml_fake_per_gpu_s'])}")  # type: ignore[arg-type]
    print(f"NvmlBackend.snapshot(), A100 MIG x3: {fmt_time(r['nvml_fake_a100_mig_3_instances_s'])}")  # type: ignore[arg-type]
    for name, s in r["fake_backend_snapshot_s"].items():  # type: ignore[union-attr]
        print(f"FakeBackend.snapshot() {name}: {fmt_time(s)}")
    print(f"GpuPoller.poll_once() 8 GPUs: {fmt_time(r['poll_once_8xh100_fake_s'])}")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
