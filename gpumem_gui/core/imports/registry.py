"""Which parser reads which command or file, and the two entry points: :func:`import_command` and
:func:`import_file`.

Parsers are found by module: each module named in :data:`COMMAND_MODULES` defines ``PARSERS``, a tuple of
:class:`~.base.CommandParser`; each in :data:`FILE_MODULES` defines ``PARSERS`` of
:class:`~.base.FileParser`. A module not (yet) present is skipped; :func:`command_parsers` lists what is
there. File parsers are tried in order, most specific first (a DeepSpeed JSON before a Trainer arguments
JSON).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import tomllib
from collections.abc import Mapping
from functools import cache
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, clip, short
from gpumem_gui.core.imports.base import CommandParser, FileParser, ImportedRun, TextFileParser, program
from gpumem_gui.core.readers.reading import read_text_file

COMMAND_MODULES = ("vllm", "llamacpp", "sglang", "ollama")
FILE_MODULES = ("torchtune", "torchtitan", "axolotl", "llamafactory", "accelerate", "deepspeed", "hf_args")
# modules defining TEXT_PARSERS: a runtime's own text format, tried before the settings formats
TEXT_MODULES = ("ollama",)

# Longest command or config gpumem reads: a launch command is a few hundred characters; the largest published
# recipe YAMLs are ~10 KB. Beyond this the input is not a command or config.
MAX_COMMAND_CHARS = 20_000
MAX_FILE_BYTES = 2_000_000


def _load(modules: tuple[str, ...], attr: str = "PARSERS") -> tuple[Any, ...]:
    out: list[Any] = []
    for name in modules:
        full = f"{__package__}.{name}"
        try:
            mod = importlib.import_module(full)
        except ModuleNotFoundError as e:
            if e.name != full:
                raise
            continue
        out.extend(getattr(mod, attr))
    return tuple(out)


@cache
def command_parsers() -> tuple[CommandParser, ...]:
    return _load(COMMAND_MODULES)


@cache
def file_parsers() -> tuple[FileParser, ...]:
    return _load(FILE_MODULES)


@cache
def text_parsers() -> tuple[TextFileParser, ...]:
    return _load(TEXT_MODULES, "TEXT_PARSERS")


# ------------------------------------------------------------------------------------------------ commands

# a backslash line continuation, and the shell prompt a published example may repeat on the next line
_CONTINUATION = re.compile(r"\\\r?\n\s*(?:[$>]\s+)?")
_SEPARATORS = ("&&", "||", ";", "|", "&")
_WRAPPERS = ("env", "sudo", "nohup", "exec", "time")


def split_command(text: str) -> tuple[list[str], dict[str, str]]:
    """``text`` as words (shell quoting; ``\\`` line continuations; ``#`` comments and comment lines; a
    leading ``$ `` prompt) and its leading ``VAR=value`` assignments."""
    if len(text) > MAX_COMMAND_CHARS:
        raise GpumemInputError(f"the command is {len(text):,} characters; at most {MAX_COMMAND_CHARS:,}")
    text = _CONTINUATION.sub(" ", text)
    lines = [ln.strip() for ln in text.splitlines()]
    # a whole comment line (a copied command's "# gpumem, not in this command: ...") goes before the lines
    # are joined: joined, it would comment out every line after it
    lines = [ln.removeprefix("$ ").removeprefix("> ") for ln in lines if ln and not ln.startswith("#")]
    joined = " ".join(lines)
    try:
        words = shlex.split(joined, comments=True, posix=not _windows(joined))
    except ValueError as e:
        raise GpumemInputError(f"the command cannot be split into words: {e} (an unclosed quote?)") from None
    if _windows(joined):
        words = [w[1:-1] if len(w) > 1 and w[0] == w[-1] and w[0] in "\"'" else w for w in words]
    env: dict[str, str] = {}
    while words and (words[0] in _WRAPPERS or _assignment(words[0])):
        word = words.pop(0)
        if word not in _WRAPPERS:
            name, _, value = word.partition("=")
            env[name] = value
    for i, word in enumerate(words):
        if word in _SEPARATORS:
            raise GpumemInputError(f"argument {i} {word!r}: paste one command (no pipes or command lists)")
    return words, env


def _windows(text: str) -> bool:
    """A Windows command (``llama-server.exe -m models\\7B\\x.gguf``): backslashes are path separators, not
    escapes, so the words are split the way ``cmd`` does (quotes kept together, then removed)."""
    first = text.split(maxsplit=1)[0] if text.split() else ""
    return first.lower().endswith(".exe") or (len(first) > 2 and first[1:3] == ":\\")


def _assignment(word: str) -> bool:
    name, eq, _ = word.partition("=")
    return bool(eq) and name.isidentifier()


def import_command(text: str, env: Mapping[str, str] | None = None) -> ImportedRun:
    """Read a launch command (``vllm serve Qwen/Qwen3-8B -tp 2``, ``python -m vllm.entrypoints...``,
    ``llama-server -m x.gguf -c 8192``, with any leading ``VAR=value`` assignments, which join ``env``)."""
    argv, assigned = split_command(text)
    if not argv:
        raise GpumemInputError("the command is empty: paste a launch command (vllm serve, llama-server ...)")
    merged = {**(env or {}), **assigned}
    for parser in command_parsers():
        if parser.matches(argv):
            return parser.parse(argv, merged)
    name, _ = program(argv)
    known = ", ".join(p.name for p in command_parsers())
    raise GpumemInputError(f"argument 0 {clip(name)!r}: not a launch command gpumem reads ({known})")


# ------------------------------------------------------------------------------------------------ files


def read_config_text(path: str) -> str:
    """A config file's text: a regular file only (never a FIFO or a device), at most MAX_FILE_BYTES, UTF-8
    (gpumem_gui/files.py through core/readers/reading.py)."""
    return read_text_file(path, MAX_FILE_BYTES, "config")


def read_config(path: str, text: str | None = None) -> Mapping[str, Any]:
    """A config file's content as a mapping: JSON / TOML / YAML by extension, else by content."""
    if text is None:
        text = read_config_text(path)
    if len(text) > MAX_FILE_BYTES:
        raise GpumemInputError(f"larger than {MAX_FILE_BYTES:,} characters: not a config", source=path)
    ext = os.path.splitext(path)[1].lower()
    kind = {".json": "json", ".toml": "toml", ".yaml": "yaml", ".yml": "yaml"}.get(ext)
    if kind is None:
        stripped = text.lstrip()
        kind = "json" if stripped.startswith("{") else "toml" if _looks_toml(stripped) else "yaml"
    data = {"json": _json, "toml": _toml, "yaml": _yaml}[kind](text, path)
    if not isinstance(data, Mapping):
        got = type(data).__name__
        raise GpumemInputError(f"expected a mapping of settings at the top, got {got}", source=path)
    return data


def _looks_toml(text: str) -> bool:
    first = next((ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
    return first.startswith("[")


def _json(text: str, path: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise GpumemInputError(f"line {e.lineno}, column {e.colno}: not JSON: {e.msg}", source=path) from None
    except RecursionError:
        raise GpumemInputError("nested too deeply to be a config", source=path) from None
    except ValueError as e:  # an integer over Python's 4,300-digit limit
        raise GpumemInputError(f"not a config: {clip(str(e), 120)}", source=path) from None


def _toml(text: str, path: str) -> Any:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise GpumemInputError(f"not TOML: {clip(str(e), 200)}", source=path) from None
    except (RecursionError, ValueError):
        raise GpumemInputError("nested too deeply or too large to be a config", source=path) from None


def _yaml(text: str, path: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        why = e.problem or e.context or "malformed"
        raise GpumemInputError(f"{at}not YAML: {why}", source=path) from None
    except (yaml.YAMLError, RecursionError, ValueError) as e:  # ValueError: a YAML int too long to print
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise GpumemInputError(f"not YAML: {clip(first, 200)}", source=path) from None


def import_file(path: str, text: str | None = None) -> ImportedRun:
    """Read a training config (torchtune recipe, Axolotl, LLaMA-Factory, DeepSpeed JSON, accelerate config,
    Trainer/TRL arguments JSON, torchtitan TOML); ``text``: its content when already read."""
    if text is None:
        text = read_config_text(path)
    for tparser in text_parsers():
        if tparser.matches_text(text, path):
            return tparser.parse_text(text, path)
    data = read_config(path, text)
    for parser in file_parsers():
        if parser.matches(data, path):
            try:
                return parser.parse(data, path)
            except GpumemInputError as e:
                if not e.source:
                    e.source = path
                raise
    keys = ", ".join(short(k, 30) for k in list(data)[:6])
    known = ", ".join(p.name for p in file_parsers())
    raise GpumemInputError(f"not a config gpumem reads ({known}); its keys: {keys or 'none'}", source=path)
