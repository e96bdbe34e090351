"""The cluster backend: every GPU of every host, read from a Prometheus server that scrapes NVIDIA's
dcgm-exporter, as one immutable :class:`~gpumem_gui.hardware.snapshot.GpuSnapshot`.

One poll runs six instant queries (Prometheus HTTP API, ``/api/v1/query``):

* ``last_over_time(F{sel}[lookback])`` for each family F (``DCGM_FI_DEV_FB_FREE``, ``_FB_USED``,
  ``_FB_RESERVED``, all in MiB; ``DCGM_FI_DEV_GPU_UTIL`` in %; ``DCGM_FI_DEV_GPU_TEMP`` in °C): the newest
  value of every GPU seen within the lookback, including hosts that stopped answering;
* ``timestamp(DCGM_FI_DEV_FB_FREE{sel})``: when each live series was last scraped. A target that fails a
  scrape gets a staleness marker on all its series, so they drop out of this query at once (Prometheus docs,
  "Staleness"); a GPU in the first answer but not this one is gone: stale if its whole host is gone (shown
  greyed, with its age), lost if the rest of its host still reports. Their ages come from one more query of
  their raw samples.

The framebuffer total is ``free + used + reserved`` (DCGM's field docs: FB_TOTAL = FB_FREE + FB_USED +
FB_RESERVED; dcgm-exporter does not export FB_TOTAL by default). MIG instances are the series with a
``GPU_I_ID`` label; their parent gets ``mig_mode``. Faults are states, never exceptions: an unreachable
server, 401/403, TLS, a rejected query, no dcgm series, an answer too big; after a failure the next request
waits (0.5 s, doubling, at most 30 s) so a down server is not hammered by the poller.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpumem_gui.hardware.backend import CLOSED_REASON
from gpumem_gui.hardware.prometheus_config import PrometheusConfig
from gpumem_gui.hardware.prometheus_http import PrometheusFault, PrometheusHttp, Series
from gpumem_gui.hardware.report import age_words
from gpumem_gui.hardware.snapshot import GpuDevice, GpuSnapshot

FAMILIES = {
    "free": "DCGM_FI_DEV_FB_FREE",
    "used": "DCGM_FI_DEV_FB_USED",
    "reserved": "DCGM_FI_DEV_FB_RESERVED",
    "util": "DCGM_FI_DEV_GPU_UTIL",
    "temp": "DCGM_FI_DEV_GPU_TEMP",
}
MIB = 1 << 20  # dcgm-exporter's FB_* fields are MiB (its counters CSV: "Framebuffer memory free (in MiB)")
HOST_FALLBACKS = ("Hostname", "hostname", "instance")
WORKLOAD_LABELS = ("namespace", "pod", "container")  # dcgm-exporter --kubernetes
# gone GPUs whose age is looked up in one query (a regex of UUIDs; 200 x 41 characters keeps the query under
# ~8 KB, a common proxy limit for a request line or form body); more get no age
_AGE_QUERY_MAX = 200
# after a failure: half the window's fastest cluster poll (2 s), doubling to 30 s, half of Prometheus's
# default 1-minute scrape interval (a server that is down is asked about twice per scrape at most)
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.5, 30.0

LabelSet = tuple[tuple[str, str], ...]
DeviceId = tuple[str, int, int | None]  # (host, gpu, GPU instance id)


def _labelset(labels: dict[str, str]) -> LabelSet:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))


@dataclass
class _Seen:
    """What the answers say about one GPU (or MIG instance)."""

    labels: dict[str, str]
    values: dict[str, float] = field(default_factory=dict)
    sample_time: float | None = None  # newest scrape of a live series; None when gone
    gone_time: float | None = None  # a gone series' newest raw sample (looked up for gone GPUs only)
    workloads: set[str] = field(default_factory=set)


class PrometheusBackend:
    """A :class:`~gpumem_gui.hardware.backend.GpuBackend` over a Prometheus server scraping dcgm-exporter.

    Raises :class:`~gpumem_gui.core.GpumemInputError` at construction for a bad credential or CA file; after
    that, :meth:`snapshot` never raises: every fault is a snapshot's ``unavailable_reason``.
    """

    def __init__(self, cfg: PrometheusConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.name = f"prometheus:{cfg.url}"
        self._http = PrometheusHttp(cfg)
        self._clock = clock
        self._failures = 0
        self._retry_at = 0.0
        self._last_reason = ""
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._http.close()

    def snapshot(self) -> GpuSnapshot:
        if self._closed:
            return self._unavailable(CLOSED_REASON)
        now = self._clock()
        if now < self._retry_at:
            return self._unavailable(f"{self._last_reason} (next try in {math.ceil(self._retry_at - now)} s)")
        try:
            snap = self._poll()
        except PrometheusFault as f:
            self._failures += 1
            wait = min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** (self._failures - 1))
            self._retry_at, self._last_reason = now + wait, f.reason
            return self._unavailable(f.reason)
        self._failures, self._retry_at = 0, 0.0
        return snap

    def _unavailable(self, reason: str) -> GpuSnapshot:
        return GpuSnapshot(taken_at=time.time(), backend=self.name, unavailable_reason=reason)

    # ---- one poll -------------------------------------------------------------------------------------

    def _selector(self, extra: str = "") -> str:
        parts = [p for p in (self.cfg.selector, extra) if p]
        return "{" + ",".join(parts) + "}"

    def _poll(self) -> GpuSnapshot:
        sel, lookback = self._selector(), f"[{self.cfg.lookback_s}s]"
        answers = {k: self._http.query(f"last_over_time({m}{sel}{lookback})")[1] for k, m in FAMILIES.items()}
        if not answers["free"]:
            raise PrometheusFault(
                f"Prometheus at {self.cfg.url} has no {FAMILIES['free']}{sel} series in the last "
                f"{self.cfg.lookback_s} s: is dcgm-exporter scraped, and does the selector match?"
            )
        eval_time = answers["free"][0].samples[-1][0]
        live = self._http.query(f"timestamp({FAMILIES['free']}{sel})")[1]
        notes: list[str] = []
        seen = self._gather(answers, live, notes)
        self._gone_ages(seen)
        devices = self._devices(seen, eval_time, notes)
        return GpuSnapshot(
            taken_at=time.time(),
            backend=self.name,
            devices=devices,
            driver_version=_common(s.labels.get("DCGM_FI_DRIVER_VERSION") for s in seen.values()),
            notes=tuple(notes),
        )

    def _device_id(self, labels: dict[str, str]) -> DeviceId | None:
        host = next((labels[k] for k in (self.cfg.host_label, *HOST_FALLBACKS) if labels.get(k)), None)
        gpu, gi = labels.get("gpu", ""), labels.get("GPU_I_ID", "")
        if host is None or not _index(gpu) or (gi and not _index(gi)):
            return None
        return host, int(gpu), int(gi) if gi else None

    def _gather(
        self, answers: dict[str, list[Series]], live: list[Series], notes: list[str]
    ) -> dict[DeviceId, _Seen]:
        """One :class:`_Seen` per GPU: its freshest label set, values, scrape time and workloads."""
        scraped = {_labelset(s.labels): s.samples[-1][1] for s in live}
        seen: dict[DeviceId, _Seen] = {}
        skipped = 0
        for s in answers["free"]:
            dev = self._device_id(s.labels)
            if dev is None:
                skipped += 1
                continue
            t = scraped.get(_labelset(s.labels))
            cur = seen.get(dev)
            if cur is None or (t is not None and (cur.sample_time is None or t > cur.sample_time)):
                seen[dev] = _Seen(labels=s.labels, sample_time=t, workloads=cur.workloads if cur else set())
            if t is not None and (w := _workload(s.labels)):
                seen[dev].workloads.add(w)
        if skipped:
            notes.append(
                f"{skipped} series without a host label ({self.cfg.host_label}) or a numeric gpu label "
                "ignored"
            )
        by_set = {_labelset(s.labels): dev for dev, s in seen.items()}
        for fam, series in answers.items():
            for s in series:
                dev = by_set.get(_labelset(s.labels))
                if dev is not None and math.isfinite(s.samples[-1][1]):
                    seen[dev].values[fam] = s.samples[-1][1]
        return seen

    def _gone_ages(self, seen: dict[DeviceId, _Seen]) -> None:
        """The newest raw sample time of GPUs that are no longer scraped (one range query, bounded)."""
        gone = [s for s in seen.values() if s.sample_time is None]
        uuids = sorted({u for s in gone if (u := s.labels.get("UUID", "")) and _plain(u)})[:_AGE_QUERY_MAX]
        if not uuids:
            return
        matcher = 'UUID=~"' + "|".join(uuids) + '"'
        rng = f"[{self.cfg.lookback_s}s]"
        series = self._http.query(f"{FAMILIES['free']}{self._selector(matcher)}{rng}")[1]
        last = {_labelset(s.labels): max(t for t, _ in s.samples) for s in series if s.samples}
        for s in gone:
            t = last.get(_labelset(s.labels))
            if t is not None:
                s.gone_time = t

    def _devices(self, seen: dict[DeviceId, _Seen], now: float, notes: list[str]) -> tuple[GpuDevice, ...]:
        hosts_live = {dev[0] for dev, s in seen.items() if s.sample_time is not None}
        ids = sorted(seen, key=lambda d: (d[0], d[1], -1 if d[2] is None else d[2]))
        if len(ids) > self.cfg.max_devices:
            notes.append(
                f"showing {self.cfg.max_devices:,} of {len(ids):,} GPUs (the limit): narrow with a selector"
            )
            ids = ids[: self.cfg.max_devices]
        mig_parents = {(h, g) for h, g, gi in ids if gi is not None}
        out: list[GpuDevice] = []
        for host, gpu in dict.fromkeys((h, g) for h, g, _ in ids):
            whole = seen.get((host, gpu, None))
            instances = sorted(gi for h, g, gi in ids if h == host and g == gpu and gi is not None)
            where = _Where(host, gpu, now, host in hosts_live, self.cfg.stale_after_s)
            if whole is not None:
                out.append(_device(whole, where, None, None, mig_mode=(host, gpu) in mig_parents))
            else:
                out.append(_parent(seen[(host, gpu, instances[0])], host, gpu))
            for pos, gi in enumerate(instances):
                out.append(_device(seen[(host, gpu, gi)], where, pos, gi, mig_mode=False))
        return tuple(out)


def _index(label: str) -> bool:
    """A GPU or MIG-instance index label: at most 6 ASCII digits (str.isdigit() also takes '²')."""
    return label.isascii() and label.isdigit() and len(label) <= 6


def _plain(uuid: str) -> bool:
    return len(uuid) <= 100 and all(c.isalnum() or c == "-" for c in uuid)


def _workload(labels: dict[str, str]) -> str | None:
    parts = [labels.get(k, "") for k in WORKLOAD_LABELS]
    if not parts[1]:
        return None
    return "/".join(p for p in parts if p)


def _common(values: object) -> str | None:
    distinct = {v for v in values if v}  # type: ignore[attr-defined]
    return distinct.pop() if len(distinct) == 1 else None


def _mib(v: float | None) -> int | None:
    if v is None or not math.isfinite(v) or v < 0 or v > 1 << 40:
        return None
    return round(v * MIB)


def _parent(first: _Seen, host: str, gpu: int) -> GpuDevice:
    """A GPU in MIG mode that dcgm-exporter reports only through its instances."""
    lab = first.labels
    return GpuDevice(
        index=gpu,
        host=host,
        uuid=lab.get("UUID") or None,
        name=lab.get("modelName") or "unknown GPU",
        pci_bus_id=lab.get("pci_bus_id") or None,
        mig_mode=True,
        processes=None,
    )


@dataclass(frozen=True)
class _Where:
    """A physical GPU's place: its host, index, the poll's time and whether the host still reports."""

    host: str
    gpu: int
    now: float
    host_live: bool
    stale_after_s: float


def _device(s: _Seen, where: _Where, mig_index: int | None, gi: int | None, *, mig_mode: bool) -> GpuDevice:
    """A whole GPU (``gi`` None) or one MIG instance (the ``mig_index``-th of its parent)."""
    lab, v, host = s.labels, s.values, where.host
    t = s.sample_time if s.sample_time is not None else s.gone_time
    age = None if t is None else max(0.0, where.now - t)
    live = s.sample_time is not None
    name = lab.get("modelName") or "unknown GPU"
    base = {
        "index": where.gpu if gi is None else mig_index,
        "host": host,
        "uuid": (lab.get("UUID") or None) if gi is None else None,
        "name": name if gi is None else f"{name} MIG {lab.get('GPU_I_PROFILE') or gi}",
        "pci_bus_id": lab.get("pci_bus_id") or None,
        "is_mig_instance": gi is not None,
        "parent_index": where.gpu if gi is not None else None,
        "parent_uuid": (lab.get("UUID") or None) if gi is not None else None,
        "gpu_instance_id": gi,
        "mig_mode": mig_mode if gi is None else None,
        "processes": None,
        "sample_age_s": age,
        "workloads": tuple(sorted(s.workloads)),
    }
    if not live and where.host_live:
        seen_ago = f" ({age_words(age)})" if age is not None else ""
        return GpuDevice(**base, error=f"no longer reported by dcgm-exporter on {host}{seen_ago}")
    free, used, reserved = _mib(v.get("free")), _mib(v.get("used")), _mib(v.get("reserved"))
    total = None if free is None or used is None else free + used + (reserved or 0)
    util = v.get("util")
    temp = v.get("temp")
    return GpuDevice(
        **base,
        total_bytes=total,
        free_bytes=free,
        used_bytes=used,
        reserved_bytes=reserved,
        utilization_percent=round(util) if util is not None and 0 <= util <= 100 else None,
        temperature_c=round(temp) if temp is not None and -100 < temp < 300 else None,
        stale=not live or (age is not None and age > where.stale_after_s),
    )
