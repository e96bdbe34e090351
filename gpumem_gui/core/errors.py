"""The core's one error type for bad input.

Every problem a user can cause (a malformed file, a value out of range, an unknown model) is raised as a
:class:`GpumemInputError` that names *where* the problem is (a file, a field) and *what* is wrong, in
one line a person can act on. Front ends (CLI, GUI) catch this type and never show a traceback.

A user's value is never echoed at length: :func:`short` shows a value in at most :data:`MAX_ECHO` characters,
and :class:`GpumemInputError` clips its source, field and message (a 100 KB config value, a 5,000-character
path or key must not become a 100 KB error line) and keeps the line one line.
"""

from __future__ import annotations

import reprlib

# Most characters of a user's value an error line repeats (the CLI's promise: one short line).
MAX_ECHO = 80
# Most characters of a whole message: ours are under ~450 (the longest lists the supported model types);
# anything longer carries a user's text we did not clip.
_MAX_MESSAGE = 600
# Most characters of a source (a path keeps its start and its end, where the file name is).
_MAX_SOURCE = 160

# Integers above this many bits are described, not printed: repr() refuses more than 4,300 digits
# (~14,000 bits; Python's int_max_str_digits).
_MAX_INT_BITS = 10_000

_repr = reprlib.Repr()
_repr.maxlevel = 3
_repr.maxstring = MAX_ECHO
_repr.maxother = MAX_ECHO
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 8


def clip(text: str, limit: int = MAX_ECHO) -> str:
    """``text`` on one line (control characters escaped), at most about ``limit`` characters: longer text
    keeps its start and its end around an ellipsis."""
    if len(text) > 4 * limit:  # escape only what can be shown
        text = text[: 2 * limit] + text[-2 * limit :]
        cut = True
    else:
        cut = False
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if len(text) > limit or cut:
        head = max(1, limit * 2 // 3)
        tail = max(1, limit - head - 1)
        text = f"{text[:head]}…{text[-tail:]}"
    return text


def short(value: object, limit: int = MAX_ECHO) -> str:
    """``repr(value)`` in at most about ``limit`` characters, for any value: deep or long containers are
    abbreviated (no recursion), integers too long to print (over Python's 4,300-digit limit) by their size."""
    if isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
        text = f"<an integer of {value.bit_length():,} bits>"
    else:
        try:
            text = _repr.repr(value)
        except (ValueError, RecursionError, OverflowError):
            text = f"<{type(value).__name__}>"
    return clip(text, limit)


class GpumemError(Exception):
    """Base class of every error gpumem raises on purpose."""


class GpumemInputError(GpumemError, ValueError):
    """Bad input: a file that cannot be read or understood, or a value out of its allowed range.

    ``source`` is the file, hub id or form the input came from; ``field`` the field inside it.
    """

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None) -> None:
        self.message = message
        self.source = source
        self.field = field
        super().__init__(self.one_line())

    def __str__(self) -> str:  # source and field may be reassigned after construction (GGUF key names)
        return self.one_line()

    def one_line(self) -> str:
        where = []
        if self.source:
            where.append(clip(str(self.source), _MAX_SOURCE))
        if self.field:
            where.append(f"field '{clip(str(self.field))}'")
        prefix = ": ".join(where)
        message = clip(str(self.message), _MAX_MESSAGE)
        return f"{prefix}: {message}" if prefix else message


def describe_validation_error(exc: object, *, source: str | None = None) -> GpumemInputError:
    """Turn a pydantic ``ValidationError`` into one readable :class:`GpumemInputError`.

    Names the first offending field (dotted path) and pydantic's message, which already states the
    allowed range (``Input should be greater than 0``); the offending value is shown in short.
    """
    errors = exc.errors() if hasattr(exc, "errors") else []  # type: ignore[attr-defined]
    if not errors:
        return GpumemInputError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, source=source)
    first = errors[0]
    field = ".".join(str(p) for p in first.get("loc", ())) or None
    msg = " ".join(str(first.get("msg", "invalid value")).split())  # pydantic's text may span lines
    # pydantic prefixes a validator's own ValueError text with "Value error, " (and assertions with
    # "Assertion failed, "): the sentence is ours and reads better without it
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    if "input" in first and not isinstance(first["input"], dict | list):
        msg = f"{clip(msg, _MAX_MESSAGE // 2)} (got {short(first['input'])})"
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return GpumemInputError(msg + more, source=source, field=field)
