"""Pytest fixtures that run the real Prometheus over the recorded dcgm-exporter hosts (tests/data/dcgm/).

tests/conftest.py now loads this module as a plugin (``pytest_plugins``), so every test module sees the
fixtures. Without that, a module would import every fixture it uses *and* the ones those depend on (all
but ``denying_proxy`` depend on ``prometheus_binary``); importing them all at once keeps ruff quiet::

    from tests.prom_fixtures import *  # noqa: F403
    from tests.prom_fixtures import PrometheusCluster

Module-scoped fixtures start one Prometheus per test module (and per kind), already scraped when handed
out; ``fresh_cluster`` hands the module's cluster back in its recorded state before and after each test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

from tests.prometheus_harness import (
    BASIC_AUTH,
    RECORDED_HOSTS,
    DenyingProxy,
    ExpositionServer,
    PrometheusServer,
    ensure_prometheus,
    parse_exposition,
    recorded_cluster,
    wait_until,
)

__all__ = [
    "denying_proxy",
    "fresh_cluster",
    "prometheus_basic_auth",
    "prometheus_binary",
    "prometheus_cluster",
    "prometheus_tls",
]

T = TypeVar("T")


@dataclass
class PrometheusCluster:
    """A running Prometheus scraping ``exposition``, which serves ``recorded`` (host -> text) at start."""

    exposition: ExpositionServer
    prometheus: PrometheusServer
    recorded: dict[str, str] = field(default_factory=recorded_cluster)

    @property
    def url(self) -> str:
        return self.prometheus.url

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(sorted(self.recorded))

    def expected(self, host: str, family: str = "DCGM_FI_DEV_FB_FREE") -> list[tuple[dict[str, str], float]]:
        """(labels, value) of ``family`` in the host's recorded text, as the exporter printed them."""
        return [(labels, v) for f, labels, v in parse_exposition(self.recorded[host]) if f == family]

    def read_fresh(self, read: Callable[[], T], fresh: Callable[[T], bool], tries: int = 3) -> T:
        """``read()`` again (after every host is scraped once more) while ``fresh`` says no: on a loaded
        machine one scrape of the in-process exposition server can miss the 900 ms timeout and Prometheus then
        marks that host's series stale until its next scrape, which the backend rightly shows as stale."""
        out = read()
        for _ in range(tries - 1):
            if fresh(out):
                break
            self.prometheus.wait_scraped(self.hosts)
            out = read()
        return out

    def _dirty(self) -> bool:
        ex = self.exposition
        return (
            set(ex.hosts()) != set(self.recorded)
            or set(self.prometheus.hosts) != set(self.recorded)
            or any(ex.text(h) != text or ex.is_down(h) for h, text in self.recorded.items())
        )

    def restore(self, timeout: float = 30.0) -> None:
        """Serve the recorded texts again, every host up, the recorded targets only; when anything had
        changed, wait until Prometheus has scraped every host twice since (so the last scrape is stored)."""
        if not self._dirty():
            return
        ex = self.exposition
        for host in set(ex.hosts()) - set(self.recorded):
            ex.remove_host(host)
        for host, text in self.recorded.items():
            ex.set_host(host, text)
            ex.set_down(host, False)
        if set(self.prometheus.hosts) != set(self.recorded):
            self.prometheus.reload(self.hosts, timeout)
        seen = {h: ex.scrapes(h) for h in self.recorded}
        wait_until(
            lambda: all(ex.scrapes(h) >= n + 2 for h, n in seen.items()), timeout, what="two new scrapes"
        )
        self.prometheus.wait_scraped(self.hosts, timeout)


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """Path of the real ``prometheus`` (installed with apt-get when missing and root, else an error)."""
    return ensure_prometheus()


def _cluster(binary: str, **web: object) -> Iterator[PrometheusCluster]:
    with (
        ExpositionServer(recorded_cluster()) as exposition,
        PrometheusServer(exposition, RECORDED_HOSTS, binary=binary, **web) as prometheus,  # type: ignore[arg-type]
    ):
        prometheus.wait_scraped()
        yield PrometheusCluster(exposition, prometheus)


@pytest.fixture(scope="module")
def prometheus_cluster(prometheus_binary: str) -> Iterator[PrometheusCluster]:
    """Plain-http Prometheus over node-a ... node-d, every host scraped at least once."""
    yield from _cluster(prometheus_binary)


@pytest.fixture
def fresh_cluster(prometheus_cluster: PrometheusCluster) -> Iterator[PrometheusCluster]:
    """The module's ``prometheus_cluster`` in its recorded state; a test may set hosts down, change texts or
    reload targets, and the fixture puts everything back afterwards."""
    prometheus_cluster.restore()
    yield prometheus_cluster
    prometheus_cluster.restore()


@pytest.fixture(scope="module")
def prometheus_basic_auth(prometheus_binary: str) -> Iterator[PrometheusCluster]:
    """Like ``prometheus_cluster`` behind basic auth: user/password ``BASIC_AUTH`` (tests.prom_web)."""
    yield from _cluster(prometheus_binary, basic_auth=BASIC_AUTH)


@pytest.fixture(scope="module")
def prometheus_tls(prometheus_binary: str) -> Iterator[PrometheusCluster]:
    """Like ``prometheus_cluster`` over https: a throwaway CA (``.prometheus.ca_file``) signed its cert."""
    yield from _cluster(prometheus_binary, tls=True)


@pytest.fixture
def denying_proxy() -> Iterator[DenyingProxy]:
    """An auth proxy that answers every request 403 with a short JSON body; ``.url`` is its address."""
    with DenyingProxy() as proxy:
        yield proxy
