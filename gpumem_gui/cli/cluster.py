"""``--prometheus``: a cluster's GPUs (``gpumem gpus``) and where a run fits on them now (``gpumem fit``).

Credentials never go on the command line: ``GPUMEM_PROMETHEUS_TOKEN`` (bearer), ``GPUMEM_PROMETHEUS_USER`` and
``GPUMEM_PROMETHEUS_PASSWORD`` (basic auth), or the files named by ``--prometheus-token-file`` /
``--prometheus-basic-auth-file``.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import TYPE_CHECKING, Any

from gpumem_gui.core import GpumemInputError, GpuTarget

if TYPE_CHECKING:
    from gpumem_gui.core import ClusterFit


def add_prometheus_flags(sp: argparse.ArgumentParser, *, fit: bool) -> None:
    g = sp.add_argument_group("cluster (Prometheus + NVIDIA dcgm-exporter)")
    g.add_argument("--prometheus", metavar="URL", help="read every host's GPUs from this Prometheus server")
    g.add_argument("--selector", default="", help="label matchers narrowing the query: '{cluster=\"a\"}'")
    g.add_argument(
        "--host-label",
        default="Hostname",
        help="label naming a GPU's host (default Hostname, as dcgm-exporter sets it)",
    )
    g.add_argument("--prometheus-token-file", metavar="FILE", help="file holding a bearer token")
    g.add_argument("--prometheus-basic-auth-file", metavar="FILE", help="file holding 'user:password'")
    g.add_argument("--prometheus-ca", metavar="FILE", help="PEM file of the CA of the server's certificate")
    g.add_argument("--prometheus-timeout", type=float, default=5.0, metavar="S", help="per request (5 s)")
    g.add_argument("--stale-after", type=float, default=120.0, metavar="S", help="samples older are stale")
    if fit:
        g.add_argument(
            "--tp-across-hosts",
            action="store_true",
            help="let a tensor-parallel group span hosts (default: each TP group on one host)",
        )


def cluster_given(args: argparse.Namespace) -> bool:
    given = getattr(args, "prometheus", None) is not None
    if not given:
        for flag in ("selector", "prometheus_token_file", "prometheus_basic_auth_file", "prometheus_ca"):
            if getattr(args, flag, None):
                raise GpumemInputError("needs --prometheus URL", field=flag.replace("_", "-"))
    return given


def cluster_snapshot(args: argparse.Namespace) -> Any:
    """One snapshot of the cluster the flags name (faults are its ``unavailable_reason``)."""
    from pathlib import Path

    from gpumem_gui.hardware import PrometheusBackend, make_prometheus_config

    def path(v: str | None) -> Path | None:
        return Path(v) if v else None

    cfg = make_prometheus_config(
        url=args.prometheus,
        selector=args.selector,
        host_label=args.host_label,
        token_file=path(args.prometheus_token_file),
        basic_auth_file=path(args.prometheus_basic_auth_file),
        ca_file=path(args.prometheus_ca),
        timeout_s=args.prometheus_timeout,
        stale_after_s=args.stale_after,
    )
    backend = PrometheusBackend(cfg)
    try:
        return backend.snapshot()
    finally:
        backend.close()


def cluster_target(gpus: tuple[Any, ...], ranks: int) -> GpuTarget:
    """The fit report's target when only a cluster is given: its most common GPU model, one per rank."""
    if not gpus:
        raise GpumemInputError(
            "the cluster has no usable GPU now (all stale, lost or unreadable)", field="prometheus"
        )
    name, _ = Counter(g.name for g in gpus).most_common(1)[0]
    largest = max((g for g in gpus if g.name == name), key=lambda g: g.total_bytes)
    return GpuTarget(
        name=name,
        capacity_bytes=largest.total_bytes,
        cuda_bytes=largest.memory.cuda_bytes,  # the framebuffer less FB_RESERVED
        count=max(1, min(ranks, 4096)),
    )


def cluster_fit_for(m: Any, run: Any, args: argparse.Namespace, snap: Any) -> ClusterFit:
    from gpumem_gui.cli.calibrate import saved_calibrations
    from gpumem_gui.core import cluster_fit
    from gpumem_gui.hardware.cluster import cluster_gpus

    return cluster_fit(
        m.spec,
        run,
        cluster_gpus(snap),
        args.margin_mib << 20,
        m.weights,
        tp_across_hosts=args.tp_across_hosts,
        calibrations=saved_calibrations(args),
    )


def print_cluster(cf: ClusterFit, snap: Any) -> None:
    from gpumem_gui.cli.output import gib
    from gpumem_gui.core import cluster_summary

    usable, hosts = sum(h.gpus for h in cf.hosts), len(snap.hosts)
    counts = f"{hosts} host{'s' * (hosts != 1)}, {usable} usable GPU{'s' * (usable != 1)}"
    print(f"cluster ({counts}): {cluster_summary(cf)}")
    for p in cf.placements[:5]:
        where = ", ".join(f"{g.host} GPU {g.key.split('/', 1)[-1]} (rank {g.rank})" for g in p.gpus)
        print(f"  + {gib(p.headroom_bytes)} GiB headroom: {where}")
    if len(cf.placements) > 5:
        print(f"  ... {cf.placement_count - 5} more (--json lists {len(cf.placements)})")
    print(
        "  per host, GPUs that can take one rank now: "
        + ", ".join(f"{h.host} {h.gpus_for_one_rank}/{h.gpus}" for h in cf.hosts)
    )
    for n in snap.notes:
        print(f"  note: {n}")
    if cf.calibrations:
        names = ", ".join(cf.calibrations)
        print(f"  note: calibrated on the GPUs of its model: {names} (--no-calibration leaves it out)")
