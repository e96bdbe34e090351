"""What every section shares: paths, the reference data's location, and the report's rows."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent  # validation/
REPO = HERE.parent
if str(REPO) not in sys.path:  # a source tree that was never installed
    sys.path.insert(0, str(REPO))

from gpumem_gui.core.readers.catalog import find_model  # noqa: E402
from gpumem_gui.core.readers.hf_config import load_config_file  # noqa: E402
from gpumem_gui.core.spec.encoder import with_head  # noqa: E402
from gpumem_gui.core.spec.model import ModelSpec  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
REASON_THRESHOLD = 0.05  # rows off by more than this carry a one-line reason
EXTRA = REPO / "tests" / "reference" / "extra"
DATA_DIR = HERE / "data"
PEERS_FILE = HERE / "peers.json"
PEERS_VENV = Path(os.environ.get("GPUMEM_PEERS_VENV", "/tmp/peers-venv"))
GT_VENV = Path(os.environ.get("GPUMEM_GT_VENV", "/tmp/gt-venv"))


def reference_dir() -> Path:
    """``$GPUMEM_REFERENCE``, else ``../shared/reference`` beside the checkout, else the vendored copy."""
    env = os.environ.get("GPUMEM_REFERENCE")
    if env:
        return Path(env)
    shared = REPO.parent / "shared" / "reference"
    if (shared / "groundtruth.json").is_file():
        return shared
    return REPO / "tests" / "reference"


def _config_dirs() -> tuple[Path, ...]:
    return (reference_dir() / "configs", REPO / "tests" / "reference" / "configs", EXTRA / "configs")


def config_path(name: str) -> Path:
    for d in _config_dirs():
        if (d / f"{name}.json").is_file():
            return d / f"{name}.json"
    raise FileNotFoundError(f"no config {name}.json in {', '.join(str(d) for d in _config_dirs())}")


def spec_for(model: str) -> ModelSpec:
    """A catalog model, or ``config:<name>`` for a config file of the reference data; an encoder's task head
    after a ``#`` (``google-bert/bert-large-uncased#sequence_classification:2``, as ``--task`` and
    ``--num-labels`` give it)."""
    if "#" in model:
        base, _, head = model.partition("#")
        task, _, labels = head.partition(":")
        return with_head(spec_for(base), task, int(labels) if labels else None)
    if model.startswith("config:"):
        return load_config_file(config_path(model.removeprefix("config:")))
    entry = find_model(model)
    if entry is None:
        raise KeyError(f"{model} is not in the model catalog")
    return entry.spec


def short(model: str) -> str:
    """A grid point's model without its organisation: ``meta-llama__Llama-3.2-1B`` -> ``Llama-3.2-1B``."""
    return model.split("__", 1)[-1]


@dataclass(frozen=True)
class Row:
    """One comparison: a measured (or published) number and ours for the same setup."""

    table: str  # "grid" | "llama.cpp" | "vllm"
    kind: str  # what kind of number (summary lines are per kind)
    sort_key: tuple
    setup: str
    measured: float
    ours: float
    unit: str = "bytes"  # bytes | tokens | blocks | x
    bytes_per_unit: float = 1.0  # to express an error in GiB (tokens -> KV bytes)
    metric: str = ""  # the published line, verbatim
    reason: str = ""
    source: str = ""
    kv_measured: int | None = None
    kv_ours: int | None = None
    phases: tuple[tuple[float, float], ...] = ()  # training: (measured, ours) per phase

    @property
    def err(self) -> float:
        return (self.ours - self.measured) / self.measured if self.measured else math.inf

    @property
    def err_gib(self) -> float:
        return (self.ours - self.measured) * self.bytes_per_unit / GiB


def replace_row(row: Row, **upd: object) -> Row:
    return Row(**{**row.__dict__, **upd})


@dataclass
class Report:
    grid: list[Row] = field(default_factory=list)
    published: list[Row] = field(default_factory=list)
    mapping: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    not_reproduced: list[tuple[str, str, str, str]] = field(default_factory=list)
    train: list[Row] = field(default_factory=list)
    train_phases: list[Row] = field(default_factory=list)
    train_published: list[Row] = field(default_factory=list)
    train_mapping: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    train_bounds: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    peers: list[dict] = field(default_factory=list)
    train_peers: list[dict] = field(default_factory=list)
    peers_note: str = ""
    ranks: list[Any] = field(default_factory=list)  # section (g): distributed.TruthFile per reference file
    published_runs: dict[str, Any] = field(default_factory=dict)  # section (h): result.json's summary
    engines: Any = None  # section (i): engines.EngineSection
    ooms: list[Any] = field(default_factory=list)  # section (j): published_ooms.OomRow per report
    versions: dict[str, str] = field(default_factory=dict)
