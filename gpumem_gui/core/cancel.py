"""Stopping a long core call (a fit report's searches and candidate changes) once its answer is no longer
wanted: the window starts a new fit report on every form change, and one made for inputs that have changed
since must not keep the worker busy for seconds.

The caller runs the call inside :func:`cancellable` with a ``stop()`` predicate; the solvers call
:func:`checkpoint` before each estimate they try, which raises :class:`Superseded` once ``stop()`` is true.
The predicate lives in a :class:`contextvars.ContextVar`, so it belongs to the thread (and context) that set
it: a call made anywhere else is never stopped. Outside :func:`cancellable`, :func:`checkpoint` does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_STOP: ContextVar[Callable[[], bool] | None] = ContextVar("gpumem_stop", default=None)


class Superseded(Exception):  # a state, not an error: nothing went wrong
    """The call was stopped because its caller no longer wants the answer."""


@contextmanager
def cancellable(stop: Callable[[], bool]) -> Iterator[None]:
    """Run the body so that every :func:`checkpoint` inside it raises :class:`Superseded` once ``stop()``."""
    token = _STOP.set(stop)
    try:
        yield
    finally:
        _STOP.reset(token)


def checkpoint() -> None:
    """Raise :class:`Superseded` when the enclosing :func:`cancellable`'s ``stop()`` says so."""
    stop = _STOP.get()
    if stop is not None and stop():
        raise Superseded
