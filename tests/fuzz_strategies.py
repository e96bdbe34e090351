"""Strategies, profiles and the one property of gpumem's fuzz suite (``tests/test_fuzz_*.py``).

The property: every input is either accepted or refused with one :class:`GpumemInputError` (the window's
scenario files: ``ScenarioError``) whose text is one line and echoes at most ~80 characters of any value the
input holds; never another exception, never a hang (every generated input is small: a few KiB, a few
thousand nesting levels at most).

Profiles: ``make test`` runs each fuzz test with its own small budget, derandomized (the same examples on
every run, so CI does not turn red on a new random find); ``make fuzz`` sets ``GPUMEM_FUZZ=long``:
``LONG_FACTOR`` times the examples, random, with Hypothesis' example database (a failure found is replayed
first next time).

The strategies start from real documents (reference configs, shipped fake-GPU scenarios, a saved window
scenario) and mutate them, in the document and in its JSON text. The issue's reproducers are among the
values drawn (and each fuzz test also runs them as ``@example``\\ s): a JSON integer over Python's
4,300-digit limit, nesting past the recursion limit, ``Infinity``/``NaN``/``1e999``, 2^31..2^64 and
negative counts, a 5,000-digit layer number in a tensor name, counts just over 4,096.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, reject, settings
from hypothesis import strategies as st

# ---- profiles ------------------------------------------------------------------------------------------

LONG = os.environ.get("GPUMEM_FUZZ", "").lower() == "long"
LONG_FACTOR = 40  # make fuzz: ~40x the examples of make test (a few minutes per test on 2 cores)
_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile(
    "gpumem-fuzz", deadline=None, derandomize=True, database=None, suppress_health_check=_QUIET
)
settings.register_profile("gpumem-fuzz-long", deadline=None, suppress_health_check=_QUIET, print_blob=True)


def fuzz_settings(examples: int) -> settings:
    """``examples`` per test under ``make test``; ``LONG_FACTOR`` times as many under ``make fuzz``."""
    profile = settings.get_profile("gpumem-fuzz-long" if LONG else "gpumem-fuzz")
    return settings(profile, max_examples=examples * (LONG_FACTOR if LONG else 1))


# ---- the property --------------------------------------------------------------------------------------

MAX_ECHO = 80  # the house rule: an error line never echoes more than ~80 characters of a user's value
# What the check lets through: twice that. A value is shown clipped to ~80 characters, but a source (a path,
# a model name) keeps its start and its end in up to 160 (gpumem_gui/core/errors.py, _MAX_SOURCE) so that
# the file name stays readable; an unclipped value (the 100 KB echoes) is far over either.
ECHO_TOLERANCE = 2 * MAX_ECHO


def long_values(obj: Any, limit: int = MAX_ECHO) -> list[str]:
    """Every string (keys too) and integer's digits in ``obj`` longer than ``limit`` characters."""
    out: list[str] = []
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list | tuple):
            stack.extend(x)
        elif isinstance(x, str) and len(x) > limit:
            out.append(x)
        elif isinstance(x, int) and not isinstance(x, bool) and abs(x) >= 10**limit:
            out.append(str(x))
    return out


def echoed(message: str, values: Iterable[str], limit: int = ECHO_TOLERANCE) -> str | None:
    """The first run of more than ``limit`` characters of one of ``values`` found in ``message``."""
    window = limit
    for v in values:
        for i in range(0, max(1, len(v) - window + 1), 16):
            part = v[i : i + window + 1]
            if len(part) > window and part in message:
                return part
    return None


def check_refusal(e: BaseException, values: Iterable[str] = ()) -> str:
    """The property of a refusal: one line, short echoes; returns the text."""
    text = str(e)
    assert "\n" not in text.strip(), f"the message is more than one line: {text[:500]!r}"
    assert text.strip(), "an empty message"
    part = echoed(text, values)
    assert part is None, f"the message echoes over {ECHO_TOLERANCE} characters of a value: {text[:300]!r}"
    return text


# ---- interesting values --------------------------------------------------------------------------------

# JSON texts that are values by themselves; they stand in a document as sentinels, replaced in its text
HUGE_INT = "9" * 4301  # one digit over Python's int max_str_digits (json.loads raises ValueError)
DEEP_LIST = "[" * 5000 + "]" * 5000  # past the recursion limit (json.loads raises RecursionError)
DEEP_DICT = '{"a":' * 3000 + "1" + "}" * 3000
RAW_VALUES = {
    "huge_int": HUGE_INT,
    "neg_huge_int": "-" + HUGE_INT,
    "deep_list": DEEP_LIST,
    "deep_dict": DEEP_DICT,
    "inf": "Infinity",
    "neg_inf": "-Infinity",
    "nan": "NaN",
    "overflow_float": "1e999",  # json.loads gives inf
    "long_int": "1" + "0" * 400,  # 401 digits: parses, but far beyond any count
}
_SENTINEL = "\x00raw:{}\x00"

EXTREME_INTS = (
    0,
    1,
    -1,
    2,
    3,
    7,
    4096,
    4097,  # one over the GPU count limit (MAX_GPUS) and the parallel degrees' 4,096
    65536,
    65537,
    2**24,
    2**24 + 1,  # the token limits' 16,777,216
    2**31 - 1,
    2**31,  # 32-bit overflow (Gemma-3's vision tower over 2^31 parameters)
    2**32,
    2**53 + 1,  # not a float
    2**63 - 1,
    2**63,
    2**64,
    -(2**63),
    10**18,
    10**30,
)
EXTREME_FLOATS = (0.0, -0.0, 0.5, 1.0, -1.0, 1e-300, 5e-324, 1e300, 1.7976931348623157e308)


def raw(name: str) -> str:
    """A sentinel string that :func:`dumps` turns into ``RAW_VALUES[name]`` in the JSON text."""
    return _SENTINEL.format(name)


def dumps(doc: Any) -> str:
    """``json.dumps`` with every :func:`raw` sentinel replaced by its raw JSON text."""
    text = json.dumps(doc)
    for name, value in RAW_VALUES.items():
        text = text.replace(json.dumps(raw(name)), value)
    return text


def scalars(long_text: bool = True) -> st.SearchStrategy[Any]:
    texts = st.text(max_size=12)
    if long_text:
        texts = texts | st.text(min_size=100, max_size=300) | st.just("x" * 5000)
    return st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from(EXTREME_INTS),
        st.integers(-(2**70), 2**70),
        st.integers(-3, 64),
        st.sampled_from(EXTREME_FLOATS),
        st.floats(allow_nan=False, allow_infinity=False),
        texts,
        st.sampled_from(sorted(RAW_VALUES)).map(raw),
    )


def _containers_of(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)


def json_values(long_text: bool = True) -> st.SearchStrategy[Any]:
    return st.recursive(scalars(long_text), _containers_of, max_leaves=10)


JSON_VALUES = json_values()


# ---- mutating documents --------------------------------------------------------------------------------


def _containers(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to every dict and list inside ``doc`` (``doc`` itself first)."""
    out = [path] if isinstance(doc, dict | list) else []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        out += _containers(v, (*path, k))
    return out


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


@st.composite
def mutated(
    draw: st.DrawFn,
    bases: list[Any],
    keys: list[str] | None = None,
    values: st.SearchStrategy[Any] | None = None,
    max_changes: int = 4,
) -> Any:
    """A copy of one of ``bases`` with 1..max_changes changes at any depth: a value replaced (by an
    interesting value, or another value of the document), a key removed, a key added (from ``keys``)."""
    doc = json.loads(json.dumps(draw(st.sampled_from(bases))))
    values = values if values is not None else JSON_VALUES
    for _ in range(draw(st.integers(1, max_changes))):
        paths = _containers(doc)
        if not paths:
            return doc
        where = _at(doc, draw(st.sampled_from(paths)))
        if isinstance(where, list):
            if not where:
                where.append(draw(values))
                continue
            i = draw(st.integers(0, len(where) - 1))
            action = draw(st.sampled_from(["set", "delete", "copy"]))
            if action == "delete":
                where.pop(i)
            else:
                where[i] = draw(values) if action == "set" else json.loads(json.dumps(where[0]))
            continue
        existing = sorted(where, key=str)
        key_choice = st.sampled_from(existing) if existing else st.text(max_size=8)
        if keys:
            key_choice = key_choice | st.sampled_from(keys)
        key = draw(key_choice)
        if draw(st.integers(0, 3)) == 0:
            where.pop(key, None)
        else:
            where[key] = draw(values)
    return doc


@st.composite
def mutated_text(draw: st.DrawFn, text: str) -> str:
    """``text`` with one textual change: cut short, a byte run replaced, or a number token replaced by a
    raw value (a 4,301-digit integer, ``Infinity``, deep nesting)."""
    action = draw(st.sampled_from(["truncate", "splice", "number", "number", "wrap"]))
    if action == "truncate":
        return text[: draw(st.integers(0, max(0, len(text) - 1)))]
    if action == "splice":
        i = draw(st.integers(0, len(text)))
        n = draw(st.integers(0, 8))
        return text[:i] + draw(st.text(max_size=8)) + text[i + n :]
    if action == "wrap":
        return "[" * 3000 + text + "]" * 3000
    digits = [i for i, c in enumerate(text) if c.isdigit() and (i == 0 or not text[i - 1].isdigit())]
    if not digits:
        return text
    i = draw(st.sampled_from(digits))
    j = i
    while j < len(text) and (text[j].isdigit() or text[j] in ".eE+-"):
        j += 1
    return text[:i] + RAW_VALUES[draw(st.sampled_from(sorted(RAW_VALUES)))] + text[j:]


def documents(
    bases: list[Any], keys: list[str] | None = None, extra: Callable[[], st.SearchStrategy[str]] | None = None
) -> st.SearchStrategy[str]:
    """JSON texts: mutated documents (through :func:`dumps`), or textual mutations of a base's text."""
    texts = mutated(bases, keys).map(dumps) | st.sampled_from([json.dumps(b) for b in bases]).flatmap(
        mutated_text
    )
    return texts | extra() if extra is not None else texts


def raw_reproducers() -> list[str]:
    """The raw JSON values of the issue, as whole documents."""
    return [RAW_VALUES[k] for k in ("huge_int", "deep_list", "deep_dict")]


@dataclass(frozen=True)
class KnownBug:
    """A bug the fuzz suite found in a module another change owns. The property tests pass over inputs
    that hit it (Hypothesis rejects them), and its reproducer is an ``xfail(strict=True)`` test: once the
    bug is fixed that test turns red, and this entry and the ``xfail`` go."""

    reason: str  # the input, what goes wrong, where; the reproducer test's name
    exception: type[BaseException]  # AssertionError: a refusal that breaks the property
    where: str = ""  # a path fragment of the innermost gpumem_gui frame ("gpumem_gui/hardware/fake.py")
    pattern: str = ""  # a regular expression the exception's text matches

    def matches(self, e: BaseException) -> bool:
        if not isinstance(e, self.exception) or not re.search(self.pattern, str(e)):
            return False
        frames = [f.filename for f in traceback.extract_tb(e.__traceback__) if "gpumem_gui" in f.filename]
        return not self.where or bool(frames and self.where in frames[-1].replace("\\", "/"))


KNOWN_BUGS: dict[str, KnownBug] = {}


def known_bug(name: str, bug: KnownBug) -> KnownBug:
    KNOWN_BUGS[name] = bug
    return bug


@contextlib.contextmanager
def passing_over_known_bugs(enabled: bool = True) -> Iterator[None]:
    """Inside a property test: an input that hits a :data:`KNOWN_BUGS` entry is rejected, not failed."""
    try:
        yield
    except BaseException as e:
        if enabled and any(b.matches(e) for b in KNOWN_BUGS.values()):
            reject()
        raise


def accepted_or_refused(
    fn: Callable[[], Any], values: Iterable[str] = (), refusal: type[BaseException] | None = None
) -> Any:
    """``fn()``'s result, or None when it refused with ``refusal`` (default: GpumemInputError) whose text
    keeps the property; any other exception propagates, so the test fails and Hypothesis shrinks it."""
    from gpumem_gui.core import GpumemInputError

    expected = refusal or GpumemInputError
    try:
        return fn()
    except expected as e:
        check_refusal(e, values)
        return None


def values_in(text: str) -> list[str]:
    """The long values in a JSON text for the echo check: those of the parsed document, or (when it does
    not parse) the text itself."""
    try:
        return long_values(json.loads(text))
    except (ValueError, RecursionError):
        return [text] if len(text) > MAX_ECHO else []
