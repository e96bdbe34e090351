"""transformers' own knobs beyond the shared inference fields, declared once (types, ranges, UI) and listed in
:class:`~gpumem_gui.core.runtimes.run.InferenceRun` with ``engines=("transformers",)``; the semantics live in
:mod:`.transformers` and the replay."""

from __future__ import annotations

from typing import Annotated, Literal

from gpumem_gui.core.fields import UI

CacheImplementation = Annotated[
    Literal["dynamic", "static"],
    UI(
        "KV cache",
        "transformers",
        "generate()'s cache: dynamic (DynamicCache, grown by concatenation each step) or static "
        "(cache_implementation='static', as torch.compile'd generation uses): every layer's keys and values "
        "allocated for prompt + new tokens - 1 at the prefill and read whole at every step",
        choices=(("dynamic (grows per step)", "dynamic"), ("static (pre-allocated)", "static")),
        engines=("transformers",),
    ),
]
