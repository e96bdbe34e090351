"""Issue 18, the files gpumem reads and writes outside the model readers: fake-GPU scenarios, the window's
scenarios, ``gpumem-gui <file>`` at start, the shared reading helper (gpumem_gui/files.py) and saves
(mode and symbolic links); and properties of the parsers that take structured input."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumem_gui import files
from gpumem_gui.core import GpumemInputError
from gpumem_gui.core.errors import MAX_ECHO, clip, short
from gpumem_gui.core.readers.weights import classify_tensor
from gpumem_gui.files import FileReadError, atomic_write, json_problem, read_json
from gpumem_gui.hardware import load_scenario
from gpumem_gui.ui.scenario import ScenarioError, read_scenario
from tests.conftest import REPO
from tests.rough_inputs import LLAMA_CONFIG, huge_int_json, nested_json

SCENARIO = {"format": "gpumem-scenario", "version": 2, "model": {"source": "Llama-3.1-8B"}}
FAKE = {"gpus": [{"name": "NVIDIA GeForce RTX 4090", "total_mib": 24564}]}


def _python(code: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a child process with a timeout: a read that blocks fails the test instead of hanging it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=cwd, capture_output=True, text=True, timeout=120, env=env
    )


# ---- fake-GPU and window scenario files: huge integers, deep nesting, FIFOs, devices, caps -----------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (huge_int_json(FAKE), "4,300 digits"),
        (nested_json(100), "nested too deeply"),
        (nested_json(100_000), "nested too deeply"),
        (json.dumps({**FAKE, "k" * 100_000: 1}), "Extra inputs are not permitted"),
    ],
)
def test_bad_fake_gpu_scenarios_are_input_errors(tmp_path: Path, text: str, words: str) -> None:
    (tmp_path / "s.json").write_text(text)
    with pytest.raises(GpumemInputError) as e:
        load_scenario(tmp_path / "s.json")
    assert words in str(e.value) and str(tmp_path / "s.json") in str(e.value)
    assert len(str(e.value)) < 400 and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (huge_int_json(SCENARIO), "4,300 digits"),
        (nested_json(100), "nested too deeply"),
        (nested_json(100_000), "nested too deeply"),
        (json.dumps({**SCENARIO, "k" * 100_000: 1}), "Extra inputs are not permitted"),
        (json.dumps({**SCENARIO, "format": "f" * 100_000}), "not a gpumem scenario"),
    ],
)
def test_bad_window_scenarios_are_one_line(tmp_path: Path, text: str, words: str) -> None:
    (tmp_path / "s.json").write_text(text)
    with pytest.raises(ScenarioError) as e:
        read_scenario(tmp_path / "s.json")
    assert words in str(e.value) and len(str(e.value)) < 400 and "\n" not in str(e.value)


def test_scenario_files_that_are_no_regular_files_never_block(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    (tmp_path / "dir.json").mkdir()
    code = (
        "import sys\n"
        "from gpumem_gui.core import GpumemInputError\n"
        "from gpumem_gui.hardware import load_scenario\n"
        "from gpumem_gui.ui.scenario import ScenarioError, looks_like_scenario, read_scenario\n"
        "for name in sys.argv[1:]:\n"
        "    assert not looks_like_scenario(name)\n"
        "    for read, error in ((read_scenario, ScenarioError), (load_scenario, GpumemInputError)):\n"
        "        try:\n"
        "            read(name)\n"
        "        except error as e:\n"
        "            print(e)\n"
    )
    proc = _python(code, "fifo.json", "zero.json", "dir.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "fifo.json: is a FIFO (named pipe), not a scenario",
        "fifo.json: is a FIFO (named pipe), not a fake GPU scenario",
        "zero.json: is a device, not a scenario",
        "zero.json: is a device, not a fake GPU scenario",
        "dir.json: is a folder, not a scenario",
        "dir.json: is a folder, not a fake GPU scenario",
    ]


def test_scenario_files_over_their_cap(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text(json.dumps(SCENARIO))
    with big.open("r+b") as f:
        f.truncate((8 << 20) + 1)  # sparse: over both caps, nothing written
    with pytest.raises(ScenarioError, match=r"is 8,388,609 bytes; a scenario is at most 1,048,576 bytes"):
        read_scenario(big)
    with pytest.raises(GpumemInputError, match=r"a fake GPU scenario is at most 8,388,608 bytes"):
        load_scenario(big)


def test_gpumem_gui_starts_with_a_scenario_it_cannot_read(tmp_path: Path) -> None:
    """`gpumem-gui scenario.json` opened the path without the window's guard and died at start."""
    (tmp_path / "huge.json").write_text(huge_int_json(SCENARIO))
    os.mkfifo(tmp_path / "fifo.json")
    code = "import sys; from gpumem_gui.app import main; sys.exit(main(sys.argv[1:]))"
    for name, words in (("huge.json", "4,300 digits"), ("fifo.json", "not a regular file")):
        proc = _python(code, name, "--fake-gpus", "no_driver", "--quit-after-paint", cwd=tmp_path)
        # the window started and painted (the exit status is not the point here: the quit after the paint
        # has been seen to end in SIGSEGV now and then without any path given)
        assert "first-paint" in proc.stdout and "Traceback" not in proc.stderr, proc.stderr
        errors = [line for line in proc.stderr.splitlines() if line.startswith("gpumem-gui:")]
        assert len(errors) == 1 and f"could not open {name}" in errors[0] and words in errors[0], proc.stderr


# ---- saves: the umask, the replaced file's mode, symbolic links --------------------------------------------


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_gets_its_mode_from_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    old = os.umask(umask)
    try:
        atomic_write(tmp_path / "plan.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "plan.json").stat().st_mode) == mode


def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    target.write_text("old")
    target.chmod(0o640)
    atomic_write(target, "new")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640


def test_saving_through_a_symlink_keeps_the_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "plan.json"
    real.write_text("old")
    link = tmp_path / "plan.json"
    link.symlink_to(Path("real") / "plan.json")  # relative, as `ln -s` makes them
    atomic_write(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(Path("real") / "plan.json")
    assert real.read_text() == "new"
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["plan.json"]  # no temporary left


# ---- properties: every parser here is total ----------------------------------------------------------------

_PROPS = settings(
    max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


@_PROPS
@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_json_problem_is_total_on_any_text(text: str) -> None:
    doc, problem = json_problem(text)
    if problem is None:
        assert doc == json.loads(text) or doc != doc  # NaN
    else:
        assert doc is None and "\n" not in problem and len(problem) < 200


@_PROPS
@given(_json)
def test_json_problem_reads_what_json_writes(doc: object) -> None:
    assert json_problem(json.dumps(doc)) == (doc, None)


@_PROPS
@given(st.integers(1, 90), st.integers(1, 90))
def test_json_depth_limit(depth: int, limit: int) -> None:
    assert (json_problem(nested_json(depth), limit)[1] is None) == (depth <= limit)


@_PROPS
@given(st.binary(max_size=200))
def test_read_json_on_any_bytes_is_a_document_or_a_file_read_error(tmp_path_factory, data: bytes) -> None:
    f = tmp_path_factory.mktemp("j") / "x.json"
    f.write_bytes(data)
    try:
        read_json(f, 100)
    except FileReadError as e:
        assert e.path == str(f) and "\n" not in e.problem


@_PROPS
@given(st.one_of(_json, st.text(), st.integers(-(10**1000), 10**1000), st.binary()), st.integers(10, 200))
def test_short_and_clip_are_bounded_single_lines(value: object, limit: int) -> None:
    for text in (short(value, limit), clip(str(value)[:10_000], limit)):
        assert len(text) <= limit + 2 and text.isprintable()


@_PROPS
@given(st.text(max_size=2000), st.text(max_size=2000) | st.none(), st.text(max_size=2000) | st.none())
def test_input_errors_are_one_bounded_line(message: str, source: str | None, field: str | None) -> None:
    line = str(GpumemInputError(message, source=source, field=field))
    assert "\n" not in line and "\r" not in line and len(line) <= 600 + 160 + MAX_ECHO + 20


@_PROPS
@given(st.lists(st.text(max_size=8) | st.integers(0, 10**6).map(str) | st.just("9" * 5000), max_size=8))
def test_classify_tensor_is_total(parts: list[str]) -> None:
    component, layer = classify_tensor(".".join(parts) or "x")
    assert isinstance(component, str) and (layer is None or 0 <= layer < 10**9)


def test_path_kind_and_listing(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "p")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert files.list_folder(tmp_path) == [
        ("d", "folder"),
        ("dangling", "missing"),
        ("f", "file"),
        ("p", "other"),
    ]
    assert files.path_kind(tmp_path / "f" / "x") == "missing"  # ENOTDIR
    assert files.path_kind(tmp_path / ("a" * 300)) == "missing"  # ENAMETOOLONG
    with pytest.raises(FileReadError, match="cannot read"):
        files.list_folder(tmp_path / "f")


@pytest.mark.parametrize("field", ["used_mib", "utilization_percent", "temperature_c", "power_draw_w"])
def test_an_empty_reading_series_is_refused(field: str) -> None:
    """An empty per-step list passed validation and made a snapshot divide by zero (the fuzz suite)."""
    gpu = {**FAKE["gpus"][0], field: []}
    with pytest.raises(GpumemInputError, match=rf"field 'gpus.0.{field}': an empty list"):
        load_scenario({"gpus": [gpu]})
    with pytest.raises(GpumemInputError, match=r"field 'gpus.0.processes.0.used_mib': an empty list"):
        load_scenario({"gpus": [{**FAKE["gpus"][0], "processes": [{"pid": 1, "used_mib": []}]}]})


@pytest.mark.parametrize("key", ["attn_logit_softcapping", "final_logit_softcapping"])
@pytest.mark.parametrize("value", [10**400, "inf", 0, -1.0, True])
def test_a_soft_capping_value_must_be_a_positive_finite_number(key: str, value: object) -> None:
    """10**400 (a JSON integer) made float() raise OverflowError (found by the fuzz suite)."""
    from gpumem_gui.core import spec_from_config

    cfg = {**LLAMA_CONFIG, "model_type": "gemma2", "head_dim": 8, key: value}
    with pytest.raises(GpumemInputError, match=rf"field '{key}': must be a positive number, got "):
        spec_from_config(cfg, name="g")
