"""A fit report whose answer is no longer wanted stops at its next estimate (core/cancel.py), and the window's
worker drops it without a word: a form change never waits for the report of the inputs before it."""

from __future__ import annotations

import threading

import pytest

from gpumem_gui.core import (
    InferenceRun,
    Superseded,
    cancellable,
    fit_report,
    fit_training,
    gpu_target_from_text,
    load_model,
    make_training_run,
)
from gpumem_gui.core.cancel import checkpoint


@pytest.fixture(scope="module")
def spec():
    return load_model("meta-llama/Llama-3.1-8B").spec


def _after(n: int) -> tuple[list[int], object]:
    """A stop() that says yes from its n-th call on, and the count of its calls."""
    calls = [0]

    def stop() -> bool:
        calls[0] += 1
        return calls[0] >= n

    return calls, stop


def test_checkpoint_does_nothing_outside_cancellable() -> None:
    checkpoint()
    with cancellable(lambda: False):
        checkpoint()


def test_a_training_fit_stops_at_the_estimate_after_stop_says_so(spec) -> None:
    run = make_training_run(method="full", seq=2048)
    target = gpu_target_from_text("RTX-4090")
    calls, stop = _after(3)
    with pytest.raises(Superseded), cancellable(stop):
        fit_training(spec, run, target)
    assert calls[0] == 3  # not one estimate more
    # the same call unstopped runs to its end and gives the report it always gave
    calls, never = _after(10**9)
    with cancellable(never):
        rep = fit_training(spec, run, target)
    assert rep.max_batch is None and calls[0] > 10  # every search step and change asked


def test_an_inference_fit_stops_too(spec) -> None:
    calls, stop = _after(1)
    with pytest.raises(Superseded), cancellable(stop):
        fit_report(spec, InferenceRun(batch=4, seq=4096), gpu_target_from_text("RTX-4090"))
    assert calls[0] == 1


def test_the_stop_belongs_to_the_thread_that_set_it(spec) -> None:
    """A call in another thread (the window's worker beside a CLI call, two workers) is never stopped."""
    errors: list[BaseException] = []

    def other() -> None:
        try:
            checkpoint()
        except BaseException as e:  # the test reports whatever it was
            errors.append(e)

    with cancellable(lambda: True):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        with pytest.raises(Superseded):
            checkpoint()
    assert errors == []


def test_the_window_drops_a_superseded_fit_report(main_window, qtbot) -> None:
    """The session's job for older inputs stops once a newer job exists; the worker emits neither a result
    nor a failure for it, and the newer job's report is the one shown."""
    from gpumem_gui.ui.workers import BackgroundRunner

    session = main_window.session
    old_job = session._background_job()
    new_job = session._background_job()  # newer inputs: the old job's answer is no longer wanted
    assert old_job is not None and new_job is not None
    runner = BackgroundRunner("test")
    got: list[object] = []
    runner.finished.connect(lambda _id, r: got.append(r))
    runner.failed.connect(lambda _id, m: got.append(m))
    runner.submit(old_job, drop_pending=False)
    assert runner.wait(10000)
    qtbot.wait(50)
    assert session._resolved is not None  # the default target: the fit report runs, and is what stops
    assert got == []
    runner.submit(new_job, drop_pending=False)
    qtbot.waitUntil(lambda: len(got) == 1, timeout=20000)
    assert not isinstance(got[0], str)
    runner.shutdown()
