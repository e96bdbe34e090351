"""Fuzz: what a Prometheus server answers, read by the cluster backend end to end.

A loopback HTTP server stands where Prometheus would and answers every query of one poll
(``gpumem_gui/hardware/prometheus.py``: five ``last_over_time`` families, ``timestamp``, the age query) with
a generated document: dcgm-exporter's recorded series (``tests/data/dcgm/``) with labels, values and
sample times mutated to extremes (index labels like ``²``, ``NaN`` / ``+Inf`` / negative MiB, times at
±1.7e308, empty matrices), whole bodies replaced by other JSON or by bytes, and error statuses. The property,
for every answer: :meth:`PrometheusBackend.snapshot` never raises; a fault is one line in
``unavailable_reason``; the snapshot's table text, its ``--json`` document (strict JSON: no ``Infinity`` /
``NaN``) and the cluster view's GPUs are built without an exception. A real Prometheus cannot send
malformed answers, so this server is the fake one; ``tests/test_prometheus_backend.py`` runs the real one.

``make test`` runs a few dozen polls; ``make fuzz`` (``GPUMEM_FUZZ=long``) 40 times as many.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gpumem_gui.hardware.cluster import cluster_gpus
from gpumem_gui.hardware.prometheus import FAMILIES, PrometheusBackend
from gpumem_gui.hardware.prometheus_config import make_prometheus_config
from gpumem_gui.hardware.prometheus_http import PrometheusFault, parse_result
from gpumem_gui.hardware.report import format_snapshot, snapshot_to_json
from tests.fuzz_strategies import fuzz_settings
from tests.prom_exposition import parse_exposition, recorded

# the recorded series of one host: (family, labels, value)
BASE = [s for s in parse_exposition(recorded("node-a")) if s[0] in FAMILIES.values()]
NOW = 1_765_000_000.0
TIMES = [NOW, NOW - 30, 0.0, -1.0, 1.7e308, -1.7e308, 1e20, 2**53, NOW + 1e9]
VALUES = ["80328", "0", "-1", "NaN", "+Inf", "-Inf", "1e308", "9" * 400, "x", "", "0x10", "١٢"]
LABEL_VALUES = ["0", "7", "²", "٣", "1²", "-1", "1234567", "", "x" * 300, "node-a", "GPU-" + "f" * 36]


@st.composite
def _series(draw: st.DrawFn, family: str, matrix: bool) -> dict[str, Any]:
    """One series of ``family``: a recorded one with its labels and its value mutated now and then."""
    _, labels, value = draw(st.sampled_from([s for s in BASE if s[0] == family] or BASE))
    labels = dict(labels)
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from([*labels, "gpu", "GPU_I_ID", "Hostname", "UUID", "namespace"]))
        labels[key] = draw(st.sampled_from(LABEL_VALUES) | st.text(max_size=6))
    t = draw(st.sampled_from(TIMES) | st.floats(allow_nan=False, allow_infinity=False))
    v = draw(
        st.sampled_from([repr(value), *VALUES]) if draw(st.integers(0, 3)) == 0 else st.just(repr(value))
    )
    if matrix:
        n = draw(st.integers(0, 3))
        return {"metric": labels, "values": [[t + i, v] for i in range(n)]}
    return {"metric": labels, "value": [t, v]}


@st.composite
def _answer(draw: st.DrawFn, family: str) -> tuple[int, bytes]:
    """(status, body) for one query: a success document, an error document, other JSON, or bytes."""
    pick = draw(st.integers(0, 9))
    if pick <= 5:
        matrix = draw(st.integers(0, 5)) == 0
        result = draw(st.lists(_series(family, matrix), max_size=6))
        doc: Any = {
            "status": "success",
            "data": {"resultType": "matrix" if matrix else "vector", "result": result},
        }
        return 200, json.dumps(doc).encode()
    if pick == 6:
        err = {"status": "error", "errorType": "bad_data", "error": draw(st.text(max_size=400))}
        return draw(st.sampled_from([400, 422, 401, 403, 200])), json.dumps(err).encode()
    if pick == 7:
        other = draw(
            st.recursive(st.none() | st.integers() | st.text(max_size=6), lambda x: st.lists(x, max_size=3))
        )
        return 200, json.dumps({"status": "success", "data": other}).encode()
    if pick == 8:
        return 200, draw(st.binary(max_size=200))
    return 200, b'{"status": "success", "data": {"resultType": "vector", "result": [' + b"[" * 3000 + b"]}}"


class _Answers:
    """What the server says to each query of the poll being run (set per example)."""

    def __init__(self) -> None:
        self.by_family: dict[str, tuple[int, bytes]] = {}
        self.live: tuple[int, bytes] = (200, b"")

    def __call__(self, query: str) -> tuple[int, bytes]:
        if query.startswith("timestamp("):
            return self.live
        for family in FAMILIES.values():
            if family in query:
                return self.by_family.get(
                    family, (200, b'{"status":"success","data":{"resultType":"vector","result":[]}}')
                )
        return 400, b'{"status":"error","errorType":"bad_data","error":"unknown query"}'


ANSWERS = _Answers()


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        query = parse_qs(self.rfile.read(size).decode("utf-8", "replace")).get("query", [""])[0]
        status, body = ANSWERS(query)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """Quiet: a long fuzz run sends tens of thousands of requests."""


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@st.composite
def polls(draw: st.DrawFn) -> tuple[dict[str, tuple[int, bytes]], tuple[int, bytes]]:
    by_family = {f: draw(_answer(f)) for f in FAMILIES.values()}
    live = draw(_answer(FAMILIES["free"]))
    return by_family, live


def _recorded_poll() -> tuple[dict[str, tuple[int, bytes]], tuple[int, bytes]]:
    """The recorded host as a healthy answer: every family's series at NOW (the example that must read)."""
    by_family = {}
    for family in FAMILIES.values():
        result = [{"metric": lab, "value": [NOW, repr(v)]} for f, lab, v in BASE if f == family]
        doc = {"status": "success", "data": {"resultType": "vector", "result": result}}
        by_family[family] = (200, json.dumps(doc).encode())
    return by_family, by_family[FAMILIES["free"]]


@fuzz_settings(60)
@given(poll=polls())
@example(poll=_recorded_poll())
def test_any_prometheus_answer_is_a_snapshot_or_a_fault_state(
    server_url: str, poll: tuple[dict[str, tuple[int, bytes]], tuple[int, bytes]]
) -> None:
    ANSWERS.by_family, ANSWERS.live = poll
    backend = PrometheusBackend(make_prometheus_config(url=server_url, timeout_s=5))
    try:
        snap = backend.snapshot()
    finally:
        backend.close()
    if snap.unavailable_reason is not None:
        assert "\n" not in snap.unavailable_reason and len(snap.unavailable_reason) < 600
    json.dumps(snapshot_to_json(snap), allow_nan=False)  # strict JSON: --json never prints Infinity / NaN
    format_snapshot(snap)
    cluster_gpus(snap)


def test_the_recorded_answer_reads_as_gpus(server_url: str) -> None:
    """The healthy example above is not a fault: the property test exercises the reading path too."""
    ANSWERS.by_family, ANSWERS.live = _recorded_poll()
    backend = PrometheusBackend(make_prometheus_config(url=server_url, timeout_s=5))
    try:
        snap = backend.snapshot()
    finally:
        backend.close()
    assert snap.unavailable_reason is None and len(snap.devices) >= 1


# ---- the parser alone, at more examples ------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_answers = st.fixed_dictionaries(
    {
        "resultType": st.sampled_from(["vector", "matrix", "scalar", "string"]) | st.text(max_size=5),
        "result": st.lists(
            st.fixed_dictionaries({"metric": _json, "value": _json, "values": _json}) | _json, max_size=4
        ),
    }
)


@fuzz_settings(300)
@given(_answers | _json)
def test_any_answer_document_is_read_or_refused_as_a_fault(data: object) -> None:
    try:
        _kind, series = parse_result(json.loads(json.dumps(data, allow_nan=True)))
    except PrometheusFault as e:
        assert "\n" not in e.reason and len(e.reason) < 300
        return
    for s in series:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in s.labels.items())
        assert all(isinstance(t, float) and isinstance(v, float) for t, v in s.samples)
