"""Published parameter counts for the model catalog: how a publisher's figure is read, and how precise it is.

Used by :mod:`catalog_models` (the table) and :mod:`build_model_catalog` (the check against the exact count).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

# A marketing size label ("7B") says little about the exact count: the brief for this catalog (and common
# practice for such labels, e.g. Llama-2-70B is 69.0B) allows 6 %.
LABEL_PRECISION = 0.06

_UNITS = {"M": 10**6, "B": 10**9}


@dataclass(frozen=True)
class Published:
    """A parameter count as its publisher states it."""

    params: int
    precision: float
    source: str
    note: str = ""


def stated(text: str, source: str, note: str = "") -> Published:
    """A figure like '8.03B' or '1558M': exact to one unit of its last digit (which covers both rounding
    and truncation, e.g. Qwen's '14.7B' for 14.77B), and never looser than a size label."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([MB])", text)
    if not m:
        raise ValueError(f"cannot read the figure {text!r}")
    value = Decimal(m.group(1))
    unit = _UNITS[m.group(2)]
    ulp = Decimal(1).scaleb(value.as_tuple().exponent)
    return Published(
        int(value * unit), min(float(ulp / value), LABEL_PRECISION), f"{source} ('{text}')", note
    )


def label(text: str, source: str, note: str = "", precision: float = LABEL_PRECISION) -> Published:
    """A size label like '7B' (model name, announcement headline)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([MB])", text)
    if not m:
        raise ValueError(f"cannot read the label {text!r}")
    return Published(
        int(Decimal(m.group(1)) * _UNITS[m.group(2)]), precision, f"{source} (size label '{text}')", note
    )


def components(
    parts: tuple[int, ...], unit: int, source: str, note: str = "", precision: float | None = None
) -> Published:
    """The sum of figures a paper lists separately (e.g. embedding + non-embedding), each stated to ``unit``:
    one unit per part, unless ``precision`` says otherwise (and ``note`` why)."""
    total = sum(parts) * unit
    return Published(total, precision if precision is not None else len(parts) * unit / total, source, note)


@dataclass(frozen=True)
class Model:
    """One catalog entry: the Hugging Face id, family, size label and the published count."""

    id: str
    family: str
    size_label: str
    published: Published
