"""The structure issue 12 set up stays: architecture names are read only by the readers, and every module
and function stays small enough to hold in one's head."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

CORE = REPO / "gpumem_gui" / "core"
SOURCE_DIRS = ("gpumem_gui", "validation", "benchmarks", "packaging", "resources/tools", "tests")
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 80


def _sources() -> list[Path]:
    return sorted(p for d in SOURCE_DIRS for p in (REPO / d).rglob("*.py") if "__pycache__" not in p.parts)


def test_only_the_readers_read_model_type() -> None:
    """Quirks are ArchTraits set by the readers; nothing else in the core branches on an architecture name."""
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        if "readers" in path.relative_to(CORE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "model_type"
                and isinstance(node.ctx, ast.Load)
            ):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_modules_and_functions_are_small(path: Path) -> None:
    rel = str(path.relative_to(REPO))
    text = path.read_text(encoding="utf-8")
    assert text.count("\n") <= MAX_MODULE_LINES, f"{rel}: {text.count(chr(10))} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            assert n <= MAX_FUNCTION_LINES, f"{rel}:{node.lineno} {node.name} is {n} lines"
