"""The cluster backend's inputs without a server: its config (URL, selector, credentials) and the strict
reading of Prometheus answers, by hand-picked cases and by fuzzing. The backend against a real Prometheus
server is tests/test_prometheus_backend.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumem_gui.core import GpumemInputError
from gpumem_gui.hardware.prometheus_config import (
    PASSWORD_ENV,
    TOKEN_ENV,
    USER_ENV,
    credentials,
    make_prometheus_config,
    selector_matchers,
)
from gpumem_gui.hardware.prometheus_http import PrometheusFault, parse_result


@pytest.mark.parametrize(
    ("text", "matchers"),
    [
        ("", ""),
        ('{cluster="a"}', 'cluster="a"'),
        ('cluster="a"', 'cluster="a"'),
        (' { cluster = "a" , Hostname=~"node-.*", gpu!="3" } ', 'cluster="a",Hostname=~"node-.*",gpu!="3"'),
        (r'{pod!~"x\"y"}', r'pod!~"x\"y"'),
    ],
)
def test_selectors_are_normalised_label_matchers(text: str, matchers: str) -> None:
    assert selector_matchers(text) == matchers


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{cluster="a"', "must close"),
        ("{cluster=a}", "character 1"),
        ('{cluster="a" node="b"}', "character 13"),
        ('{1x="a"}', "character 1"),
        ('up{cluster="a"}', "character 1"),
        ('{a="b"} or vector(1)', "must close"),
    ],
)
def test_a_malformed_selector_names_the_position(text: str, where: str) -> None:
    with pytest.raises(GpumemInputError, match="selector") as e:
        make_prometheus_config(url="http://p:9090", selector=text)
    assert where in str(e.value)
    assert "\n" not in str(e.value) and "Value error" not in str(e.value)


@given(st.text(max_size=200))
@settings(max_examples=400, deadline=None)
def test_any_selector_text_is_accepted_normalised_or_refused_in_one_line(text: str) -> None:
    try:
        cfg = make_prometheus_config(url="http://p:9090", selector=text)
    except GpumemInputError as e:
        assert "\n" not in str(e)
        return
    # what was accepted splices into a metric selector as matchers only, and is stable
    assert selector_matchers(cfg.selector) == cfg.selector
    assert "{" not in cfg.selector.replace('\\"', "").split('"')[0]


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("prometheus:9090", "http:// or https://"),
        ("ftp://p:9090", "http:// or https://"),
        ("http://p:99999", "invalid port"),
        ("http://p:9090/?x=1", "base URL"),
        ("http://", "http:// or https://"),
    ],
)
def test_a_bad_url_is_one_line(url: str, problem: str) -> None:
    with pytest.raises(GpumemInputError, match="url") as e:
        make_prometheus_config(url=url)
    assert problem in str(e.value)


def test_a_password_in_the_url_is_refused_without_echoing_it() -> None:
    with pytest.raises(GpumemInputError) as e:
        make_prometheus_config(url="https://alice:s3cret@prom.example:9090")
    assert "s3cret" not in str(e.value) and USER_ENV in str(e.value)


def test_the_url_keeps_a_path_prefix_without_its_trailing_slash() -> None:
    assert (
        make_prometheus_config(url=" https://gw.example/prometheus/ ").url == "https://gw.example/prometheus"
    )


def test_credentials_from_environment_or_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (TOKEN_ENV, USER_ENV, PASSWORD_ENV):
        monkeypatch.delenv(var, raising=False)
    cfg = make_prometheus_config(url="http://p:9090")
    assert credentials(cfg) == (None, None)
    monkeypatch.setenv(TOKEN_ENV, "tok")
    assert credentials(cfg) == ("tok", None)
    monkeypatch.delenv(TOKEN_ENV)
    monkeypatch.setenv(USER_ENV, "alice")
    monkeypatch.setenv(PASSWORD_ENV, "pw:with:colons")
    assert credentials(cfg) == (None, ("alice", "pw:with:colons"))
    token = tmp_path / "token"
    token.write_text("file-token\n")
    with pytest.raises(GpumemInputError, match="not both"):
        credentials(make_prometheus_config(url="http://p:9090", token_file=token))
    monkeypatch.delenv(USER_ENV)
    assert credentials(make_prometheus_config(url="http://p:9090", token_file=token)) == ("file-token", None)
    basic = tmp_path / "basic"
    basic.write_text("bob:pw\n")
    assert credentials(make_prometheus_config(url="http://p:9090", basic_auth_file=basic)) == (
        None,
        ("bob", "pw"),
    )


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("", "one non-empty line"),
        ("a\nb", "one non-empty line"),
        (b"\xff\xfe", "UTF-8"),
        ("nocolon", "user:password"),
    ],
)
def test_a_bad_credential_file_is_one_line(tmp_path: Path, content: str | bytes, problem: str) -> None:
    f = tmp_path / "basic"
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(GpumemInputError, match=problem):
        credentials(make_prometheus_config(url="http://p:9090", basic_auth_file=f))


def test_a_credential_path_that_is_a_folder_or_missing_is_one_line(tmp_path: Path) -> None:
    for path in (tmp_path, tmp_path / "missing"):
        with pytest.raises(GpumemInputError, match="not a regular file"):
            credentials(make_prometheus_config(url="http://p:9090", token_file=path))
    with pytest.raises(GpumemInputError, match="not a regular file"):
        credentials(make_prometheus_config(url="http://p:9090", ca_file=tmp_path / "ca.pem"))


# ---- answers -------------------------------------------------------------------------------------------


def test_a_vector_and_a_matrix_are_read() -> None:
    kind, series = parse_result(
        {"resultType": "vector", "result": [{"metric": {"gpu": "0"}, "value": [1.5, "80328"]}]}
    )
    assert kind == "vector" and series[0].labels == {"gpu": "0"} and series[0].samples == ((1.5, 80328.0),)
    kind, series = parse_result(
        {"resultType": "matrix", "result": [{"metric": {}, "values": [[1, "1"], [2, "NaN"], [3, "+Inf"]]}]}
    )
    assert kind == "matrix" and [t for t, _ in series[0].samples] == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (None, "data.result"),
        ({"resultType": "scalar", "result": [1, "2"]}, "resultType"),
        ({"resultType": "vector", "result": [{"metric": {"a": 1}, "value": [1, "2"]}]}, "metric"),
        ({"resultType": "vector", "result": [{"metric": {}, "value": [1, 2]}]}, "data.result[0].value"),
        ({"resultType": "vector", "result": [{"metric": {}, "value": [1, "x"]}]}, "not a number"),
        ({"resultType": "vector", "result": [{"metric": {}, "value": ["1", "2"]}]}, "[time"),
        ({"resultType": "matrix", "result": [{"metric": {}, "values": {}}]}, "values must be a list"),
        ({"resultType": "vector", "result": ["x"]}, "metric"),
    ],
)
def test_a_malformed_answer_is_a_fault_naming_where(data: object, where: str) -> None:
    with pytest.raises(PrometheusFault) as e:
        parse_result(data)
    assert where in e.value.reason and "\n" not in e.value.reason


# the property over any answer document: tests/test_fuzz_prometheus.py (make fuzz runs it at length)
