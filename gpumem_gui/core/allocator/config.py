"""The settings of PyTorch's CUDA caching allocator that change how much memory it reserves.

PyTorch reads them from ``PYTORCH_CUDA_ALLOC_CONF`` (``PYTORCH_ALLOC_CONF`` since 2.8), a comma-separated list
of ``key:value`` pairs (c10/core/AllocatorConfig.cpp ``AcceleratorAllocatorConfig::parseArgs``; before 2.8
c10/cuda/CUDAAllocatorConfig.cpp ``CUDAAllocatorConfig::parseArgs``). :func:`parse_alloc_conf` reads the keys
that matter for memory; the others (``pinned_*``, ``backend``, ``release_lock_on_cudamalloc``) are accepted
and ignored, an unknown key is an error (PyTorch warns and ignores it; we refuse, so a typo is not silently a
default).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, ValidationError, model_validator

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.fields import UI
from gpumem_gui.core.spec.base import Frozen

MiB = 1 << 20
# parseMaxSplitSize: max_split_size_mb is at least kLargeBuffer / kMB = 20 (c10/core/AllocatorConfig.cpp)
MIN_SPLIT_MB = 20
# parseRoundUpPower2Divisions: one value for every interval, or [size_mb:divisions,...]; divisions are 0 (off)
# or a power of two; the intervals are the powers of two from 1 MiB to 64 GiB (kRoundUpPowerOfTwoIntervals=16)
POWER2_INTERVALS = 16
_IGNORED = (
    "pinned_use_cuda_host_register",
    "pinned_use_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "release_lock_on_cudamalloc",
    "release_lock_on_device_malloc",
    "backend",
)


class AllocatorConfig(Frozen):
    """What ``PYTORCH_CUDA_ALLOC_CONF`` sets (the defaults are PyTorch's: AllocatorConfig's constructor)."""

    expandable_segments: bool = Field(False, description="one growing segment per stream and pool")
    max_split_size_mb: Annotated[int, Field(ge=MIN_SPLIT_MB, le=1 << 30)] | None = Field(
        None, description="blocks this large or larger are never split (None: no limit)"
    )
    max_non_split_rounding_mb: Annotated[int, Field(ge=0, le=1 << 30)] = Field(
        20, description="an oversize cached block serves a request at most this much smaller (kLargeBuffer)"
    )
    roundup_power2_divisions: tuple[Annotated[int, Field(ge=0, le=1 << 20)], ...] = Field(
        (0,) * POWER2_INTERVALS,
        description="per power-of-two interval from 1 MiB: sizes round up to 1/N of the interval (0: off)",
    )
    garbage_collection_threshold: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(
        0.0,
        description="reclaim old cached blocks above this fraction of the allowed memory (needs a fraction)",
    )
    memory_fraction: Annotated[float, Field(gt=0.0, le=1.0)] | None = Field(
        None, description="torch.cuda.set_per_process_memory_fraction (None: not set)"
    )

    @model_validator(mode="after")
    def _divisions(self) -> AllocatorConfig:
        if len(self.roundup_power2_divisions) != POWER2_INTERVALS:
            raise ValueError(f"roundup_power2_divisions needs {POWER2_INTERVALS} intervals")
        if any(d & (d - 1) for d in self.roundup_power2_divisions):
            raise ValueError("roundup_power2_divisions must be 0 or powers of two")
        return self

    @property
    def max_split_size(self) -> int | None:
        return None if self.max_split_size_mb is None else self.max_split_size_mb * MiB

    def divisions(self, size: int) -> int:
        """``roundup_power2_divisions(size)``: the divisions of the power-of-two interval ``size`` falls in
        (sizes below 2 MiB use the first, 1 MiB, interval; above 32 GiB the last)."""
        if not any(self.roundup_power2_divisions):
            return 0
        index = max(0, size.bit_length() - 1 - 20)  # log2(size) - log2(1 MiB)
        return self.roundup_power2_divisions[min(index, POWER2_INTERVALS - 1)]


def _fail(message: str) -> GpumemInputError:
    return GpumemInputError(message, field="alloc_conf")


def _power2_table(tokens: list[str]) -> tuple[int, ...]:
    """``[256:1,512:2,>:4]``: divisions by interval (its start in MiB, a power of two; index log2 of it);
    the first entry also covers every interval below it, ``>`` every interval after the last entry
    (AcceleratorAllocatorConfig::parseRoundUpPower2Divisions)."""
    table = [0] * POWER2_INTERVALS
    last, first = 0, True
    for item in tokens:
        key, _, value = item.partition(":")
        divisions = _int(value, "roundup_power2_divisions")
        if divisions & (divisions - 1):
            raise _fail(f"roundup_power2_divisions: {divisions} divisions is not 0 or a power of two")
        if key == ">":
            table[last + 1 :] = [divisions] * (POWER2_INTERVALS - last - 1)
            continue
        mb = _int(key, "roundup_power2_divisions")
        if mb <= 0 or mb & (mb - 1):
            raise _fail(f"roundup_power2_divisions: {key} MiB is not a power of two")
        index = min(POWER2_INTERVALS - 1, mb.bit_length() - 1)
        if first:
            table[:index] = [divisions] * index
            first = False
        table[index] = divisions
        last = index
    return tuple(table)


def _int(text: str, key: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _fail(f"{key}: expected an integer, got {text[:20]!r}") from None


def parse_alloc_conf(text: str) -> AllocatorConfig:
    """An :class:`AllocatorConfig` from a ``PYTORCH_CUDA_ALLOC_CONF`` string (``expandable_segments:True,
    max_split_size_mb:512``); bad input raises :class:`GpumemInputError` naming the key."""
    values: dict[str, object] = {}
    body = text.strip()
    # the bracketed list of roundup_power2_divisions contains commas: cut it out first
    if "[" in body:
        head, _, rest = body.partition("[")
        inner, close, tail = rest.partition("]")
        if not close or not head.rstrip().endswith("roundup_power2_divisions:"):
            raise _fail("a '[' list is only allowed after roundup_power2_divisions:")
        values["roundup_power2_divisions"] = _power2_table([t.strip() for t in inner.split(",") if t.strip()])
        body = head.rstrip()[: -len("roundup_power2_divisions:")] + tail
    for item in (t.strip() for t in body.split(",")):
        if not item:
            continue
        key, sep, value = (s.strip() for s in item.partition(":"))
        if not sep:
            raise _fail(f"{key[:40]!r}: expected key:value")
        if key in _IGNORED:
            continue
        if key == "expandable_segments":
            if value not in ("True", "False"):
                raise _fail("expandable_segments: expected True or False")
            values[key] = value == "True"
        elif key in ("max_split_size_mb", "max_non_split_rounding_mb"):
            values[key] = _int(value, key)
        elif key == "roundup_power2_divisions":
            values[key] = (_int(value, key),) * POWER2_INTERVALS
        elif key == "garbage_collection_threshold":
            try:
                values[key] = float(value)
            except ValueError:
                raise _fail(f"{key}: expected a number in (0, 1)") from None
        else:
            raise _fail(
                f"unknown key {key[:40]!r} (expandable_segments, max_split_size_mb, "
                "max_non_split_rounding_mb, roundup_power2_divisions, garbage_collection_threshold)"
            )
    try:
        return AllocatorConfig(**values)  # type: ignore[arg-type]
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"][:1]) or "alloc_conf"
        raise _fail(f"{where}: {err['msg'].removeprefix('Value error, ')}") from None


def _valid(text: str) -> str:
    try:
        parse_alloc_conf(text)
    except GpumemInputError as err:  # the run names the field itself
        raise ValueError(err.message) from None
    return text.strip()


# the run field (training/run.py TrainingRun.alloc_conf), declared once here with its check
AllocConf = Annotated[
    str,
    Field(max_length=400),
    AfterValidator(_valid),
    UI(
        "PYTORCH_CUDA_ALLOC_CONF",
        "Overheads",
        "the caching allocator's settings for the allocator model, as in the environment variable: "
        "expandable_segments:True (one "
        "growing segment per stream, little fragmentation), max_split_size_mb:N (blocks this large are not "
        "split), roundup_power2_divisions:N, garbage_collection_threshold:F; empty: PyTorch's defaults",
        choices=(("default", ""), ("expandable_segments:True", "expandable_segments:True")),
        values="key:value pairs, comma separated (empty: the defaults)",
        shown=lambda v: bool(v.get("allocator_model")),
    ),
]


# the switch (training/run.py TrainingRun.allocator_model): the model runs on the step's allocations and
# frees, read off the step's tape with each storage's identity (replay/tape_stream.py)
AllocatorModel = Annotated[
    bool,
    UI(
        "Allocator model",
        "Overheads",
        "run the step's allocations and frees through a model of PyTorch's caching allocator: the reserve, "
        "the reserved peak per phase and the fragmentation from the run's own blocks (~0.1-0.3 s a point "
        "for an 8B model: off by default so that the window and the fit's searches stay fast); off: a "
        "flat 5 % of the transient peak",
    ),
]
