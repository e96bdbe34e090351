"""Fuzz: the command and config importers (gpumem_gui.core.imports) on generated input.

Commands: the published ones with words dropped, swapped, duplicated or replaced by extreme values, and
random text. Configs: the published fixtures with keys replaced by extreme or wrongly typed values, and random
bytes. The property: an :class:`ImportedRun` or one :class:`GpumemInputError` line (no other exception, no
newline, at most ~80 characters of any value echoed), quickly.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpumem_gui.core import GpumemInputError, ImportedRun, import_command, import_file
from tests.fuzz_strategies import ECHO_TOLERANCE, JSON_VALUES, dumps, echoed, fuzz_settings

DATA = Path(__file__).parent / "data" / "imports"
COMMANDS = [c["command"] for c in json.loads((DATA / "commands.json").read_text(encoding="utf-8"))]
COMMANDS += [
    "vllm serve Qwen/Qwen3-8B -tp 2 --max-model-len 32k --kv-cache-dtype fp8 "
    "-O '{\"cudagraph_capture_sizes\": [1, 2]}'",
    "llama-server -m m.gguf -c 8192 -np 4 -ngl 99 -fa on -ctk q8_0 -ctv q8_0 -b 4096 -ub 1024",
    "llama-bench -m m.gguf -p 512 -n 128 -fa 0,1 -ctk f16,q8_0",
]
CONFIGS = sorted(
    p for p in DATA.iterdir() if p.suffix in (".yaml", ".yml", ".json", ".toml") and p.name != "commands.json"
)
WORDS = [
    "-tp",
    "--max-model-len",
    "-c",
    "-np",
    "-ngl",
    "-fa",
    "-ctk",
    "--kv-cache-dtype",
    "--dtype",
    "-q",
    "--model",
    "-m",
    "0",
    "-1",
    "1e999",
    "nan",
    "99999999999999999999999",
    "auto",
    "fp8",
    "q8_0",
    "on",
    "'",
    '"',
    "\\",
    "|",
    "=",
    "--x=",
    "-dp=8",
    "serve",
    "vllm",
    "python",
    "-m",
    "llama-server",
    "x" * 5000,
    "\x00",
    "é",
    "{",
    "[1,",
]


def _check(call: Any, values: list[str]) -> None:
    start = time.monotonic()
    try:
        out = call()
    except GpumemInputError as e:
        message = str(e)
        assert "\n" not in message, message
        assert echoed(message, values, ECHO_TOLERANCE) is None, message
    else:
        assert isinstance(out, ImportedRun)
    assert time.monotonic() - start < 5, "an import took over 5 s"


@fuzz_settings(150)
@given(
    base=st.sampled_from(COMMANDS),
    edits=st.lists(st.tuples(st.integers(0, 60), st.sampled_from([*WORDS, ""]), st.booleans()), max_size=6),
)
def test_commands_never_crash(base: str, edits: list[tuple[int, str, bool]]) -> None:
    words = base.split()
    for pos, word, insert in edits:
        i = pos % (len(words) + 1)
        if insert or i == len(words):
            words.insert(i, word)
        else:
            words[i] = word
    text = " ".join(words)
    _check(lambda: import_command(text), [text, *words])


@fuzz_settings(100)
@given(text=st.text(max_size=300))
def test_random_text_as_a_command(text: str) -> None:
    _check(lambda: import_command(text), [text])


def _replace(doc: Any, path: list[int], value: Any) -> Any:
    """``doc`` with the value at a position (chosen by ``path``, walking mappings) replaced by ``value``."""
    if not path or not isinstance(doc, dict) or not doc:
        return value
    keys = list(doc)
    k = keys[path[0] % len(keys)]
    return {**doc, k: _replace(doc[k], path[1:], value)}


@fuzz_settings(150)
@given(
    base=st.sampled_from(CONFIGS),
    path=st.lists(st.integers(0, 100), min_size=1, max_size=4),
    value=JSON_VALUES,
)
def test_configs_never_crash(tmp_path_factory: Any, base: Path, path: list[int], value: Any) -> None:
    if base.suffix == ".toml":
        import tomllib

        doc = tomllib.loads(base.read_text(encoding="utf-8"))
    else:
        doc = yaml.safe_load(base.read_text(encoding="utf-8"))
    doc = _replace(doc, path, value)
    out = tmp_path_factory.mktemp("cfg") / (base.stem + ".json")
    try:
        out.write_text(dumps(doc), encoding="utf-8")
    except (ValueError, RecursionError, TypeError):
        return  # a value JSON cannot hold: nothing to read
    _check(lambda: import_file(str(out)), [str(value)])


@fuzz_settings(100)
@given(data=st.binary(max_size=400), suffix=st.sampled_from([".yaml", ".json", ".toml", ".cfg"]))
def test_random_bytes_as_a_config(tmp_path_factory: Any, data: bytes, suffix: str) -> None:
    out = tmp_path_factory.mktemp("raw") / f"x{suffix}"
    out.write_bytes(data)
    _check(lambda: import_file(str(out)), [data.decode("utf-8", "replace")])
