"""Inputs fuzzing found to crash (issue 33, item 10): each is now one line on stderr and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumem_gui.cli import main
from gpumem_gui.core import GpumemInputError
from gpumem_gui.core.fit.targets import parse_count
from gpumem_gui.hardware.prometheus import _index
from tests.conftest import REPO

CONFIGS = REPO / "resources" / "configs"


def _one_line_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("number", ["²", "+-5", "8²", "٣²"])
def test_unicode_digits_in_a_launch_command(number: str, capsys: pytest.CaptureFixture[str]) -> None:
    """str.isdigit() takes '²' and '٣', int() refuses them: the importers read ASCII digits only."""
    cmd = f"vllm serve meta-llama/Llama-3.1-8B --max-model-len {number}"
    assert "--max-model-len" in _one_line_exit_2(["estimate", "--from", cmd], capsys)


def test_an_integer_over_pythons_digit_limit_in_vllm_json(capsys: pytest.CaptureFixture[str]) -> None:
    big = "9" * 5000  # json.loads raises ValueError past sys.get_int_max_str_digits()
    cmd = f'vllm serve meta-llama/Llama-3.1-8B -O {{"max_cudagraph_capture_size": {big}}}'
    assert "-O" in _one_line_exit_2(["estimate", "--from", cmd], capsys)


def test_axolotl_plugins_not_a_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "axolotl.yml"
    cfg.write_text("base_model: meta-llama/Llama-3.1-8B\nplugins: 5\nsequence_len: 2048\n")
    assert "plugins" in _one_line_exit_2(["estimate", "--from-file", str(cfg)], capsys)


def test_mla_with_an_odd_rope_dim(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Read by inspect, crashed estimate and fit: the rotary part must split in halves."""
    cfg = json.loads((CONFIGS / "deepseek-ai__DeepSeek-V2-Lite.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "qk_rope_head_dim": 63}))
    for cmd in (["inspect"], ["estimate"], ["fit", "--gpu", "H100"]):
        assert "qk_rope_head_dim" in _one_line_exit_2([*cmd, str(path)], capsys)


def test_xielu_outside_a_plain_mlp(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = json.loads((CONFIGS / "meta-llama__Llama-3.1-8B.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "hidden_act": "xielu"}))
    assert "xielu" in _one_line_exit_2(["estimate", str(path)], capsys)


@pytest.mark.parametrize("label", ["²", "٣", "1²", "1234567"])
def test_gpu_labels_and_counts_take_ascii_digits_only(label: str) -> None:
    assert not _index(label)
    with pytest.raises(GpumemInputError):
        parse_count(label if label != "1234567" else "5000")


@pytest.mark.parametrize(
    ("result", "words"),
    [
        ({"resultType": "matrix", "result": [{"metric": {"gpu": "0"}, "values": []}]}, "no sample"),
        ({"resultType": "vector", "result": [{"metric": {}, "value": [1.7e308, "1"]}]}, "Unix time"),
        ({"resultType": "vector", "result": [{"metric": {}, "value": [-1.7e308, "1"]}]}, "Unix time"),
    ],
)
def test_prometheus_answers_that_crashed(result: dict, words: str) -> None:
    """An empty matrix series (IndexError on its freshest sample) and sample times at +-1.7e308 (an
    OverflowError in the table, an Infinity age in --json) are malformed answers: a fault state, one line."""
    from gpumem_gui.hardware.prometheus_http import PrometheusFault, parse_result

    with pytest.raises(PrometheusFault, match=words) as e:
        parse_result(result)
    assert "\n" not in str(e.value)
