"""The core's one error type for bad input.

Every problem a user can cause (a malformed file, a value out of range, an unknown model) is raised as a
:class:`GpumemInputError` that names *where* the problem is (a file, a field) and *what* is wrong, in
one line a person can act on. Front ends (CLI, GUI) catch this type and never show a traceback.
"""

from __future__ import annotations


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

    def one_line(self) -> str:
        where = []
        if self.source:
            where.append(str(self.source))
        if self.field:
            where.append(f"field '{self.field}'")
        prefix = ": ".join(where)
        return f"{prefix}: {self.message}" if prefix else self.message


def describe_validation_error(exc: object, *, source: str | None = None) -> GpumemInputError:
    """Turn a pydantic ``ValidationError`` into one readable :class:`GpumemInputError`.

    Names the first offending field (dotted path) and pydantic's message, which already states the
    allowed range (``Input should be greater than 0``).
    """
    errors = exc.errors() if hasattr(exc, "errors") else []  # type: ignore[attr-defined]
    if not errors:
        return GpumemInputError(str(exc), source=source)
    first = errors[0]
    field = ".".join(str(p) for p in first.get("loc", ())) or None
    msg = first.get("msg", "invalid value")
    # pydantic prefixes a validator's own ValueError text with "Value error, " (and assertions with
    # "Assertion failed, "): the sentence is ours and reads better without it
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    if "input" in first and not isinstance(first["input"], dict | list):
        msg = f"{msg} (got {first['input']!r})"
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return GpumemInputError(msg + more, source=source, field=field)
