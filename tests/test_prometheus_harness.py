"""The Prometheus harness itself: the real Prometheus 2.42 scrapes the recorded dcgm-exporter hosts, and what
the cluster reader will rely on holds (series per host, staleness of a dead host, a vanished GPU, basic auth,
TLS). One Prometheus per kind for the module (tests/prom_fixtures.py)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

import pytest

# pytest finds fixtures by name in this module: take them all (tests/prom_fixtures.py __all__)
from tests.prom_fixtures import *  # noqa: F403
from tests.prom_fixtures import PrometheusCluster
from tests.prometheus_harness import (
    BASIC_AUTH,
    DenyingProxy,
    ExpositionServer,
    PrometheusServer,
    parse_exposition,
    recorded,
    recorded_cluster,
    synthetic_cluster,
)

FB_FAMILIES = ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED")
# MiB totals (free + used + reserved) of the recorded cards; tests/data/dcgm/README.md names the sources
CARD_MIB = {
    "NVIDIA H100 80GB HBM3": 81559,
    "NVIDIA A100-SXM4-80GB": 81920,
    "NVIDIA A100 80GB PCIe": 81920,
    "NVIDIA GeForce RTX 4090": 24564,
}
# MIG GPU instance sizes on an A100 80GB (nvidia-smi mig -lgip: 9.50 / 19.50 / 39.25 GiB)
MIG_MIB = {"1g.10gb": 9728, "2g.20gb": 19968, "3g.40gb": 40192}


def _key(labels: dict[str, str]) -> tuple[str, str]:
    return labels["gpu"], labels.get("GPU_I_ID", "")


def _fb_by_entity(text: str) -> dict[tuple[str, str], dict[str, float]]:
    out: dict[tuple[str, str], dict[str, float]] = {}
    for family, labels, value in parse_exposition(text):
        if family in FB_FAMILIES:
            out.setdefault((*_key(labels), labels["modelName"]), {})[family] = value  # type: ignore[index]
    return out


def _get(url: str, **kw) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=5, **kw) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read(), e.headers.get("Content-Type", "")


# ---- the recorded data and the exposition server, without Prometheus ------------------------------------


def test_recorded_memory_adds_up_to_each_card() -> None:
    for host, text in recorded_cluster().items():
        for (gpu, gi, model), fb in _fb_by_entity(text).items():
            assert set(fb) == set(FB_FAMILIES), (host, gpu, gi)
            total = MIG_MIB[_profile(text, gpu, gi)] if gi else CARD_MIB[model]
            assert sum(fb.values()) == total, (host, gpu, gi)
    used_a = [fb["DCGM_FI_DEV_FB_USED"] for fb in _fb_by_entity(recorded("node-a")).values()]
    assert all(u > 70 * 1024 for u in used_a[:4]) and all(u < 1024 for u in used_a[4:])


def _profile(text: str, gpu: str, gi: str) -> str:
    return next(lb["GPU_I_PROFILE"] for _, lb, _ in parse_exposition(text) if _key(lb) == (gpu, gi))


def test_exposition_server_answers_like_an_exporter() -> None:
    with ExpositionServer({"node-a": recorded("node-a")}) as server:
        status, body, ctype = _get(server.url + "/hosts/node-a/metrics")
        assert (status, body.decode(), ctype.split(";")[0]) == (200, recorded("node-a"), "text/plain")
        server.set_down("node-a", True)
        assert _get(server.url + "/hosts/node-a/metrics")[:2] == (503, b"")
        assert _get(server.url + "/hosts/node-x/metrics")[0] == 404
        assert _get(server.url + "/metrics")[0] == 404
        assert server.scrapes("node-a") == 2


def test_denying_proxy_forbids_everything(denying_proxy: DenyingProxy) -> None:
    status, body, ctype = _get(denying_proxy.url + "/api/v1/query?query=up")
    assert (status, ctype) == (403, "application/json")
    assert json.loads(body)["status"] == "error"


def test_synthetic_cluster_is_a_thousand_realistic_gpus() -> None:
    cluster = synthetic_cluster()
    assert len(cluster) == 125 and cluster == synthetic_cluster(seed=0) != synthetic_cluster(seed=1)
    entities = [e for text in cluster.values() for e in _fb_by_entity(text).items()]
    assert len(entities) == 1000
    assert all(sum(fb.values()) == CARD_MIB[model] for (_, _, model), fb in entities)
    recorded_keys = {frozenset(lb) for _, lb, _ in parse_exposition(recorded("node-a"))}
    assert {frozenset(lb) for _, lb, _ in parse_exposition(cluster["gpu-node-007"])} == recorded_keys


# ---- the real Prometheus ---------------------------------------------------------------------------------


def test_every_recorded_series_is_in_prometheus(prometheus_cluster: PrometheusCluster) -> None:
    prom = prometheus_cluster.prometheus
    for host in prometheus_cluster.hosts:
        want = {_key(lb): v for lb, v in prometheus_cluster.expected(host)}
        got = prom.vector(f'DCGM_FI_DEV_FB_FREE{{instance="{host}"}}')
        assert {_key(s["metric"]): float(s["value"][1]) for s in got} == want, host
        assert {(s["metric"]["job"], s["metric"]["Hostname"]) for s in got} == {("dcgm", host)}
    targets = json.loads(prom.request("/api/v1/targets")[1])["data"]["activeTargets"]
    assert {t["labels"]["instance"]: t["scrapeUrl"].split("/", 3)[3] for t in targets} == {
        h: f"hosts/{h}/metrics" for h in prometheus_cluster.hosts
    }


def test_mig_instances_and_pods_keep_their_labels(prometheus_cluster: PrometheusCluster) -> None:
    got = prometheus_cluster.prometheus.vector('DCGM_FI_DEV_FB_FREE{Hostname="node-c"}')
    by_key = {_key(s["metric"]): s["metric"] for s in got}
    assert set(by_key) == {("0", "1"), ("0", "5"), ("0", "9"), ("0", "10"), ("1", "")}  # no parent GPU 0 row
    assert by_key[("0", "1")]["GPU_I_PROFILE"] == "3g.40gb" and by_key[("0", "1")]["namespace"] == "inference"
    # empty pod labels, as the exporter prints them for an unused instance, are no labels in Prometheus
    assert not {"pod", "namespace", "container"} & set(by_key[("0", "9")])


def test_a_dead_host_goes_stale_but_keeps_its_last_values(fresh_cluster: PrometheusCluster) -> None:
    prom = fresh_cluster.prometheus
    assert len(prom.vector('DCGM_FI_DEV_FB_FREE{Hostname="node-d"}')) == 2
    fresh_cluster.exposition.set_down("node-d", True)
    prom.wait_until(lambda: prom.vector('up{instance="node-d"} == 0'), what="up{node-d} == 0")
    prom.wait_until(lambda: not prom.vector('DCGM_FI_DEV_FB_FREE{Hostname="node-d"}'), what="node-d stale")
    last = prom.vector('last_over_time(DCGM_FI_DEV_FB_FREE{Hostname="node-d"}[5m])')
    assert sorted(float(s["value"][1]) for s in last) == sorted(
        v for _, v in fresh_cluster.expected("node-d")
    )
    assert prom.up_hosts() == {"node-a", "node-b", "node-c"}


def test_a_vanished_gpu_leaves_the_instant_query(fresh_cluster: PrometheusCluster) -> None:
    prom = fresh_cluster.prometheus
    fresh_cluster.exposition.set_host("node-b", recorded("node-b-gpu3-gone"))
    query = 'DCGM_FI_DEV_FB_FREE{Hostname="node-b"}'
    prom.wait_until(lambda: len(prom.vector(query)) == 3, what="node-b down to 3 GPUs")
    assert {s["metric"]["gpu"] for s in prom.vector(query)} == {"0", "1", "2"}
    assert len(prom.vector(f"last_over_time({query}[5m])")) == 4
    assert "node-b" in prom.up_hosts()


def test_reload_changes_the_targets(prometheus_binary: str) -> None:
    extra = synthetic_cluster(hosts=2, gpus_per_host=2, seed=3)
    with (
        ExpositionServer(extra) as exposition,
        PrometheusServer(exposition, [], binary=prometheus_binary) as prom,
    ):
        assert prom.vector("up") == []
        prom.reload(extra)
        prom.wait_scraped()
        assert len(prom.vector('DCGM_FI_DEV_FB_FREE{Hostname=~"gpu-node-.*"}')) == 4


def test_basic_auth_needs_the_password(prometheus_basic_auth: PrometheusCluster) -> None:
    prom = prometheus_basic_auth.prometheus
    assert prom.request("/api/v1/query?query=up", auth=False)[0] == 401
    assert prom.request("/api/v1/query?query=up")[0] == 200
    assert len(prom.vector("DCGM_FI_DEV_FB_FREE")) == 19
    prom.basic_auth = (BASIC_AUTH[0], "wrong")
    try:
        assert prom.request("/api/v1/query?query=up")[0] == 401
    finally:
        prom.basic_auth = BASIC_AUTH


def test_tls_is_trusted_only_with_the_ca(prometheus_tls: PrometheusCluster) -> None:
    prom = prometheus_tls.prometheus
    assert prom.url.startswith("https://127.0.0.1:") and prom.ca_file is not None
    context = ssl.create_default_context(cafile=str(prom.ca_file))
    assert _get(prom.url + "/-/ready", context=context)[0] == 200
    assert len(prom.vector("DCGM_FI_DEV_FB_FREE")) == 19
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        _get(prom.url + "/-/ready", context=ssl.create_default_context())
    assert _get(prom.url.replace("https:", "http:") + "/-/ready")[0] == 400  # Go's answer to http on https
