"""Talking to Prometheus's HTTP API (``/api/v1/query``): requests with bounded retries, and strict reading of
the answers.

Every way a request can fail becomes a :class:`PrometheusFault` whose ``reason`` is a sentence a person can
act on (unreachable, 401/403, TLS, timeout, not a Prometheus, an answer too big, a rejected query); the
backend turns it into a snapshot state. The timeout bounds the whole query (connecting, the answer, retries):
requests' own timeout bounds each socket read, so a server sending a few bytes at a time would never time out;
a :class:`_Deadline` shuts the query's sockets down when its time is over. An answer is checked field by field
before anything reads it (:func:`parse_result`), so a malformed or hostile answer is a fault, never a
traceback.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpumem_gui.hardware.prometheus_config import (
    PASSWORD_ENV,
    TOKEN_ENV,
    USER_ENV,
    PrometheusConfig,
    credentials,
)

if TYPE_CHECKING:
    import requests

_CHUNK = 1 << 16


class _Deadline:
    """The end of the query under way: :meth:`start` arms it, :meth:`stop` disarms it and says whether it
    struck. When it strikes, every socket of the session is shut down (a blocked read then ends at once)
    and no new one may connect until the next :meth:`start` (no retry outlives the deadline)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # the sockets of this session's connections, watched as objects: http.client drops a connection's
        # socket (conn.sock = None) while the answer that will close it is still read through it
        self._socks: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._ends_at = math.inf
        self._timer: threading.Timer | None = None
        self.struck = False

    def start(self, seconds: float) -> None:
        with self._lock:
            self.struck = False
            self._ends_at = time.monotonic() + seconds
            self._timer = threading.Timer(seconds, self._strike)
            self._timer.daemon = True
            self._timer.start()

    def stop(self) -> bool:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._ends_at = None, math.inf
            return self.struck

    def connect_timeout(self, timeout: float | None) -> float:
        """The connect timeout a new connection may use now: at most the time left (none left: it fails
        as a connect timeout does, which urllib3 turns into requests' Timeout)."""
        from urllib3.exceptions import ConnectTimeoutError

        left = self._ends_at - time.monotonic()
        if self.struck or left <= 0:
            raise ConnectTimeoutError(None, "the query's deadline is over")
        return left if timeout is None else min(timeout, left)

    def watch(self, sock: socket.socket | None) -> None:
        if sock is not None:
            with self._lock:
                self._socks.add(sock)

    def _strike(self) -> None:
        with self._lock:
            self.struck = True
            socks = list(self._socks)
        for sock in socks:
            # the plain socket's shutdown, also under TLS (the SSL object is left to its reader);
            # OSError: closed already (a closed socket's descriptor is -1, never another file's)
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _pool_classes(deadline: _Deadline) -> dict[str, type]:
    """urllib3 connection pools whose connections are bounded by ``deadline`` (urllib3's
    ``PoolManager.pool_classes_by_scheme`` and ``HTTPConnectionPool.ConnectionCls``)."""
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    class Conn(HTTPConnection):
        def connect(self) -> None:
            self.timeout = deadline.connect_timeout(self.timeout)
            super().connect()
            deadline.watch(self.sock)

    class TlsConn(HTTPSConnection):
        def connect(self) -> None:  # the TLS handshake is bounded per read only (it is a few kB)
            self.timeout = deadline.connect_timeout(self.timeout)
            super().connect()
            deadline.watch(self.sock)

    class Pool(HTTPConnectionPool):
        ConnectionCls = Conn

    class TlsPool(HTTPSConnectionPool):
        ConnectionCls = TlsConn

    return {"http": Pool, "https": TlsPool}


def _session(deadline: _Deadline) -> requests.Session:
    """A requests session that retries transient answers a bounded number of times, its connections
    bounded by ``deadline``. requests is imported here, not at module level: only reading a cluster needs it
    (the window's cold start does not)."""
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    # Transient answers worth one more try (Prometheus's API doc: 503 when the query timed out or was
    # aborted; 502/504 and 429 come from proxies in front of it). Retry-After is not honoured: it could
    # stall a poll.
    retry = Retry(
        total=2,
        connect=2,
        read=1,
        status=2,
        backoff_factor=0.2,
        status_forcelist=(429, 502, 503, 504),
        allowed_methods=frozenset({"POST"}),
        respect_retry_after_header=False,
        raise_on_status=False,
    )
    session = requests.Session()
    for scheme in ("http", "https"):
        adapter = HTTPAdapter(max_retries=retry)
        adapter.poolmanager.pool_classes_by_scheme = _pool_classes(deadline)
        session.mount(f"{scheme}://", adapter)
    return session


class PrometheusFault(Exception):
    """A request that did not give a usable answer; ``reason`` says why in words."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class Series:
    """One series of an answer: its labels and its samples as (unix seconds, value)."""

    labels: dict[str, str]
    samples: tuple[tuple[float, float], ...]


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class PrometheusHttp:
    """One session to one Prometheus server; :meth:`query` runs an instant query."""

    def __init__(self, cfg: PrometheusConfig) -> None:
        self.cfg = cfg
        token, basic = credentials(cfg)
        self._deadline = _Deadline()
        self.session = _session(self._deadline)
        self.session.headers["User-Agent"] = "gpumem"
        self.session.trust_env = False  # no proxy or netrc credentials from the environment by surprise
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        if basic:
            self.session.auth = basic
        self.session.verify = str(cfg.ca_file) if cfg.ca_file else True
        self.auth_hint = (
            "the bearer token was refused" if token else "the user or password was refused" if basic else None
        )

    def close(self) -> None:
        self.session.close()

    def query(self, promql: str) -> tuple[str, list[Series]]:
        """Run an instant query within the timeout; (resultType, series). Raises :class:`PrometheusFault`."""
        self._deadline.start(self.cfg.timeout_s)
        try:
            got: tuple[int, bytes] | PrometheusFault = self._post(promql)
        except PrometheusFault as fault:
            got = fault
        finally:
            struck = self._deadline.stop()
        if struck:  # whatever the cut sockets made of it: a fault, or an answer cut short that looks whole
            raise PrometheusFault(self._late())
        if isinstance(got, PrometheusFault):
            raise got
        return self._answer(*got)

    def _late(self) -> str:
        return f"Prometheus at {self.cfg.url} did not answer within {self.cfg.timeout_s:g} s"

    def _post(self, promql: str) -> tuple[int, bytes]:
        import requests

        url = f"{self.cfg.url}/api/v1/query"
        try:
            with self.session.post(
                url, data={"query": promql}, timeout=self.cfg.timeout_s, stream=True
            ) as resp:
                return resp.status_code, self._read(resp)
        except requests.exceptions.SSLError as e:
            raise PrometheusFault(
                f"TLS error talking to {self.cfg.url}: {_short(_root(e))}; give the CA that signed its "
                "certificate with --prometheus-ca FILE"
            ) from None
        except requests.exceptions.Timeout:
            raise PrometheusFault(self._late()) from None
        except requests.exceptions.RequestException as e:
            raise PrometheusFault(
                f"Prometheus at {self.cfg.url} is unreachable: {_short(_root(e))}"
            ) from None

    def _read(self, resp: requests.Response) -> bytes:
        cap = self.cfg.max_response_bytes
        chunks: list[bytes] = []
        size = 0
        for chunk in resp.iter_content(_CHUNK):
            size += len(chunk)
            if size > cap:
                raise PrometheusFault(
                    f"the answer from {self.cfg.url} is over the limit of {cap:,} bytes; narrow it with a "
                    "selector (--selector '{cluster=\"a\"}')"
                )
            chunks.append(chunk)
        return b"".join(chunks)

    def _answer(self, status: int, body: bytes) -> tuple[str, list[Series]]:
        if status == 401:
            hint = self.auth_hint or (
                f"set {TOKEN_ENV}, or {USER_ENV} and {PASSWORD_ENV}, or a credentials file"
            )
            raise PrometheusFault(f"Prometheus at {self.cfg.url} needs credentials (HTTP 401): {hint}")
        if status == 403:
            raise PrometheusFault(
                f"Prometheus at {self.cfg.url} refused access (HTTP 403): these credentials may not read it"
            )
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):
            raise PrometheusFault(
                f"{self.cfg.url} did not answer as a Prometheus server (HTTP {status}, not JSON); is it the "
                "server's base URL?"
            ) from None
        if not isinstance(payload, dict):
            raise PrometheusFault(f"{self.cfg.url} answered HTTP {status} with JSON that is not an object")
        if payload.get("status") != "success":
            err = payload.get("error")
            detail = _short(err) if isinstance(err, str) else f"HTTP {status}"
            raise PrometheusFault(f"Prometheus at {self.cfg.url} rejected the query: {detail}")
        return parse_result(payload.get("data"))


def _root(e: BaseException) -> str:
    """The innermost cause's message (requests wraps urllib3 wraps the socket error)."""
    seen = e
    while seen.__cause__ is not None or seen.__context__ is not None:
        nxt = seen.__cause__ or seen.__context__
        assert nxt is not None
        seen = nxt
    text = str(seen) or type(seen).__name__
    return text.split("] ")[-1] if text.startswith("[") else text


# the latest Unix time a sample may carry (seconds; the year 5138): Prometheus writes its own clock's time
_LATEST_SAMPLE_TIME = 1e11


def _sample(v: Any, where: str) -> tuple[float, float]:
    """One ``[<unix time>, "<value>"]`` pair of the API."""
    if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], int | float) and isinstance(v[1], str)):
        raise PrometheusFault(f'malformed answer: {where}: a sample must be [time, "value"]')
    try:
        value = float(v[1])
    except ValueError:
        bad = _short(v[1], 40)
        raise PrometheusFault(f"malformed answer: {where}: value {bad!r} is not a number") from None
    t = float(v[0])
    if not math.isfinite(t) or not 0 <= t <= _LATEST_SAMPLE_TIME:  # ages and dates of such times overflow
        raise PrometheusFault(f"malformed answer: {where}: the sample time {v[0]!r} is not a Unix time")
    return t, value


def parse_result(data: Any) -> tuple[str, list[Series]]:
    """The ``data`` of an API answer, checked: ``resultType`` vector or matrix, each series a string-to-string
    ``metric`` with ``value`` (vector) or ``values`` (matrix). Raises :class:`PrometheusFault`."""
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise PrometheusFault("malformed answer: data.result is missing")
    kind = data.get("resultType")
    if kind not in ("vector", "matrix"):
        bad = _short(str(kind), 40)
        raise PrometheusFault(f"malformed answer: resultType {bad!r} is not vector or matrix")
    out: list[Series] = []
    for i, item in enumerate(data["result"]):
        where = f"data.result[{i}]"
        metric = item.get("metric") if isinstance(item, dict) else None
        if not isinstance(metric, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metric.items()
        ):
            raise PrometheusFault(f"malformed answer: {where}.metric must map label names to strings")
        if kind == "vector":
            samples: tuple[tuple[float, float], ...] = (_sample(item.get("value"), f"{where}.value"),)
        else:
            values = item.get("values")
            if not isinstance(values, list):
                raise PrometheusFault(f"malformed answer: {where}.values must be a list")
            if not values:  # the freshest sample is read from every series
                raise PrometheusFault(f"malformed answer: {where}.values holds no sample")
            samples = tuple(_sample(v, f"{where}.values[{j}]") for j, v in enumerate(values))
        out.append(Series(labels=metric, samples=samples))
    return kind, out
