"""core/sweep.py: the sweep the CLI and the window share."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpumem_gui.core import load_model
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.fit import DEFAULT_MARGIN_BYTES, GpuTarget, verdicts
from gpumem_gui.core.fit.sweep import evenly_spaced, sweep
from gpumem_gui.core.readers.catalog import find_gpu
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run
from gpumem_gui.core.training import estimate_training, make_training_run


@pytest.fixture(scope="module")
def spec():  # type: ignore[no-untyped-def]
    s = load_model("Qwen/Qwen2.5-0.5B").spec
    assert s is not None
    return s


def test_each_point_is_the_estimate_of_that_run(spec) -> None:  # type: ignore[no-untyped-def]
    run = make_run(batch=2, seq=1024)
    target = GpuTarget(name="RTX-4090", capacity_bytes=find_gpu("RTX-4090").memory_bytes)
    points = sweep(spec, run, "seq", [512, 4096, 32768], target)
    assert [p.x for p in points] == [512, 4096, 32768]
    for p in points:
        est = estimate_inference(spec, make_run(batch=2, seq=p.x), target.capacity_bytes)
        assert (p.peak_bytes, p.total_bytes, p.kv_cache_bytes) == (
            est.peak_bytes,
            est.total_bytes,
            est.kv_cache_bytes,
        )
        assert p.fits == all(v.fits for v in verdicts(est, target, DEFAULT_MARGIN_BYTES))
    assert points[0].peak_bytes < points[1].peak_bytes < points[2].peak_bytes


def test_training_sweep_over_batch(spec) -> None:  # type: ignore[no-untyped-def]
    run = make_training_run(method="lora", batch=1, seq=512)
    points = sweep(spec, run, "batch", [1, 4])
    assert [p.fits for p in points] == [None, None]
    assert (
        points[1].peak_bytes
        == estimate_training(spec, make_training_run(method="lora", batch=4, seq=512)).peak_bytes
    )


@pytest.mark.parametrize("bad", [0, -5, (1 << 24) + 1])
def test_a_value_outside_the_fields_range_is_an_input_error(spec, bad: int) -> None:  # type: ignore[no-untyped-def]
    run = make_run(batch=1, seq=1024)
    with pytest.raises(GpumemInputError) as e:
        sweep(spec, run, "seq", [512, bad])
    assert e.value.field == "seq"
    assert [p.x for p in sweep(spec, run, "seq", [512, bad, 1024], skip_invalid=True)] == [512, 1024]


@given(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(1, 300))
def test_evenly_spaced(a: int, b: int, n: int) -> None:
    lo, hi = min(a, b), max(a, b)
    xs = evenly_spaced(lo, hi, n)
    assert xs == sorted(set(xs)) and len(xs) <= n
    assert all(lo <= x <= hi for x in xs)
    assert xs[0] == lo and (n == 1 or xs[-1] == hi)
