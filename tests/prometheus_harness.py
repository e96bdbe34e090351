"""A real Prometheus for the cluster tests and benchmarks: the Debian package's ``prometheus`` binary on
loopback, scraping an ExpositionServer that serves recorded dcgm-exporter expositions (tests/data/dcgm/).

    with ExpositionServer(recorded_cluster()) as exporters, PrometheusServer(exporters) as prom:
        prom.wait_scraped()
        prom.vector('DCGM_FI_DEV_FB_FREE{Hostname="node-a"}')

Everything listens on 127.0.0.1 only, every wait is bounded, and ``stop()`` / the context managers end the
Prometheus process (terminate, 10 s, kill). Pytest fixtures over this are in tests/prom_fixtures.py.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

from tests.prom_exposition import (
    DCGM_DIR,
    RECORDED_HOSTS,
    DenyingProxy,
    ExpositionServer,
    parse_exposition,
    recorded,
    recorded_cluster,
    render_exposition,
    synthetic_cluster,
)
from tests.prom_web import BASIC_AUTH, TEST_PASSWORD, TEST_USER, TlsFiles, make_tls_files, write_web_config

__all__ = [
    "BASIC_AUTH",
    "DCGM_DIR",
    "RECORDED_HOSTS",
    "TEST_PASSWORD",
    "TEST_USER",
    "DenyingProxy",
    "ExpositionServer",
    "PrometheusServer",
    "TlsFiles",
    "ensure_prometheus",
    "free_port",
    "parse_exposition",
    "recorded",
    "recorded_cluster",
    "render_exposition",
    "synthetic_cluster",
    "wait_until",
]

APT_TIMEOUT_S = 600  # the brief's bound on installing the package
READY_TIMEOUT_S = 30.0  # Prometheus 2.42 with an empty TSDB is ready in about a second here
STOP_TIMEOUT_S = 10.0
# what the test Prometheus scrapes with: every second, so a changed exposition shows within ~2 s
SCRAPE_INTERVAL, SCRAPE_TIMEOUT, EVALUATION_INTERVAL = "1s", "900ms", "1s"
INSTALL_HINT = (
    "install it with `make prometheus` (or `sudo apt-get install -y prometheus`, Debian package 2.42)"
)


def ensure_prometheus() -> str:
    """The path of the ``prometheus`` binary; installs the Debian package when it is missing and we are root
    (``apt-get install -y prometheus``, after ``apt-get update`` if the first try fails; 600 s in all)."""
    found = shutil.which("prometheus")
    if found:
        return found
    if not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get")):
        raise RuntimeError(
            f"the cluster tests need the real Prometheus binary, which is not on PATH: {INSTALL_HINT}"
        )
    deadline = time.monotonic() + APT_TIMEOUT_S
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    tail = ""
    for command in (["apt-get", "install", "-y", "prometheus"], ["apt-get", "update"]) * 2:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=left, check=False)
        except subprocess.TimeoutExpired:
            break
        tail = (done.stdout + done.stderr)[-400:]
        if command[1] == "install" and done.returncode == 0:
            break
    found = shutil.which("prometheus")
    if not found:
        raise RuntimeError(
            f"`apt-get install -y prometheus` did not give a prometheus binary: {tail.strip()}"
        )
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.2, what: str = ""):
    """Poll ``predicate`` until it returns something truthy (returned), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"not within {timeout:g} s: {what or getattr(predicate, '__name__', predicate)}"
            )
        time.sleep(interval)


def scrape_config(port: int, hosts: Iterable[str]) -> str:
    """prometheus.yml: one job ``dcgm``, one target per host, each at 127.0.0.1:<port> with its own
    ``__metrics_path__`` and ``instance`` target labels; honor_labels like the GPU operator's
    ServiceMonitor. Prometheus 2.42 honours __metrics_path__ set as a static target label (the harness
    test checks each target's scrapeUrl)."""
    lines = [
        "global:",
        f"  scrape_interval: {SCRAPE_INTERVAL}",
        f"  scrape_timeout: {SCRAPE_TIMEOUT}",
        f"  evaluation_interval: {EVALUATION_INTERVAL}",
        "scrape_configs:",
        "  - job_name: dcgm",
        "    honor_labels: true",
        "    static_configs:",
    ]
    for host in hosts:
        path = json.dumps(f"/hosts/{host}/metrics")
        lines += [
            f"      - targets: ['127.0.0.1:{port}']",
            f"        labels: {{instance: {json.dumps(host)}, __metrics_path__: {path}}}",
        ]
    if lines[-1].endswith("static_configs:"):
        lines[-1] = "    static_configs: []"
    return "\n".join(lines) + "\n"


class PrometheusServer:
    """The real Prometheus, started at construction and ready (``/-/ready``) when the constructor returns.

    ``exposition``: the ExpositionServer (or its port) every target points at; ``hosts``: the targets
    (default: the server's hosts now). ``basic_auth=(user, password)`` and/or ``tls=True`` put the API
    behind a --web.config.file; ``url`` is then https and ``ca_file`` the CA to trust. Files, TSDB and the
    log (``log_path``) live in a temp dir that ``stop()`` removes.
    """

    def __init__(
        self,
        exposition: ExpositionServer | int,
        hosts: Iterable[str] | None = None,
        *,
        basic_auth: tuple[str, str] | None = None,
        tls: bool = False,
        binary: str | None = None,
        ready_timeout: float = READY_TIMEOUT_S,
    ) -> None:
        self._exposition_port = exposition if isinstance(exposition, int) else exposition.port
        if hosts is None:
            hosts = [] if isinstance(exposition, int) else exposition.hosts()
        self.hosts = tuple(hosts)
        self.basic_auth = basic_auth
        self._tmp = tempfile.TemporaryDirectory(prefix="gpumem-prometheus-")
        self.dir = Path(self._tmp.name)
        self.config_path = self.dir / "prometheus.yml"
        self.log_path = self.dir / "prometheus.log"
        self.tls: TlsFiles | None = None
        self._web_config: Path | None = None
        self._ssl: ssl.SSLContext | None = None
        self._proc: subprocess.Popen | None = None
        self.port = 0
        try:
            self.config_path.write_text(scrape_config(self._exposition_port, self.hosts))
            if tls:
                self.tls = make_tls_files(self.dir)
                self._ssl = ssl.create_default_context(cafile=str(self.tls.ca_file))
            if basic_auth is not None or tls:
                self._web_config = write_web_config(self.dir / "web.yml", basic_auth, self.tls)
            self._start(binary or ensure_prometheus(), ready_timeout)
        except BaseException:
            self.stop()
            raise

    # ---- life cycle -------------------------------------------------------------------------------------

    def _start(self, binary: str, ready_timeout: float) -> None:
        for _attempt in range(3):  # a port picked free can be taken before Prometheus binds it
            self.port = free_port()
            command = [
                binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ]
            if self._web_config is not None:
                command.append(f"--web.config.file={self._web_config}")
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
            if self._wait_ready(ready_timeout):
                return
            if "address already in use" not in self.log_tail():
                break
        code = self._proc.returncode if self._proc is not None else "killed after the timeout"
        raise RuntimeError(
            f"Prometheus did not become ready (exit status {code}); its log:\n{self.log_tail()}"
        )

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            with contextlib.suppress(OSError):  # not listening yet
                if self.request("/-/ready", timeout=1.0)[0] == 200:
                    return True
            time.sleep(0.1)
        self._terminate()
        return False

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.wait()

    def stop(self) -> None:
        """Terminate Prometheus (kill after 10 s) and remove its temp dir; safe to call twice."""
        self._terminate()
        self._tmp.cleanup()

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # ---- HTTP -------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path | None:
        return self.tls.ca_file if self.tls else None

    def auth_header(self) -> dict[str, str]:
        if self.basic_auth is None:
            return {}
        token = base64.b64encode(f"{self.basic_auth[0]}:{self.basic_auth[1]}".encode()).decode()
        return {"Authorization": f"Basic {token}"}

    def request(self, path: str, *, auth: bool = True, timeout: float = 5.0) -> tuple[int, bytes]:
        """GET ``path`` (with the basic-auth header when configured and ``auth``): (status, body), for
        error statuses too; a refused connection or a TLS failure raises (URLError / OSError)."""
        headers = self.auth_header() if auth else {}
        req = urllib.request.Request(self.url + path, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self._ssl) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            with error:
                return error.code, error.read()

    def query(self, promql: str) -> dict:
        """The ``data`` of an instant query (``{"resultType": ..., "result": [...]}``); raises on an error."""
        status, body = self.request("/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        answer = json.loads(body) if body.startswith(b"{") else {}
        if status != 200 or answer.get("status") != "success":
            raise RuntimeError(f"query {promql!r}: HTTP {status}: {body[:300]!r}")
        return answer["data"]

    def vector(self, promql: str) -> list[dict]:
        """The result list of an instant query: ``[{"metric": {...}, "value": [ts, "v"]}, ...]``."""
        return self.query(promql)["result"]

    def wait_until(self, predicate: Callable[[], object], timeout: float = 30.0, what: str = ""):
        try:
            return wait_until(predicate, timeout, what=what)
        except TimeoutError as error:
            raise TimeoutError(f"{error}\nPrometheus log:\n{self.log_tail(15)}") from None

    def up_hosts(self) -> set[str]:
        """The instances whose last scrape succeeded (``up == 1``)."""
        return {s["metric"].get("instance", "") for s in self.vector("up == 1")}

    def wait_scraped(self, hosts: Iterable[str] | None = None, timeout: float = 30.0) -> None:
        """Wait until every one of ``hosts`` (default: all targets) has been scraped successfully."""
        wanted = set(self.hosts if hosts is None else hosts)
        self.wait_until(lambda: wanted <= self.up_hosts(), timeout, what=f"up == 1 for {sorted(wanted)}")

    def reload(self, hosts: Iterable[str], timeout: float = 30.0) -> None:
        """Scrape ``hosts`` from now on: rewrite prometheus.yml, SIGHUP, and wait until the targets API lists
        exactly them (Prometheus' discovery passes new targets on every 5 s, so this takes ~5 s)."""
        self.hosts = tuple(hosts)
        self.config_path.write_text(scrape_config(self._exposition_port, self.hosts))
        if self._proc is None:
            raise RuntimeError("Prometheus is not running")
        self._proc.send_signal(signal.SIGHUP)

        def targets() -> bool:
            data = json.loads(self.request("/api/v1/targets?state=active")[1])["data"]
            return {t["labels"].get("instance") for t in data["activeTargets"]} == set(self.hosts)

        self.wait_until(targets, timeout, what=f"active targets == {sorted(self.hosts)}")
