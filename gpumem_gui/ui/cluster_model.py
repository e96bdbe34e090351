"""The cluster view's model: hosts, their GPUs, and MIG instances under their GPU, as a tree of rows that a
delegate paints (no widget per GPU).

A new snapshot with the same hosts and GPUs in the same order updates in place: only the rows whose shown
values changed emit ``dataChanged``; any other change resets the model. The plan's verdict for a GPU comes
from the injected evaluator when its row is first painted, and is kept until the row, the plan, the unit or
the basis changes, so a 1,000-GPU cluster costs as many evaluations as there are rows on screen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from PySide6.QtCore import QAbstractItemModel, QModelIndex, QObject, QPersistentModelIndex, Qt

from gpumem_gui.core import SizeUnit, Verdict, fmt_bytes
from gpumem_gui.hardware.report import age_words
from gpumem_gui.hardware.snapshot import GpuDevice, GpuSnapshot

Evaluator = Callable[[GpuDevice, int], Verdict | None]
"""(device, bytes available on it) -> the plan's verdict on that device, or None when there is no plan."""

NO_HOST = "(no host label)"
_Index = QModelIndex | QPersistentModelIndex


def shown_values(d: GpuDevice) -> tuple:
    """What a card shows of ``d``: a fresh GPU's sample age is not shown, so a new age alone is no change."""
    age = round(d.sample_age_s) if d.stale and d.sample_age_s is not None else None
    procs = None if d.processes is None else len(d.processes)
    return (
        d.name, d.total_bytes, d.used_bytes, d.free_bytes, d.utilization_percent, d.temperature_c,
        d.error, d.stale, age, d.workloads, d.mig_mode, d.uuid, d.pci_bus_id, procs,
    )  # fmt: skip


def memory_text(d: GpuDevice, unit: SizeUnit) -> str:
    """'used 12.3 · free 67.7 of 80.0 GiB', as the local panel's cards say it."""
    if d.total_bytes is None:
        return "memory not reported"
    f = unit.factor
    used, free = (d.used_bytes or 0) / f, (d.free_bytes or 0) / f
    return f"used {used:.1f} · free {free:.1f} of {fmt_bytes(d.total_bytes, unit, 1)}"


@dataclass(frozen=True)
class HostInfo:
    """What a host row shows: its GPU count, whether all of it is stale (and since when), lost GPUs, and
    (once the cluster fit is known) how many of its GPUs could take one rank of the plan."""

    gpus: int
    stale: bool
    age_s: int | None
    lost: int
    room: int | None = None


@dataclass
class Node:
    """One row: a host (``device`` None) or a GPU / MIG instance."""

    id: int
    parent: int  # -1 for a host
    row: int
    key: str  # the host name, or the device key
    device: GpuDevice | None = None
    children: list[int] = field(default_factory=list)
    shown: object = None  # HostInfo of a host, shown_values() of a device
    rank: int | None = None  # the rank the best placement puts on this GPU

    @property
    def is_host(self) -> bool:
        return self.device is None


def _host_info(devices: list[GpuDevice], room: int | None) -> HostInfo:
    stale = bool(devices) and all(d.stale for d in devices)
    ages = [d.sample_age_s for d in devices if d.sample_age_s is not None]
    age = round(min(ages)) if stale and ages else None
    physical = sum(not d.is_mig_instance for d in devices)
    return HostInfo(physical, stale, age, sum(not d.ok for d in devices), room)


def _layout(snap: GpuSnapshot) -> list[tuple[str, list[tuple[GpuDevice, list[GpuDevice]]]]]:
    """Hosts in the snapshot's order; per host its GPUs, each with its MIG instances (an instance whose
    parent is not listed stands on its own)."""
    hosts: dict[str, list[GpuDevice]] = {}
    for d in snap.devices:
        hosts.setdefault(d.host or NO_HOST, []).append(d)
    out = []
    for host, devices in hosts.items():
        parents = {d.index for d in devices if not d.is_mig_instance}
        gpus: list[tuple[GpuDevice, list[GpuDevice]]] = []
        by_parent: dict[int, list[GpuDevice]] = {}
        for d in devices:
            if d.is_mig_instance and d.parent_index in parents:
                by_parent.setdefault(d.parent_index, []).append(d)  # type: ignore[arg-type]
            else:
                gpus.append((d, []))
        out.append(
            (host, [(d, by_parent.get(d.index, []) if not d.is_mig_instance else []) for d, _ in gpus])
        )
    return out


class ClusterModel(QAbstractItemModel):
    """Hosts > GPUs > MIG instances of the latest cluster snapshot (see module docstring)."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.nodes: list[Node] = []
        self.hosts: list[int] = []
        self.unit = SizeUnit.GIB
        self.basis = "free"
        self._evaluator: Evaluator | None = None
        self._verdicts: dict[int, Verdict | None] = {}
        self._structure: tuple = ()
        self._rooms: dict[str, int] = {}

    # ---- Qt's model interface ----------------------------------------------------------------------------

    def index(self, row: int, column: int = 0, parent: _Index = QModelIndex()) -> QModelIndex:  # noqa: B008
        ids = self.nodes[parent.internalId()].children if parent.isValid() else self.hosts
        if column != 0 or not 0 <= row < len(ids):
            return QModelIndex()
        return self.createIndex(row, 0, ids[row])

    def parent(self, child: _Index = QModelIndex()) -> QModelIndex:  # type: ignore[override]  # noqa: B008
        if not child.isValid():
            return QModelIndex()
        p = self.nodes[child.internalId()].parent
        return QModelIndex() if p < 0 else self.createIndex(self.nodes[p].row, 0, p)

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008
        if not parent.isValid():
            return len(self.hosts)
        return len(self.nodes[parent.internalId()].children) if parent.column() == 0 else 0

    def columnCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008
        return 1

    def flags(self, index: _Index) -> Qt.ItemFlag:
        return Qt.ItemFlag.ItemIsEnabled if index.isValid() else Qt.ItemFlag.NoItemFlags

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if not index.isValid():
            return None
        node = self.nodes[index.internalId()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.AccessibleTextRole):
            return self.line(node)
        if role == Qt.ItemDataRole.ToolTipRole:
            return self.tooltip(node)
        return None

    # ---- reading a row -----------------------------------------------------------------------------------

    def node(self, index: _Index) -> Node:
        return self.nodes[index.internalId()]

    def index_of(self, key: str) -> QModelIndex:
        """The row of a device key or a host name (invalid when there is none)."""
        for n in self.nodes:
            if n.key == key:
                return self.createIndex(n.row, 0, n.id)
        return QModelIndex()

    def verdict(self, node: Node) -> Verdict | None:
        """The plan's verdict on this row's GPU (None: no plan, a host, a lost GPU, stale, a MIG parent)."""
        if node.id in self._verdicts:
            return self._verdicts[node.id]
        d, v = node.device, None
        usable = d is not None and d.ok and not d.stale and d.total_bytes is not None and not node.children
        if usable and self._evaluator is not None and d is not None:
            available = d.free_bytes if self.basis == "free" else d.cuda_total_bytes
            v = self._evaluator(d, available or 0)
        self._verdicts[node.id] = v
        return v

    def line(self, node: Node) -> str:
        """A row as one line of text (accessibility, tests)."""
        d = node.device
        if d is None:
            info: HostInfo = node.shown  # type: ignore[assignment]
            text = f"{node.key} · {info.gpus} GPU{'s' if info.gpus != 1 else ''}"
            return text + (f" · stale, {age_words(info.age_s)}" if info.stale else "")
        title = f"{'MIG ' if d.is_mig_instance else ''}GPU {d.local_key} · {d.name}"
        return f"{title} · {d.error or memory_text(d, self.unit)}"

    def tooltip(self, node: Node) -> str:
        d = node.device
        if d is None:
            return node.key
        parts = [d.key, d.error or "", d.uuid or "", f"PCI {d.pci_bus_id or '?'}"]
        if d.workloads:
            parts.append("workloads: " + ", ".join(d.workloads))
        if d.sample_age_s is not None:
            parts.append(age_words(d.sample_age_s))
        return "\n".join(p for p in parts if p)

    # ---- inputs ------------------------------------------------------------------------------------------

    def update(self, snap: GpuSnapshot) -> int:
        """Show ``snap``: in place when its hosts and GPUs are those on screen (only changed rows emit
        ``dataChanged``), else by a reset. Returns how many rows changed (all of them on a reset)."""
        layout = _layout(snap)
        structure = tuple((h, tuple((d.key, tuple(m.key for m in ms)) for d, ms in gs)) for h, gs in layout)
        if structure != self._structure:
            self.beginResetModel()
            self._rebuild(layout)
            self._structure = structure
            self.endResetModel()
            return len(self.nodes)
        changed = []
        it = iter(self.nodes)
        for host, gpus in layout:
            host_node = next(it)
            for d, migs in gpus:
                for dev in (d, *migs):
                    n = next(it)
                    shown = shown_values(dev)
                    n.device = dev
                    if shown != n.shown:
                        n.shown = shown
                        self._verdicts.pop(n.id, None)
                        changed.append(n)
            info = _host_info([d for d, _ in gpus] + [m for _, ms in gpus for m in ms], self._rooms.get(host))
            if info != host_node.shown:
                host_node.shown = info
                changed.append(host_node)
        self._emit_changed(changed)
        return len(changed)

    def configure(self, evaluator: Evaluator | None, basis: str, unit: SizeUnit) -> None:
        """The plan (its evaluator), the basis or the unit changed: every GPU row emits ``dataChanged`` and
        its verdict is worked out again when it is painted."""
        self._evaluator, self.basis, self.unit = evaluator, basis, unit
        self._verdicts.clear()
        self._emit_changed(n for n in self.nodes if not n.is_host)

    def set_placement(self, ranks: dict[str, int], rooms: dict[str, int]) -> None:
        """Mark the GPUs of the best placement (device key -> rank) and each host's GPUs with room for one
        rank (host -> count); only rows whose mark changed emit ``dataChanged``."""
        self._rooms = dict(rooms)
        changed = []
        for n in self.nodes:
            if n.is_host:
                info: HostInfo = n.shown  # type: ignore[assignment]
                room = self._rooms.get(n.key)
                if info.room != room:
                    n.shown = HostInfo(info.gpus, info.stale, info.age_s, info.lost, room)
                    changed.append(n)
            elif ranks.get(n.key) != n.rank:
                n.rank = ranks.get(n.key)
                changed.append(n)
        self._emit_changed(changed)

    # ---- internals ---------------------------------------------------------------------------------------

    def _rebuild(self, layout: list[tuple[str, list[tuple[GpuDevice, list[GpuDevice]]]]]) -> None:
        self.nodes, self.hosts, self._verdicts = [], [], {}
        for hrow, (host, gpus) in enumerate(layout):
            devices = [d for d, _ in gpus] + [m for _, ms in gpus for m in ms]
            h = self._add(Node(len(self.nodes), -1, hrow, host, None, [], _host_info(devices, None)))
            self.hosts.append(h.id)
            for grow, (d, migs) in enumerate(gpus):
                g = self._add(Node(len(self.nodes), h.id, grow, d.key, d, [], shown_values(d)))
                h.children.append(g.id)
                for mrow, m in enumerate(migs):
                    g.children.append(
                        self._add(Node(len(self.nodes), g.id, mrow, m.key, m, [], shown_values(m))).id
                    )
        self._rooms = {}

    def _add(self, node: Node) -> Node:
        self.nodes.append(node)
        return node

    def _emit_changed(self, nodes: Iterable[Node]) -> None:
        """One ``dataChanged`` per run of consecutive changed rows under the same parent."""
        run: list[Node] = []
        for n in sorted(nodes, key=lambda n: (n.parent, n.row)):
            if run and (n.parent != run[-1].parent or n.row != run[-1].row + 1):
                self._emit_run(run)
                run = []
            run.append(n)
        if run:
            self._emit_run(run)

    def _emit_run(self, run: list[Node]) -> None:
        first, last = run[0], run[-1]
        self.dataChanged.emit(
            self.createIndex(first.row, 0, first.id), self.createIndex(last.row, 0, last.id)
        )
