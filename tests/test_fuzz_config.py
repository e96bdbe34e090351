"""Fuzz: config.json files (and their folders) through ``load_model``, then an estimate of what loaded.

Every generated file is a model or one GpumemInputError (tests/fuzz_strategies.py states the property).
Inputs: the reference configs mutated at any depth (``text_config``, ``rope_scaling``, ``quantization_config``
...) with extreme values, and their JSON text mutated (cut short, spliced, a number replaced by a
4,301-digit integer or ``Infinity``, wrapped in 3,000 brackets).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from gpumem_gui.core import (
    estimate_inference,
    estimate_training,
    load_model,
    make_run,
    make_training_run,
)
from tests.conftest import reference_dir
from tests.fuzz_strategies import (
    DEEP_DICT,
    DEEP_LIST,
    HUGE_INT,
    accepted_or_refused,
    documents,
    fuzz_settings,
    passing_over_known_bugs,
    values_in,
)

REAL: list[dict[str, Any]] = [
    json.loads(p.read_text()) for p in sorted((reference_dir() / "configs").glob("*.json"))
]


def _keys(doc: Any) -> set[str]:
    if isinstance(doc, dict):
        return set(doc) | {k for v in doc.values() for k in _keys(v)}
    if isinstance(doc, list):
        return {k for v in doc for k in _keys(v)}
    return set()


KEYS = sorted(set().union(*(_keys(c) for c in REAL)))
LLAMA = next(c for c in REAL if c.get("model_type") == "llama")
MIXTRAL_LIKE = next(c for c in REAL if "num_experts_per_tok" in c or "num_experts_per_token" in c)
GEMMA3 = next((c for c in REAL if c.get("model_type") == "gemma3"), LLAMA)


def _with(base: dict[str, Any], **changes: Any) -> str:
    return json.dumps({**base, **changes})


# the reproducers, as config texts
REPRODUCERS = [
    '{"model_type": "llama", "hidden_size": ' + HUGE_INT + "}",
    json.dumps(LLAMA)[:-1] + ', "x": ' + DEEP_LIST + "}",
    json.dumps(LLAMA)[:-1] + ', "x": ' + DEEP_DICT + "}",
    _with(MIXTRAL_LIKE, num_experts_per_tok=9999),  # top-k above the expert count
    _with(LLAMA, num_hidden_layers=4097),
    _with(LLAMA, vocab_size=2**63),
    json.dumps(LLAMA).replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": Infinity'),
]


def _load_and_estimate(folder: Path, as_file: bool, values: list[str]) -> None:
    source = folder / "config.json" if as_file else folder
    m = accepted_or_refused(lambda: load_model(str(source)), values)
    if m is None or m.spec is None:
        return
    assert m.params is not None and m.params.total > 0
    accepted_or_refused(lambda: estimate_inference(m.spec, make_run()), values)
    accepted_or_refused(lambda: estimate_training(m.spec, make_training_run()), values)


def check_config_text(text: str, as_file: bool) -> None:
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "model"
        folder.mkdir()
        (folder / "config.json").write_text(text, encoding="utf-8")
        _load_and_estimate(folder, as_file, values_in(text))


@fuzz_settings(120)
@given(text=documents(REAL, KEYS), as_file=st.booleans())
@example(text=REPRODUCERS[0], as_file=False)
@example(text=REPRODUCERS[1], as_file=True)
@example(text=REPRODUCERS[2], as_file=False)
@example(text=REPRODUCERS[3], as_file=False)
@example(text=REPRODUCERS[4], as_file=True)
@example(text=REPRODUCERS[5], as_file=False)
@example(text=REPRODUCERS[6], as_file=False)
def test_config_json_is_a_model_or_one_line(text: str, as_file: bool) -> None:
    with passing_over_known_bugs():
        check_config_text(text, as_file)


@fuzz_settings(30)
@given(data=st.binary(max_size=512))
@example(data=b"\xff\xfe{}")
@example(data=b"")
def test_config_json_bytes(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_bytes(data)
        accepted_or_refused(lambda: load_model(str(Path(d) / "config.json")), [])


def test_found_long_config_integer_is_clipped() -> None:
    """Found by this suite: a 401-digit value was echoed whole ('must be <= 2147483648, got 1000...')."""
    check_config_text(_with(LLAMA, hidden_size=10**400), as_file=False)


GEMMA2 = next(c for c in REAL if c.get("model_type") == "gemma2")


def test_found_float_field_given_a_huge_integer() -> None:
    """Found by this suite: attn_logit_softcapping = 10**400 (a JSON integer) in a Gemma-2 config raised
    OverflowError 'int too large to convert to float' (core/readers/traits.py)."""
    check_config_text(_with(GEMMA2, attn_logit_softcapping=10**400), as_file=False)
