"""Every error the window shows is one readable line: :func:`error_line` turns any exception into one.

A pydantic ``ValidationError`` prints several lines (a count, the field path, the message, its type and a
documentation link); the core's :func:`~gpumem_gui.core.describe_validation_error` makes it one line that
names the field. Our own :class:`~gpumem_gui.core.GpumemInputError` has its :meth:`one_line`. Anything else
(a bug) is its type and the first line of its text. The line is capped: a huge value never floods a label.
"""

from __future__ import annotations

from gpumem_gui.core import GpumemError, GpumemInputError, describe_validation_error

MAX_LINE = 300  # characters: a banner or a status bar line; the core keeps a quoted value to ~80


def one_line(text: str, limit: int = MAX_LINE) -> str:
    """``text`` with every run of whitespace (newlines too) as one space, cut to ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _is_validation_error(e: BaseException) -> bool:
    """A pydantic ``ValidationError`` (told by its ``errors()`` list; the window does not import pydantic)."""
    errors = getattr(e, "errors", None)
    return callable(errors) and hasattr(e, "title")


def error_line(e: BaseException, limit: int = MAX_LINE) -> str:
    """One line for ``e``: ``<where>: field '<name>': <problem>`` when it is about an input."""
    if isinstance(e, GpumemInputError):
        text = e.one_line()
    elif _is_validation_error(e):
        try:
            text = describe_validation_error(e, source=str(getattr(e, "title", "") or "") or None).one_line()
        except Exception:  # a malformed error list: its first line still says something
            text = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    elif isinstance(e, GpumemError):
        text = str(e)
    elif isinstance(e, OSError) and e.strerror:
        text = f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    else:
        lines = str(e).strip().splitlines()
        text = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return one_line(text, limit)
