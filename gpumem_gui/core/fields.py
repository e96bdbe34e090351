"""Run fields declared once: every field of a run model carries how it is typed, shown and spelled.

A run model (:class:`~gpumem_gui.core.runtimes.run.InferenceRun`, :class:`~gpumem_gui.core.training.run.
TrainingRun`) annotates each field with its validated range (pydantic) and a :class:`UI` entry: the CLI flag,
the form label and group, the unit, the help text, where the field applies. :func:`run_fields` reads both
into :class:`RunField` records, from which the CLI builds its flags, the window builds its forms, the
"copy command" writes a command line and ``make docs`` writes the README's flag table; nothing else lists
run fields.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Field, ValidationError

Kind = Literal["bool", "int", "float", "str", "choice", "list"]


@dataclass(frozen=True)
class UI:
    """How one run field is shown and spelled (the range and the default come from the model itself).

    ``flag`` defaults to ``--`` + the name with dashes (a boolean also gets ``--no-...``); ``aliases`` are
    the engine's own short spellings (``-ngl``); ``special`` names the lowest value of a number (``all
    layers`` for -1) or what an empty optional means (``auto``), and ``none`` is the widget value that stands
    for None; ``choices`` label the values of a Literal in display order (or suggest values for a text
    field); ``values`` says in words what a text field takes; ``engines`` are the inference engines the
    field applies to (empty: all); ``shown`` decides from the form's current values whether the field is
    offered, ``model`` from the loaded model's spec (what the model can do with the field: the core's own
    predicate, e.g. whether its vision tower is replayed); ``widget`` names a form widget the generic builder
    does not make (``weights``, ``kv_dtype``)."""

    label: str
    group: str
    help: str
    flag: str | None = None
    aliases: tuple[str, ...] = ()
    unit: str = ""
    step: float = 1
    decimals: int = 2
    special: str | None = None
    none: float | None = None
    choices: tuple[tuple[str, Any], ...] = ()
    values: str = ""
    engines: tuple[str, ...] = ()
    shown: Callable[[Mapping[str, Any]], bool] | None = None
    model: Callable[[Any], bool] | None = None
    widget: str = ""


@dataclass(frozen=True)
class RunField:
    """One field of a run model: its name, type kind, range, default and :class:`UI`."""

    name: str
    kind: Kind
    optional: bool
    default: Any
    lo: float | None
    hi: float | None
    values: tuple[Any, ...]  # a Literal's values
    ui: UI
    lo_open: bool = False  # the bound itself is excluded (pydantic gt / lt)
    hi_open: bool = False

    @property
    def flag(self) -> str:
        return self.ui.flag or "--" + self.name.replace("_", "-")

    @property
    def negated_flag(self) -> str:
        """The flag that sets a boolean false (``--no-flash-attn``)."""
        return "--no-" + self.flag[2:]

    def range_text(self) -> str:
        """The allowed values in words: ``1 to 1,048,576``, ``sdpa, eager, flash``, ``on/off``."""
        if self.kind == "bool":
            return "on/off"
        if self.values:
            return ", ".join(str(v) for v in self.values)
        if self.ui.values:
            return self.ui.values
        if self.ui.choices:
            return ", ".join(str(v) for _, v in self.ui.choices)
        if self.lo is None and self.hi is None:
            return "text"
        lo = "" if self.lo is None else f"{self.lo:,.10g}"
        hi = "" if self.hi is None else f"{self.hi:,.10g}"
        return f"{'above ' if self.lo_open else ''}{lo} to {'below ' if self.hi_open else ''}{hi}"

    def default_text(self) -> str:
        if self.default is None:
            return self.ui.special or "auto"
        if self.kind == "bool":
            return "on" if self.default else "off"
        return self.text(self.default)

    def applies(self, values: Mapping[str, Any], spec: Any = None) -> bool:
        """Whether the field is offered for a run with these current values, of the model ``spec`` (None: no
        model known, nothing ruled out by it)."""
        if self.ui.engines and values.get("engine", self.ui.engines[0]) not in self.ui.engines:
            return False
        return self.for_model(spec) and (self.ui.shown is None or bool(self.ui.shown(values)))

    def for_model(self, spec: Any) -> bool:
        """Whether the model ``spec`` can use the field (None: no model known, so it may)."""
        return spec is None or self.ui.model is None or bool(self.ui.model(spec))

    def text(self, value: Any) -> str:
        """The value as it is written on a command line."""
        if isinstance(value, tuple | list):
            return ",".join(str(v) for v in value)
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)

    def parse(self, text: str) -> Any:
        """A command-line value as the model takes it (validation is the model's); ``auto`` is None for an
        optional field."""
        if self.optional and text.strip().lower() in ("auto", "default", "none"):
            return None
        if self.kind == "list":
            return text
        if self.kind == "choice" and self.values and isinstance(self.values[0], int):
            return int(text)
        if self.kind == "int":
            return int(text)
        if self.kind == "float":
            return float(text)
        return text


def _kind(annotation: Any) -> tuple[Kind, bool, tuple[Any, ...]]:
    args = get_args(annotation)
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            kind, _, values = _kind(non_none[0])
            return kind, True, values
        return "list", False, ()  # e.g. Literal["all-linear"] | tuple[str, ...]
    if origin is Literal:
        return "choice", False, args
    if get_origin(annotation) is not None and args:  # Annotated[...]
        return _kind(args[0])
    name = {bool: "bool", int: "int", float: "float", str: "str"}.get(annotation)
    if name is None:
        raise TypeError(f"run field of unsupported type {annotation!r}")
    return name, False, ()  # type: ignore[return-value]


def _bounds(metadata: list[Any]) -> tuple[float | None, float | None, bool, bool]:
    """The range pydantic's constraints give, and whether each bound is excluded (``gt``/``lt``)."""
    lo = hi = None
    lo_open = hi_open = False
    for m in metadata:
        for attr, is_open in (("ge", False), ("gt", True)):
            if getattr(m, attr, None) is not None:
                lo, lo_open = getattr(m, attr), is_open
        for attr, is_open in (("le", False), ("lt", True)):
            if getattr(m, attr, None) is not None:
                hi, hi_open = getattr(m, attr), is_open
    return lo, hi, lo_open, hi_open


def command_args(run: BaseModel) -> list[str]:
    """The flags that rebuild ``run`` from its model's defaults: one per field whose value differs, in
    declaration order (booleans as ``--flag`` / ``--no-flag``); a field at its declared default is written
    too where the model would otherwise fill it from another (a framework's own precision: TrainingRun
    ``_framework_precision``)."""
    fields = run_fields(type(run))
    given = {f.name for f in fields if getattr(run, f.name) != f.default}
    # a subset the model rejects leaves the fields that differ as all there is to say
    with contextlib.suppress(ValidationError):
        rebuilt = type(run)(**{n: getattr(run, n) for n in given})
        given |= {f.name for f in fields if getattr(rebuilt, f.name) != getattr(run, f.name)}
    out: list[str] = []
    for f in fields:
        value = getattr(run, f.name)
        if f.name not in given:
            continue
        if f.kind == "bool":
            out.append(f.flag if value else f.negated_flag)
        else:
            out += [f.flag, "auto" if value is None else f.text(value)]
    return out


@cache
def run_fields(model: type[BaseModel]) -> tuple[RunField, ...]:
    """Every field of ``model`` that carries a :class:`UI`, in declaration order."""
    out = []
    for name, info in model.model_fields.items():
        meta = list(info.metadata)
        ui = next((m for m in meta if isinstance(m, UI)), None)
        if ui is None:
            continue
        kind, optional, values = _kind(info.annotation)
        lo, hi, lo_open, hi_open = _bounds(meta)
        out.append(RunField(name, kind, optional, info.default, lo, hi, values, ui, lo_open, hi_open))
    return tuple(out)


# ---- fields both run models declare alike ------------------------------------------------------------------

# attn_implementation as transformers names it, with the window's labels
ATTN_CHOICES: tuple[tuple[str, Any], ...] = (
    ("sdpa", "sdpa"),
    ("eager", "eager"),
    ("flash-attention 2", "flash"),
)

CudaContextMiB = Annotated[
    int | None,
    Field(ge=0, le=1 << 16),
    UI(
        "CUDA context",
        "Overheads",
        "memory the CUDA context takes per process; by GPU: the published idle-process figure of the run's "
        "GPU generation (gpu_arch; core/results/nontorch.py CONTEXT_MIB)",
        unit=" MiB",
        step=50,
        special="by GPU",
        none=-1,
    ),
]

# NVIDIA GPU generations the non-torch memory model knows (core/results/nontorch.py sizes them; arch_of maps a
# compute capability onto them)
GpuArch = Literal["volta", "turing", "ampere", "ada", "hopper", "blackwell"]
GPU_ARCHS: tuple[GpuArch, ...] = get_args(GpuArch)

GpuArchField = Annotated[
    Literal[("auto", *GPU_ARCHS)],  # type: ignore[valid-type]  # auto + the generations, written once
    UI(
        "GPU generation",
        "Overheads",
        "the GPU generation the non-torch memory is sized for (CUDA context, cuBLAS workspace size); auto: "
        "the target GPU's (--gpu with a catalog GPU), else Hopper",
        choices=(("auto", "auto"), *((a.capitalize(), a) for a in GPU_ARCHS)),
        engines=("transformers", "llama.cpp", "ollama"),  # vLLM and SGLang size their own non-torch memory
    ),
]

# NCCL's channel count on 8 x H100 (AWS p5.48xlarge, NVLink): "24 coll channels, 24 collnet channels, 16 nvls
# channels, 32 p2p channels, 32 p2p channels per peer" (NCCL INFO init lines in public GitHub logs, gpumem
# search index find_string ids 60242986175, 60634730066, 60737580088); over PCIe NCCL uses far fewer ("2 coll
# channels, 2 p2p channels, 1 p2p channels per peer", id 31276347573): the run field nccl_channels
DEFAULT_NCCL_CHANNELS = 24
NcclChannels = Annotated[
    int,
    Field(
        DEFAULT_NCCL_CHANNELS, ge=1, le=64
    ),  # NCCL src/include/device.h MAXCHANNELS: 64 in current releases (32 before)
    UI(
        "NCCL channels",
        "Overheads",
        "NCCL's collective channels (NCCL_DEBUG=INFO prints 'N coll channels'): each connects its ring with "
        "~12 MiB of buffers per communicator; 24 on 8 x H100 NVLink, 2 over PCIe",
        engines=("transformers",),  # tensor parallelism under torchrun (runtimes/transformers.py)
        step=1,
    ),
]


def image_fields(
    group: str, what: str, takes_images: Callable[[Any], bool], engines: tuple[str, ...] = ()
) -> tuple[Any, Any]:
    """The ``images`` and ``image_size`` fields of a run (inference and training declare them through this:
    one range, one meaning); ``what``: what the images do in that run, after the towers that are replayed;
    ``takes_images``: whether a model's spec does anything with images in that run (the fields are offered
    for such models only)."""
    images = Annotated[
        int,
        Field(ge=0, le=1024),
        UI(
            "Images",
            group,
            "images per sequence: a replayed vision tower (Qwen2.5-VL, Qwen3-VL, Mistral 3, Gemma 3, "
            f"Llama 4) runs on them, their tokens join the sequence; {what}; 0: text only",
            unit=" images",
            engines=engines,
            model=takes_images,
        ),
    ]
    size = Annotated[
        int,
        Field(ge=1, le=16384),
        UI(
            "Image size",
            group,
            "side in pixels of each (square) image as the model's processor resizes it, rounded down to "
            "whole merged patches (Qwen2.5-VL, Qwen3-VL, Mistral 3); Llama 4: tiles of 336 px a side (up to "
            "4 x 4 and a global one); not used by Gemma 3 (every image resized to 896 px)",
            unit=" px",
            step=112,
            engines=engines,
            model=takes_images,
        ),
    ]
    return images, size
