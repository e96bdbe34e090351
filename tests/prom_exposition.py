"""The scrape side of the Prometheus harness: loopback HTTP servers that stand in for dcgm-exporter (and for
an auth proxy), the recorded expositions in tests/data/dcgm/, and a synthetic cluster built from them.

Import these through ``tests.prometheus_harness``; this module only keeps that one under the size limit.
"""

from __future__ import annotations

import json
import random
import re
import threading
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DCGM_DIR = Path(__file__).resolve().parent / "data" / "dcgm"
RECORDED_HOSTS = ("node-a", "node-b", "node-c", "node-d")
# text exposition format 0.0.4, the content type dcgm-exporter 3.x answers with
EXPOSITION_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_METRICS_PATH = re.compile(r"^/hosts/([A-Za-z0-9._-]+)/metrics$")
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\} (\S+)$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def recorded(name: str) -> str:
    """The text of tests/data/dcgm/<name>.prom, e.g. ``recorded("node-b-gpu3-gone")``."""
    return (DCGM_DIR / f"{name}.prom").read_text(encoding="utf-8")


def recorded_cluster() -> dict[str, str]:
    """Host -> exposition for the four recorded hosts (node-a ... node-d)."""
    return {host: recorded(host) for host in RECORDED_HOSTS}


def parse_exposition(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(family, labels, value) per sample line of a dcgm-exporter exposition (no timestamps, no escapes
    beyond what dcgm-exporter prints); enough to derive what a test expects from a recorded file."""
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            labels = dict(_LABEL.findall(match.group(2)))
            samples.append((match.group(1), labels, float(match.group(3))))
    return samples


def _help_lines(text: str) -> dict[str, str]:
    """Family -> its '# HELP' text, in the order the exposition lists them."""
    return {p[2]: p[3] for p in (ln.split(" ", 3) for ln in text.splitlines() if ln.startswith("# HELP "))}


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-answer (Prometheus at a scrape timeout or at shutdown) is not an error."""

    def handle_error(self, request: object, client_address: object) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class _LoopbackServer:
    """A ThreadingHTTPServer on 127.0.0.1 and a free port, served from a daemon thread; a context manager."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._httpd = _QuietServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._httpd.owner = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            daemon=True,
            name=type(self).__name__,
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """The request log stays out of test output."""

    def _answer(self, status: int, body: bytes = b"", content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)


class _ExpositionHandler(_QuietHandler):
    def do_GET(self) -> None:
        match = _METRICS_PATH.match(self.path.split("?", 1)[0])
        status, text = self.server.owner.lookup(match.group(1)) if match else (404, None)  # type: ignore[attr-defined]
        if text is not None:
            self._answer(200, text.encode(), EXPOSITION_CONTENT_TYPE)
        else:
            self._answer(status, b"404 page not found\n" if status == 404 else b"")


class ExpositionServer(_LoopbackServer):
    """dcgm-exporter for many hosts on one loopback port: ``GET /hosts/<host>/metrics`` answers that host's
    exposition text. ``set_down(host, True)`` makes it answer 503 with no body: Prometheus fails the scrape
    at once (up=0, stale markers for every series of the target) on the next interval, deterministically,
    where a dropped connection would also fail it but with a connection-reset message, and a hung one only
    after scrape_timeout. A removed or unknown host, and any other path, is 404."""

    def __init__(self, hosts: dict[str, str] | None = None) -> None:
        self._lock = threading.Lock()
        self._texts: dict[str, str] = dict(hosts or {})
        self._down: set[str] = set()
        self._scrapes: Counter[str] = Counter()
        super().__init__(_ExpositionHandler)

    def metrics_path(self, host: str) -> str:
        return f"/hosts/{host}/metrics"

    def set_host(self, host: str, text: str) -> None:
        if not _METRICS_PATH.match(self.metrics_path(host)):
            raise ValueError(f"host name {host!r} does not fit in a URL path segment")
        with self._lock:
            self._texts[host] = text

    def remove_host(self, host: str) -> None:
        with self._lock:
            self._texts.pop(host, None)

    def set_down(self, host: str, down: bool) -> None:
        with self._lock:
            (self._down.add if down else self._down.discard)(host)

    def hosts(self) -> list[str]:
        with self._lock:
            return sorted(self._texts)

    def text(self, host: str) -> str | None:
        with self._lock:
            return self._texts.get(host)

    def is_down(self, host: str) -> bool:
        with self._lock:
            return host in self._down

    def scrapes(self, host: str) -> int:
        """How many requests this host's path has had (answered or not): wait on it to see a new scrape."""
        with self._lock:
            return self._scrapes[host]

    def lookup(self, host: str) -> tuple[int, str | None]:
        """What the handler serves: (200, text), (503, None) for a host set down, (404, None) for no host."""
        with self._lock:
            self._scrapes[host] += 1
            if host not in self._texts:
                return 404, None
            return (503, None) if host in self._down else (200, self._texts[host])


class _DenyingHandler(_QuietHandler):
    BODY = json.dumps({"status": "error", "error": "forbidden: not allowed by the auth proxy"}).encode()

    def _deny(self) -> None:
        self._answer(403, self.BODY, "application/json")

    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _deny


class DenyingProxy(_LoopbackServer):
    """An auth proxy in front of Prometheus that lets nothing through: every request is 403 with a short JSON
    body (``DenyingProxy.BODY``). ``url`` is where a client would find "Prometheus"."""

    BODY = _DenyingHandler.BODY

    def __init__(self) -> None:
        super().__init__(_DenyingHandler)


# ---- synthetic cluster for the scale benchmark ----------------------------------------------------------


def _templates() -> list[list[dict[str, str]]]:
    """Per recorded whole-GPU host (node-a: 8 x H100, node-b: 4 x A100-SXM4): its GPUs' label sets, each with
    the card's MiB total (free + used + reserved as recorded) and reserved MiB added as _total / _reserved."""
    templates = []
    for host in ("node-a", "node-b"):
        gpus: dict[str, dict[str, str]] = {}
        for family, labels, value in parse_exposition(recorded(host)):
            if family.startswith("DCGM_FI_DEV_FB_"):
                gpu = gpus.setdefault(labels["gpu"], {**labels, "_total": "0"})
                gpu["_total"] = str(int(gpu["_total"]) + int(value))
                if family == "DCGM_FI_DEV_FB_RESERVED":
                    gpu["_reserved"] = str(int(value))
        templates.append(list(gpus.values()))
    return templates


def _synthetic_values(rng: random.Random, total: int, reserved: int) -> dict[str, str]:
    """One GPU's readings: idle, partly used or busy, in dcgm-exporter's units (MiB, %, C, MHz, W)."""
    state = rng.random()
    room = total - reserved
    if state < 0.35:
        used, util = rng.randint(0, 600), rng.randint(0, 3)
    elif state < 0.6:
        used, util = rng.randint(room // 10, room // 2), rng.randint(10, 70)
    else:
        used, util = rng.randint(room * 85 // 100, room * 97 // 100), rng.randint(75, 100)
    return {
        "DCGM_FI_DEV_SM_CLOCK": str(1980 if util > 5 else 345),
        "DCGM_FI_DEV_GPU_TEMP": str(30 + util * 40 // 100 + rng.randint(0, 4)),
        "DCGM_FI_DEV_POWER_USAGE": f"{70 + util * 5.5 + rng.random() * 10:.6f}",
        "DCGM_FI_DEV_GPU_UTIL": str(util),
        "DCGM_FI_DEV_FB_FREE": str(room - used),
        "DCGM_FI_DEV_FB_USED": str(used),
        "DCGM_FI_DEV_FB_RESERVED": str(reserved),
    }


def _synthetic_host(host: str, template: list[dict[str, str]], gpus: int, rng: random.Random) -> list:
    entities = []
    for i in range(gpus):
        base = template[i % len(template)]
        pci = base["pci_bus_id"] if i < len(template) else f"00000000:{0x80 + i:02X}:00.0"
        labels = {
            "gpu": str(i),
            "UUID": f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}",
            "pci_bus_id": pci,
            "device": f"nvidia{i}",
            "modelName": base["modelName"],
            "Hostname": host,
            "DCGM_FI_DRIVER_VERSION": base["DCGM_FI_DRIVER_VERSION"],
        }
        entities.append((labels, _synthetic_values(rng, int(base["_total"]), int(base["_reserved"]))))
    return entities


def render_exposition(entities: list[tuple[dict[str, str], dict[str, str]]], helps: dict[str, str]) -> str:
    """dcgm-exporter's layout: per family its HELP and TYPE lines, then one sample per GPU (entity)."""
    lines = []
    for family, help_text in helps.items():
        lines += [f"# HELP {family} {help_text}", f"# TYPE {family} gauge"]
        for labels, values in entities:
            if family in values:
                label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
                lines.append(f"{family}{{{label_text}}} {values[family]}")
    return "\n".join(lines) + "\n"


def synthetic_cluster(hosts: int = 125, gpus_per_host: int = 8, seed: int = 0) -> dict[str, str]:
    """Host ("gpu-node-000", ...) -> exposition: the recorded families, label sets and cards (H100 80GB HBM3
    from node-a, A100-SXM4-80GB from node-b), fresh UUIDs and seeded idle / partly used / busy readings.
    The default is the scale benchmark's 1,000 GPUs on 125 hosts; the same seed gives the same text."""
    rng = random.Random(seed)
    templates = _templates()
    helps = _help_lines(recorded("node-a"))
    cluster = {}
    for h in range(hosts):
        host = f"gpu-node-{h:03d}"
        cluster[host] = render_exposition(
            _synthetic_host(host, rng.choice(templates), gpus_per_host, rng), helps
        )
    return cluster
