"""A Prometheus answer sent a few bytes at a time ends at ``--prometheus-timeout`` for the whole query, as a
state in the panel and one line on the CLI (issue 33 item 10: the timeout used to apply per socket read, so a
server dripping bytes kept a poll, or ``gpumem gpus``, waiting for ever)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from gpumem_gui.hardware import PrometheusBackend, make_prometheus_config
from gpumem_gui.hardware.prometheus_http import PrometheusFault, PrometheusHttp

ANSWER = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
DRIP_S = 0.05  # one byte this often: every socket read answers well within any timeout


class DripServer:
    """Loopback HTTP server answering every request slowly: ``phase`` "body" sends the status line and
    headers at once and the body a byte at a time; "headers" drips the headers too; "none" answers at once."""

    def __init__(self, phase: str) -> None:
        self.phase = phase
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._answer, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:  # the request's head; its small form body follows in one go
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            self.requests += 1
            body = ANSWER if self.phase == "none" else ANSWER + b" " * 100_000
            head = (
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + "".join(f"X-Pad-{i}: {'p' * 60}\r\n" for i in range(50 if self.phase == "headers" else 0))
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            try:
                if self.phase == "headers":
                    self._drip(conn, head + body)
                elif self.phase == "body":
                    conn.sendall(head)
                    self._drip(conn, body)
                else:
                    conn.sendall(head + body)
            except OSError:  # the client went away: what a deadline does
                return

    def _drip(self, conn: socket.socket, data: bytes) -> None:
        for i in range(len(data)):
            if self._stop.is_set():
                return
            conn.sendall(data[i : i + 1])
            time.sleep(DRIP_S)

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        for t in self._threads:
            t.join(5)


@pytest.fixture(params=["body", "headers"])
def drip(request: pytest.FixtureRequest) -> Iterator[DripServer]:
    server = DripServer(request.param)
    yield server
    server.close()


def _query_in_thread(http: PrometheusHttp, wait_s: float) -> BaseException | None:
    """What ``http.query("up")`` raised, in a thread given ``wait_s`` (a hang fails, not stalls, the test)."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            http.query("up")
            raised.append(None)
        except BaseException as e:
            raised.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(wait_s)
    assert not t.is_alive(), f"the query still runs after {wait_s} s"
    return raised[0]


def test_a_dripping_answer_ends_at_the_timeout(drip: DripServer) -> None:
    http = PrometheusHttp(make_prometheus_config(url=drip.url, timeout_s=1))
    t0 = time.monotonic()
    fault = _query_in_thread(http, 15)
    took = time.monotonic() - t0
    http.close()
    assert isinstance(fault, PrometheusFault) and "did not answer within 1 s" in fault.reason
    # the whole answer would take 100 kB x 50 ms; the deadline holds, and is not retried past
    assert took < 4 and drip.requests == 1


def test_after_a_deadline_the_next_query_still_runs() -> None:
    slow, quick = DripServer("body"), DripServer("none")
    try:
        http = PrometheusHttp(make_prometheus_config(url=slow.url, timeout_s=1))
        with pytest.raises(PrometheusFault):
            http.query("up")
        http.cfg = make_prometheus_config(url=quick.url, timeout_s=1)
        assert http.query("up") == ("vector", [])
        http.close()
    finally:
        slow.close()
        quick.close()


def test_a_dripping_server_is_a_state_of_the_panel(drip: DripServer) -> None:
    backend = PrometheusBackend(make_prometheus_config(url=drip.url, timeout_s=1))
    snap = backend.snapshot()
    backend.close()
    assert not snap.available and "did not answer within 1 s" in (snap.unavailable_reason or "")


def test_a_dripping_server_is_one_line_on_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from gpumem_gui.cli import main

    server = DripServer("body")
    try:
        flags = ["--prometheus", server.url, "--prometheus-timeout", "1"]
        fit = main(["fit", "meta-llama/Llama-3.1-8B", *flags])
        fit_out = capsys.readouterr()
        # `gpus` shows a cluster it cannot read as it shows an unreachable one: one line, exit 1
        gpus = main(["gpus", *flags])
        gpus_out = capsys.readouterr()
    finally:
        server.close()
    assert fit == 2 and fit_out.out == "" and fit_out.err.count("\n") == 1
    assert "did not answer within 1 s" in fit_out.err
    assert gpus == 1 and gpus_out.out.count("\n") == 1 and "did not answer within 1 s" in gpus_out.out
