"""Encoders in the trace worker: the Auto class of each task head, and a weight init that reads no values."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

# an encoder's task head -> the Auto class that builds it (the run's "task"; absent: a causal LM)
TASKS = {
    "sequence_classification": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
    "masked_lm": "AutoModelForMaskedLM",
}


@contextlib.contextmanager
def value_free_init() -> Iterator[None]:
    """``trunc_normal_`` reads tensor values (its bounds check), which fake tensors do not have (ModernBERT's
    _init_weights): it fills the tensor with ``normal_`` instead while a model is built (same tensors, the
    values do not matter to a trace; weight tying and every other step of the init still run)."""
    import torch

    orig = torch.nn.init.trunc_normal_

    def trunc_normal_(tensor: Any, mean: float = 0.0, std: float = 1.0, *a: Any, **k: Any) -> Any:
        with torch.no_grad():
            return tensor.normal_(mean, std)

    # transformers.initialization keeps its own reference (TORCH_INIT_FUNCTIONS)
    table: dict[str, Any] = {}
    with contextlib.suppress(ImportError):
        from transformers import initialization

        table = getattr(initialization, "TORCH_INIT_FUNCTIONS", {})
    had = "trunc_normal_" in table
    torch.nn.init.trunc_normal_ = trunc_normal_  # type: ignore[assignment]
    if had:
        table["trunc_normal_"] = trunc_normal_
    try:
        yield
    finally:
        torch.nn.init.trunc_normal_ = orig  # type: ignore[assignment]
        if had:
            table["trunc_normal_"] = orig
