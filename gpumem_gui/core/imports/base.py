"""The import protocol: a runtime's own launch command or config file, read as the run gpumem estimates.

One parser per runtime or framework, each in its own module of this package:

* a :class:`CommandParser` reads a command line (``vllm serve ...``, ``llama-server ...``): ``matches(argv)``
  says whether ``argv`` (the words after any ``VAR=value`` assignments, ``argv[0]`` the program) is its
  runtime's; ``parse(argv, env)`` returns an :class:`ImportedRun`;
* a :class:`FileParser` reads a config file's parsed content (a YAML/JSON/TOML mapping): ``matches(data,
  path)`` and ``parse(data, path)``.

Every option a parser reads is printed back (:attr:`ImportedRun.read_as`); every option it does not model is
named in :attr:`ImportedRun.warnings`, never dropped silently. A bad value is one :class:`GpumemInputError`
naming its position (``argument 5 '--max-model-len': ...``, argument 0 being the program as in a shell's
``$0``) or its key (``key 'optimizer.lr': ...``). :class:`Reading` collects all three while a parser walks
its input, and builds the run, reporting a field the run rejects at the option that set it.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from gpumem_gui.core.errors import GpumemInputError, clip
from gpumem_gui.core.imports.values import bad, to_bool, to_choice, to_float, to_int
from gpumem_gui.core.runtimes.base import SERVER_DTYPES
from gpumem_gui.core.runtimes.run import InferenceRun, make_run
from gpumem_gui.core.spec.model import Frozen, ModelSpec
from gpumem_gui.core.training.run import TrainingRun, make_training_run

__all__ = [
    "TORCH_DTYPES",
    "Arg",
    "CommandParser",
    "FileParser",
    "ImportedRun",
    "Reading",
    "TextFileParser",
    "bad",
    "program",
    "split_options",
    "to_bool",
    "to_choice",
    "to_float",
    "to_int",
    "words",
]


class ImportedRun(Frozen):
    """A launch command or config file, read as a run.

    ``model`` is the model as the runtime names it (hub id, local path, GGUF file), or None when the input
    names none (a DeepSpeed JSON); ``source`` what was read (``vLLM command``, ``torchtune recipe``);
    ``read_as`` pairs each option as written with how gpumem read it; ``warnings`` names every option gpumem
    does not model."""

    model: str | None
    run: InferenceRun | TrainingRun
    source: str
    read_as: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()
    # run fields the runtime takes from the model when the input leaves them out: (field, the ModelSpec
    # attribute, divided by this run field or "", why); :meth:`with_model` fills them once the model is loaded
    from_model: tuple[tuple[str, str, str, str], ...] = ()
    # a PyTorch server's --dtype (vLLM, SGLang) with no quantization option: (the dtype, the option as
    # written). vllm/config/model.py ModelConfig.quantization: "If None, we first check the
    # quantization_config attribute in the model config file. If that is None, we assume the model weights
    # are not quantized and use dtype to determine the data type of the weights" (_verify_quantization reads
    # it; SGLang's python/sglang/srt/configs/model_config.py _verify_quantization is adapted from it): a
    # quantized checkpoint keeps its format, --dtype casting only its unquantized tensors and the
    # activations. :meth:`with_model` decides once the model (its quantization_config) is known
    dtype_weights: tuple[str, str] | None = None
    # why the input names no model gpumem can load (a DeepSpeed JSON names none; a torchtune component without
    # a Hub id): said where a model must be given, never a warning once one is
    no_model: tuple[str, ...] = ()

    @property
    def mode(self) -> str:
        """``inference`` or ``train``: the CLI's ``--mode``."""
        return "train" if isinstance(self.run, TrainingRun) else "inference"

    def lines(self) -> list[str]:
        """What was read, for people: ``read as:`` lines, then the warnings."""
        out = [f"read as: {self.source}" + (f", model {self.model}" if self.model else ", no model named")]
        out += [f"read as: {written} -> {meaning}" for written, meaning in self.read_as]
        out += [f"warning: {w}" for w in self.warnings]
        return out

    def with_model(self, spec: ModelSpec, quantized: str | None = None) -> ImportedRun:
        """The run with every :attr:`from_model` field filled from ``spec`` (vLLM's max_model_len and
        llama.cpp's context default to the model's own context length), and the weights a ``--dtype`` gives
        (:attr:`dtype_weights`): that dtype for an unquantized checkpoint, the checkpoint's own format for
        one ``quantized`` as named (:attr:`LoadedModel.checkpoint_quantization`); each printed back."""
        if not self.from_model and self.dtype_weights is None:
            return self
        update: dict[str, Any] = {}
        read_as = list(self.read_as)
        if self.dtype_weights is not None:
            dt, written = self.dtype_weights
            if quantized is None:
                update["weights"] = dt
                read_as.append((written, f"weights = {dt} (an unquantized checkpoint is cast to --dtype)"))
            else:
                read_as.append(
                    (written, f"weights stay in the checkpoint's quantized format ({quantized}); {dt} is the "
                     "dtype of the activations and of the tensors it leaves unquantized")
                )  # fmt: skip
        for field, attr, per, why in self.from_model:
            total = int(getattr(spec, attr))
            div = int(update.get(per, getattr(self.run, per))) if per else 1
            update[field] = max(1, total // max(1, div))
            how = f"{attr} {total} / {per} {div}" if per else attr
            shown = f"{field} = {update[field]} ({how})"
            read_as.append((why, shown))
        fields = {**{k: getattr(self.run, k) for k in self.run.model_fields_set}, **update}
        run = make_training_run(**fields) if isinstance(self.run, TrainingRun) else make_run(**fields)
        changes = {"run": run, "read_as": tuple(read_as), "from_model": (), "dtype_weights": None}
        return self.model_copy(update=changes)


@runtime_checkable
class CommandParser(Protocol):
    """Reads one runtime's launch command."""

    name: str  # the runtime, as the error and the ``read as`` line name it ("vLLM")

    def matches(self, argv: Sequence[str]) -> bool: ...

    def parse(self, argv: Sequence[str], env: Mapping[str, str]) -> ImportedRun: ...


@runtime_checkable
class FileParser(Protocol):
    """Reads one framework's config file (its content already parsed to a mapping)."""

    name: str

    def matches(self, data: Mapping[str, Any], path: str) -> bool: ...

    def parse(self, data: Mapping[str, Any], path: str) -> ImportedRun: ...


# ------------------------------------------------------------------------------------------------ programs

_PYTHONS = ("python", "python3", "py")


def program(argv: Sequence[str]) -> tuple[str, int]:
    """The program ``argv`` runs and the index of its first argument.

    ``/opt/bin/llama-server ...`` -> ``("llama-server", 1)``; ``python3 -m vllm.entrypoints.openai.api_server
    ...`` -> ``("vllm.entrypoints.openai.api_server", 3)``; ``python -m sglang.launch_server`` likewise; a
    Windows ``.exe`` suffix is dropped. Not a program (empty argv): ``("", 0)``."""
    if not argv:
        return "", 0
    name = os.path.basename(argv[0].replace("\\", "/")).removesuffix(".exe")
    bare = name.rstrip("0123456789.")
    if bare in _PYTHONS:
        for i in range(1, len(argv) - 1):
            if argv[i] == "-m":
                return argv[i + 1], i + 2
            if not argv[i].startswith("-"):  # python script.py ...
                return os.path.basename(argv[i]), i + 1
    return name, 1


# ------------------------------------------------------------------------------------------------ options


@dataclass(frozen=True)
class Arg:
    """One option (``name`` as written, before any ``=``; ``key`` normalised) or positional word of a
    command. ``index`` is its position (argument 0 is the program); ``text`` the words as written."""

    index: int
    name: str | None
    key: str | None
    value: str | None
    text: str

    @property
    def where(self) -> str:
        shown = self.name if self.name is not None else self.value or ""
        return f"argument {self.index} {clip(shown)!r}"


def words(text: str) -> tuple[str, ...]:
    """A table of option names written as one string."""
    return tuple(text.split())


def _option_like(word: str) -> bool:
    if not word.startswith("-") or word == "-":
        return False
    try:
        float(word)
    except ValueError:
        return True
    return False  # a negative number is a value (-ngl -1)


def split_options(
    argv: Sequence[str],
    start: int,
    *,
    flags: Collection[str] = (),
    valued: Collection[str] = (),
    normalize: Any = None,
) -> list[Arg]:
    """The words of ``argv`` from ``start`` on, as options and positionals.

    ``--name=value`` carries its value; a ``flags`` option takes none; a ``valued`` option takes the next
    word (missing: an error at its position); an option in neither takes the next word when that is not
    itself an option. ``normalize`` maps a written name to its key (vLLM: underscores as dashes)."""
    out: list[Arg] = []
    i = start
    while i < len(argv):
        word = argv[i]
        if not _option_like(word):
            out.append(Arg(i, None, None, word, word))
            i += 1
            continue
        name, eq, inline = word.partition("=")  # argparse takes --name=value and -n=value alike
        key = normalize(name) if normalize else name
        if eq:
            out.append(Arg(i, name, key, inline, word))
            i += 1
        elif key in flags:
            out.append(Arg(i, name, key, None, word))
            i += 1
        elif key in valued or (i + 1 < len(argv) and not _option_like(argv[i + 1])):
            if i + 1 >= len(argv):
                raise GpumemInputError(f"argument {i} {clip(name)!r}: needs a value")
            out.append(Arg(i, name, key, argv[i + 1], f"{word} {argv[i + 1]}"))
            i += 2
        else:
            out.append(Arg(i, name, key, None, word))
            i += 1
    return out


# ------------------------------------------------------------------------------------------------ reading


# --dtype of vLLM and SGLang (vllm/config ModelConfig dtype, sglang server_args.py dtype choices)
TORCH_DTYPES = SERVER_DTYPES  # vLLM's and SGLang's --dtype (runtimes/base.py, shared with their commands)


class Reading:
    """What a parser has read so far: run fields (each with where it came from), ``read as`` pairs and
    warnings; :meth:`inference` / :meth:`training` build the :class:`ImportedRun`."""

    def __init__(self, source: str, *, file: str | None = None) -> None:
        self.source = source
        self.file = file
        self.fields: dict[str, Any] = {}
        self.origin: dict[str, str] = {}
        self.read_as: list[tuple[str, str]] = []
        self.warnings: list[str] = []
        self.from_model: list[tuple[str, str, str, str]] = []
        self.dtype_weights: tuple[str, str] | None = None  # see ImportedRun.dtype_weights
        self.no_model: list[str] = []

    def set(self, field: str, value: Any, where: str, written: str, shown: str | None = None) -> None:
        """Set run field ``field`` from the option at ``where`` (written as ``written``)."""
        self.fields[field] = value
        self.origin[field] = where
        self.read_as.append((clip(written), shown if shown is not None else f"{field} = {_show(value)}"))

    def note(self, written: str, meaning: str) -> None:
        """An option read without setting a run field (the model, a value that confirms a default)."""
        self.read_as.append((clip(written), meaning))

    def maybe(
        self, run_type: type, fields: tuple[str, ...], value: Any, where: str, written: str, why: str
    ) -> None:
        """Set the first of ``fields`` that ``run_type`` declares; none declared: a warning saying ``why``
        the option matters."""
        field = next((f for f in fields if f in run_type.model_fields), None)
        if field is None:
            self.warn(written, why)
        else:
            self.set(field, value, where, written)

    def torch_dtype(self, engine: str, value: Any, where: str, written: str) -> None:
        """A PyTorch server's ``--dtype`` (vLLM, SGLang: auto, half/float16, bfloat16, float/float32): the
        compute dtype, and that of the weights of an unquantized checkpoint (decided by
        :meth:`ImportedRun.with_model`, unless a quantization option sets the weights)."""
        text = str(value).lower()
        if text == "auto":
            self.note(written, "the checkpoint's dtype (gpumem: bf16)")
            return
        dt = TORCH_DTYPES.get(text)
        if dt is None:
            raise self.error(
                where,
                f"{value!r} is not a{'n' if engine[0] in 'AEIOS' else ''} {engine} dtype "
                f"(auto, {', '.join(TORCH_DTYPES)})",
            )
        self.set("compute_dtype", dt, where, written)
        self.dtype_weights = (dt, clip(written))

    def warn(self, written: str, why: str = "not modelled by gpumem; ignored") -> None:
        """An option gpumem does not model: named, never dropped silently."""
        self.warnings.append(f"{clip(written)}: {why}")

    def missing_model(self, written: str, why: str) -> None:
        """Why the input names no model gpumem loads (:attr:`ImportedRun.no_model`): no warning, since the
        model given beside it (the CLI's MODEL, the window's model) answers it."""
        self.no_model.append(f"{clip(written)}: {why}")

    def error(self, where: str, message: str) -> GpumemInputError:
        return GpumemInputError(f"{where}: {message}", source=self.file)

    def _build(self, make: Any) -> Any:
        try:
            return make(**self.fields)
        except GpumemInputError as e:
            where = self.origin.get(str(e.field or "").split(".")[0])
            if where is None and not e.field:  # a check across fields: the last option it names
                named = [f for f in self.origin if f in str(e.message)]
                where = self.origin[named[-1]] if named else None
            if where is None:
                raise GpumemInputError(e.message, source=self.file or self.source, field=e.field) from None
            raise self.error(where, e.message) from None

    def inference(self, model: str | None) -> ImportedRun:
        return self._done(model, self._build(make_run))

    def training(self, model: str | None) -> ImportedRun:
        return self._done(model, self._build(make_training_run))

    def _done(self, model: str | None, run: InferenceRun | TrainingRun) -> ImportedRun:
        return ImportedRun(
            model=model,
            run=run,
            source=self.source,
            read_as=tuple(self.read_as),
            warnings=tuple(dict.fromkeys(self.warnings)),
            from_model=tuple(self.from_model),
            # a quantization option names the weights itself (vLLM --quantization, SGLang's likewise)
            dtype_weights=None if "weights" in self.fields else self.dtype_weights,
            no_model=tuple(self.no_model),
        )


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


@runtime_checkable
class TextFileParser(Protocol):
    """Reads a runtime's own text file format (not a mapping of settings: an Ollama Modelfile)."""

    name: str

    def matches_text(self, text: str, path: str) -> bool: ...

    def parse_text(self, text: str, path: str) -> ImportedRun: ...
