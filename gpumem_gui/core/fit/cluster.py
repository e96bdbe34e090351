"""Where on a cluster a run fits right now: placements of every rank of its plan on GPUs with free memory.

The input is what a cluster's monitoring says (one :class:`ClusterGpu` per usable GPU or MIG instance, with
the memory free on it now); the output (:class:`ClusterFit`) ranks the placements of the run's whole plan
(TP x PP x DP ranks) by fewest hosts, then most headroom, and says per host how many GPUs could take one rank.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import groupby

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.fit import DEFAULT_MARGIN_BYTES
from gpumem_gui.core.fit.cluster_models import ClusterFit, ClusterGpu, HostRoom, PlacedRank, Placement
from gpumem_gui.core.fit.sweep import Run, estimate_any
from gpumem_gui.core.gpu_memory import GpuMemory
from gpumem_gui.core.observed.apply import apply_calibration
from gpumem_gui.core.observed.calibration import Calibration, calibration_for
from gpumem_gui.core.readers.weights import WeightsInventory
from gpumem_gui.core.runtimes.inference import InferenceRun, runtime
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.units import fmt_bytes

__all__ = [
    "ClusterFit",
    "ClusterGpu",
    "HostRoom",
    "PlacedRank",
    "Placement",
    "cluster_fit",
    "cluster_summary",
]


# what a GPU's needs depend on: its totals (vLLM sizes its pool from them) and the name of the saved
# calibration of its model (gpumem calibrate; names are unique in the store; None: none saved for it)
_Kind = tuple[GpuMemory, str | None]


@dataclass(frozen=True)
class _Plan:
    """``replicas`` x ``per`` ranks (TP innermost) in units of ``unit`` ranks on one host; ``need[kind][p]``:
    what position ``p`` of a replica needs on a GPU of that kind (its totals and calibration; None: the engine
    refuses the run).
    A replica's units with the same needs share a class (``cls[k]``); ``order[c]``: class c's positions,
    biggest need first (classes too)."""

    per: int
    replicas: int
    tp: int
    unit: int
    margin: int
    engine: str
    need: dict[_Kind, tuple[int, ...] | None]
    kinds_of: dict[str, _Kind]  # GPU key -> its kind
    cls: tuple[int, ...]
    order: tuple[tuple[int, ...], ...]
    full: tuple[int, ...]  # units per class in the whole plan

    @property
    def ranks(self) -> int:
        return self.per * self.replicas

    @property
    def kinds(self) -> int:
        return self.per // self.unit

    def headroom(self, g: ClusterGpu, pos: int) -> int | None:
        """free - margin - need of position ``pos`` on ``g``; None where ``g`` cannot take it."""
        # A process sees one MIG instance, and MIG instances have no peer-to-peer: NVIDIA MIG User Guide,
        # "Application Considerations" ("CUDA can only enumerate a single compute instance"; "no GPU to GPU
        # P2P (either PCIe or NVLink) is supported"). So a MIG instance takes one-rank plans only.
        if g.mig_instance and self.ranks > 1:
            return None
        needs = self.needs(g)
        if needs is None:
            return None
        head = g.free_bytes - self.margin - needs[pos]
        return head if head >= 0 else None

    def needs(self, g: ClusterGpu) -> tuple[int, ...] | None:
        """What each position of a replica needs on ``g`` (None: the engine refuses the run there)."""
        return self.need[self.kinds_of[g.key]]

    def biggest(self, g: ClusterGpu) -> int | None:
        """Headroom of the plan's biggest rank on ``g`` (None: no room)."""
        needs = self.needs(g)
        return None if needs is None else self.headroom(g, needs.index(max(needs)))


def _plan(
    spec: ModelSpec,
    run: Run,
    gpus: Sequence[ClusterGpu],
    margin: int,
    fw: WeightsInventory | None,
    across: bool,
    calibrations: tuple[Calibration, ...],
) -> _Plan:
    """Estimate ``run`` once per distinct kind of GPU (only vLLM sizes its pool from the total; a saved
    calibration applies to the GPUs of its model, as on a single ``--gpu``) and read the plan."""
    inference = isinstance(run, InferenceRun)
    cal_of = {g.key: calibration_for(calibrations, g.name, run) for g in gpus}
    by_name = {c.name: c for c in cal_of.values() if c is not None}
    kinds_of = {g.key: (g.memory, c.name if (c := cal_of[g.key]) else None) for g in gpus}
    kinds = list(dict.fromkeys(kinds_of.values()))
    est = estimate_any(spec, run, kinds[0][0] if kinds else None, fw)
    per_total = inference and runtime(run.engine).sizes_from_capacity
    raw = {t: estimate_any(spec, run, t, fw) if per_total and t != kinds[0][0] else est for t, _c in kinds}
    ests = {(t, c): raw[t] if c is None else apply_calibration(raw[t], by_name[c]) for t, c in kinds}
    rt = runtime(est.engine) if est.mode == "inference" else None
    need: dict[_Kind, tuple[int, ...] | None] = {}
    for k, e in ests.items():
        ok = rt is None or rt.admits(e)
        need[k] = tuple(rt.needed_bytes(e, s) if rt else s.total_bytes for s in e.per_gpu) if ok else None
    per = len(est.per_gpu)
    # one replica's ranks are tp x pp, TP innermost (an engine that splits otherwise, llama.cpp, has no TP
    # groups); a training estimate's per_gpu is one DP x CP replica, the same on each
    tp = run.tp if per == run.tp * run.pp else 1
    replicas = 1 if inference else run.dp * run.cp
    unit = 1 if across else tp
    ok = [n for n in need.values() if n]
    ref = max(ok, key=max, default=tuple(s.total_bytes for s in est.per_gpu))
    sigs = [tuple(tuple(n[k * unit + i] for n in ok) for i in range(unit)) for k in range(per // unit)]
    first: dict[tuple[tuple[int, ...], ...], int] = {}  # a unit's needs at every kind -> first such unit
    for k, sig in enumerate(sigs):
        first.setdefault(sig, k)
    reps = sorted(first.values(), key=lambda k: -max(ref[k * unit : (k + 1) * unit]))
    cls = tuple(reps.index(first[sig]) for sig in sigs)
    order = tuple(tuple(sorted(range(k * unit, (k + 1) * unit), key=lambda p: -ref[p])) for k in reps)
    full = tuple(replicas * cls.count(c) for c in range(len(reps)))
    return _Plan(per, replicas, tp, unit, margin, est.engine, need, kinds_of, cls, order, full)


@dataclass(frozen=True)
class _Take:
    """What one host takes of the units left: per unit its class and its (GPU position on the host, rank
    position) pairs; ``counts`` per class; ``head`` the smallest headroom over them."""

    units: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]
    counts: tuple[int, ...]
    head: int
    n: int


_Got = tuple[int, int, int]  # (GPU position on the host, rank position, headroom)


@dataclass
class _Hosts:
    """The cluster by host (in the order first seen), each host's GPUs freest first; fills are cached."""

    plan: _Plan
    gpus: dict[str, list[ClusterGpu]]
    cache: dict[tuple[str, tuple[int, ...]], _Take] = field(default_factory=dict)
    ranked: dict[tuple[int, ...], list[str]] = field(default_factory=dict)

    def take(self, host: str, counts: tuple[int, ...]) -> _Take:
        """Place units of each class (biggest need first) on the host's freest GPUs while they fit."""
        most = len(self.gpus[host]) // self.plan.unit  # more of a class than this never fit: same fill
        key = (host, counts := tuple(min(c, most) for c in counts))
        if key not in self.cache:
            gpus, used = self.gpus[host], [False] * len(self.gpus[host])
            units, got, heads = [], [0] * len(counts), []
            for kind, positions in enumerate(self.plan.order):
                for _ in range(counts[kind]):
                    unit = self._unit(gpus, used, positions)
                    if unit is None:
                        break
                    units.append((kind, tuple((i, p) for i, p, _h in unit)))
                    got[kind] += 1
                    heads += [h for *_ip, h in unit]
            self.cache[key] = _Take(tuple(units), tuple(got), min(heads, default=-1), len(units))
        return self.cache[key]

    def _unit(
        self, gpus: list[ClusterGpu], used: list[bool], positions: tuple[int, ...]
    ) -> list[_Got] | None:
        """One unit on the freest unused GPUs with room, its biggest rank first; None if it does not fit."""
        got: list[_Got] = []
        for pos in positions:
            for i, g in enumerate(gpus):
                h = None if used[i] else self.plan.headroom(g, pos)
                if h is not None:
                    used[i] = True
                    got.append((i, pos, h))
                    break
            else:
                for i, _p, _h in got:
                    used[i] = False
                return None
        return got


def _greedy(
    hs: _Hosts, start: str, useful: list[str], full: tuple[int, ...]
) -> list[tuple[str, _Take]] | None:
    """From ``start``, add the host taking the most units left (then most headroom) until all are placed."""
    chosen, left, host = [], full, start
    while True:
        t = hs.take(host, left)
        chosen.append((host, t))
        left = tuple(a - b for a, b in zip(left, t.counts, strict=True))
        if not any(left):
            return chosen
        names = {h for h, _t in chosen}
        if left not in hs.ranked:  # the same units are left after many starts: rank the hosts once for them
            takes = [(h, hs.take(h, left)) for h in useful]
            hs.ranked[left] = [h for h, t in sorted(takes, key=lambda ht: (-ht[1].n, -ht[1].head)) if t.n]
        host = next((h for h in hs.ranked[left] if h not in names), None)
        if host is None:
            return None


def _placement(hs: _Hosts, chosen: list[tuple[str, _Take]]) -> Placement:
    """The ranks of the chosen hosts' units: each class's units go, in rank order, to the hosts in turn."""
    plan, out = hs.plan, []
    units = [
        iter([u for u in range(plan.replicas * plan.kinds) if plan.cls[u % plan.kinds] == c])
        for c in range(len(plan.order))
    ]
    for host, t in chosen:
        for c, pairs in t.units:
            u = next(units[c])
            for i, rep in pairs:
                g, pos = hs.gpus[host][i], u % plan.kinds * plan.unit + rep % plan.unit
                need = plan.needs(g)[pos]  # type: ignore[index]
                kw = {"host": host, "index": g.index, "key": g.key, "free_bytes": g.free_bytes}
                rank, head = u // plan.kinds * plan.per + pos, g.free_bytes - plan.margin - need
                out.append(PlacedRank(rank=rank, needed_bytes=need, headroom_bytes=head, **kw))
    out.sort(key=lambda r: r.rank)
    hosts = tuple(dict.fromkeys(r.host for r in out))
    return Placement(hosts=hosts, gpus=tuple(out), headroom_bytes=min(r.headroom_bytes for r in out))


def _search(hs: _Hosts) -> list[list[tuple[str, _Take]]]:
    """Every single host that takes the whole plan; when none does, greedy multi-host placements from each
    host in turn, one per set of hosts (the one with the most headroom)."""
    full = hs.plan.full
    takes = {h: hs.take(h, full) for h in hs.gpus}
    singles = [[(h, t)] for h, t in takes.items() if t.n == sum(full)]
    if singles:
        return singles
    useful = [h for h, t in takes.items() if t.n]
    found: dict[frozenset[str], list[tuple[str, _Take]]] = {}
    for start in useful:
        chosen = _greedy(hs, start, useful, full)
        if chosen is not None:
            key = frozenset(h for h, _t in chosen)
            if key not in found or _head(chosen) > _head(found[key]):
                found[key] = chosen
    return list(found.values())


def _head(chosen: list[tuple[str, _Take]]) -> int:
    return min(t.head for _h, t in chosen)


def cluster_fit(
    spec: ModelSpec,
    run: Run,
    gpus: Sequence[ClusterGpu],
    margin: int = DEFAULT_MARGIN_BYTES,
    file_weights: WeightsInventory | None = None,
    *,
    tp_across_hosts: bool = False,
    limit: int = 20,
    calibrations: tuple[Calibration, ...] = (),
) -> ClusterFit:
    """Where ``run``'s whole plan fits on ``gpus`` now: ranked placements, room per host, or why none.

    A GPU takes a rank when ``free - margin >= need`` (vLLM: its ``gpu_memory_utilization x total`` budget)
    and the engine admits the run at that GPU's total; a TP group stays on one host unless
    ``tp_across_hosts``; PP stages and DP replicas may span hosts. Of ``calibrations`` (the saved ones), each
    GPU's estimate applies the one for its model, engine and mode, as a single ``--gpu`` does. A run the model
    rejects raises :class:`GpumemInputError`.
    """
    for name, value, least in (("margin", margin, 0), ("limit", limit, 1)):
        if value < least:
            raise GpumemInputError(f"{name} must be at least {least} (got {value})", field=name)
    twice = next((k for k, n in Counter(g.key for g in gpus).items() if n > 1), None)
    if twice is not None:
        raise GpumemInputError(f"GPU key {twice!r} appears twice", field="gpus")
    plan = _plan(spec, run, gpus, margin, file_weights, tp_across_hosts, calibrations)
    by_host: dict[str, list[ClusterGpu]] = {}
    for g in gpus:
        by_host.setdefault(g.host, []).append(g)
    hs = _Hosts(
        plan, {h: sorted(gs, key=lambda g: (-g.free_bytes, g.index, g.key)) for h, gs in by_host.items()}
    )
    found = _search(hs)
    seen = {h: i for i, h in enumerate(by_host)}
    found.sort(key=lambda c: (len(c), -_head(c), sorted(seen[h] for h, _t in c)))
    rooms = tuple(
        HostRoom(host=h, gpus=len(gs), gpus_for_one_rank=sum(plan.biggest(g) is not None for g in gs))
        for h, gs in by_host.items()
    )
    return ClusterFit(
        ranks=plan.ranks,
        tp=plan.tp,
        tp_across_hosts=tp_across_hosts,
        margin_bytes=margin,
        fits=bool(found),
        placements=tuple(_placement(hs, c) for c in found[:limit]),
        placement_count=len(found),
        hosts=rooms,
        reason=None if found else _reason(hs, list(gpus)),
        calibrations=tuple(sorted({c for _t, c in plan.need if c is not None})),
    )


def _index(index: int, key: str) -> str:
    """'3', or '0 MIG 1' for a MIG instance (its key ends in ':<instance>', e.g. 'node-a/0:1')."""
    tail = key.rsplit("/", 1)[-1]
    return f"{index} MIG {tail.split(':', 1)[1]}" if ":" in tail else str(index)


def _reason(hs: _Hosts, gpus: list[ClusterGpu]) -> str:
    """Why nothing fits, in one short line: the first of the reasons below that holds."""
    plan = hs.plan
    if not gpus:
        return "no usable GPU (all stale or lost)"
    whole = [g for g in gpus if not (g.mig_instance and plan.ranks > 1)]
    if not whole:
        return f"the plan needs {plan.ranks} GPUs, and a MIG instance takes only one-rank plans"
    admitted = [g for g in whole if plan.needs(g) is not None]
    if not admitted:
        return f"{runtime(plan.engine).label} would not start the run on these GPUs (KV pool too small)"
    room = [g for g in admitted if any(plan.headroom(g, p) is not None for p in range(plan.per))]
    if not room:
        g = max(admitted, key=lambda g: g.free_bytes)
        want = plan.margin + min(plan.needs(g) or (0,))
        return (
            f"no GPU has {fmt_bytes(want)} free for one rank "
            f"(the freest: {g.host} GPU {_index(g.index, g.key)} with {fmt_bytes(g.free_bytes)})"
        )
    if len(room) < plan.ranks:
        return f"the plan needs {plan.ranks} GPUs; {len(room)} {'has' if len(room) == 1 else 'have'} room"
    if plan.unit > 1:
        full = plan.full
        best = max(hs.gpus, key=lambda h: hs.take(h, full).n)
        return (
            f"each TP group needs {plan.tp} GPUs on one host; the best host ({best}) can take "
            f"{hs.take(best, full).n} of {sum(full)} group{'s' if sum(full) > 1 else ''}"
        )
    return f"no assignment of the {plan.ranks} ranks fits the {len(room)} GPUs with room"


def _runs(indices: list[int]) -> str:
    """'0-3,5,7': runs of three or more as first-last."""
    out: list[str] = []
    for _step, group in groupby(enumerate(indices), key=lambda t: t[1] - t[0]):
        run = [x for _i, x in group]
        out += [f"{run[0]}-{run[-1]}"] if len(run) > 2 else [str(x) for x in run]
    return ",".join(out)


def cluster_summary(cf: ClusterFit) -> str:
    """One line: 'fits now on node-a GPUs 0-3 (and 2 other placements)', 'does not fit anywhere now: ...'."""
    if not cf.fits or not cf.placements:
        return f"does not fit anywhere now: {cf.reason}"
    best = cf.placements[0]
    parts = []
    for host in best.hosts:
        ranks = [r for r in best.gpus if r.host == host]
        mig = [m for r in ranks if " MIG " in (m := _index(r.index, r.key))]
        whole = sorted({r.index for r in ranks if " MIG " not in _index(r.index, r.key)})
        gpus = [f"GPU{'s' if len(whole) > 1 else ''} {_runs(whole)}"] if whole else []
        parts.append(f"{host} " + ", ".join(gpus + [f"GPU {m}" for m in mig]))
    others = cf.placement_count - 1
    tail = f" (and {others} other placement{'s' if others != 1 else ''})" if others else ""
    return f"fits now on {' + '.join(parts)}{tail}"
