"""Fake-GPU scenario helpers shared by tests/test_hardware_fake_*.py."""

from __future__ import annotations

MiB = 1 << 20
SHIPPED = ["8xh100_busy", "a100_mig", "gpu_lost", "no_driver", "rtx4090_browser"]


def one_gpu(**gpu: object) -> dict:
    return {"gpus": [{"name": "NVIDIA GeForce RTX 4090", "total_mib": 24564, **gpu}]}
