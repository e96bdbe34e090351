"""The GPU target: which GPUs a plan must fit on (:class:`GpuChoice`), the picker for it (:class:`TargetForm`)
and how a choice becomes the core's :class:`GpuTarget` against a GPU reading (:func:`resolve_target`).

Besides catalog and local GPUs, a *custom GPU* is any GPU given by its memory (``24GiB``, ``80GB``), read by
the same parser as the CLI's ``--gpu 24GiB`` (:func:`gpumem_gui.core.gpu_target_from_text`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from PySide6.QtCore import QSignalBlocker, Qt
from PySide6.QtGui import QFont, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import QComboBox, QFormLayout, QGroupBox, QLineEdit, QVBoxLayout, QWidget

from gpumem_gui.core import (
    DEFAULT_MARGIN_BYTES,
    GpumemInputError,
    GpuTarget,
    MiB,
    SizeUnit,
    catalog_target,
    find_gpu,
    fmt_bytes,
    gpu_target_from_text,
    load_gpu_catalog,
    parse_capacity,
)
from gpumem_gui.hardware.snapshot import GpuDevice, GpuSnapshot
from gpumem_gui.ui.field_form import FieldForm, blocked, combo_set, spin

# what the capacity field starts with: a 24 GB consumer card, as the default catalog GPU (RTX 4090)
CUSTOM_EXAMPLE = "24GiB"


class GpuChoice(BaseModel):
    """Which GPUs the plan must fit on: ``count`` catalog GPUs, local GPUs from ``device`` on, or ``count``
    GPUs of a custom ``capacity``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["catalog", "local", "custom"] = "catalog"
    gpu_id: str = Field("RTX-4090", min_length=1, max_length=100, description="catalog id (kind 'catalog')")
    device: str | None = Field(None, max_length=20, description="local device key, e.g. '0' or '0:1'")
    capacity: str | None = Field(
        None, max_length=80, description="kind 'custom': memory per GPU as typed, e.g. '24GiB' or '80GB'"
    )
    count: int = Field(1, ge=1, le=4096)
    margin_mib: int = Field(DEFAULT_MARGIN_BYTES // MiB, ge=0, le=1 << 20)
    basis: Literal["free", "total"] = Field("free", description="local GPUs: check against free or total")

    @property
    def margin_bytes(self) -> int:
        return self.margin_mib * MiB


@dataclass(frozen=True)
class ResolvedTarget:
    """A :class:`GpuChoice` made concrete: the core's target, and what the charts draw."""

    target: GpuTarget
    text: str
    free_now: tuple[int, ...] | None = None  # local GPUs: free memory now, whatever the basis
    devices: tuple[str, ...] = ()  # local device keys, in target order


def _local_devices(choice: GpuChoice, snapshot: GpuSnapshot | None) -> list[GpuDevice]:
    key = choice.device or "0"
    if snapshot is None:
        raise GpumemInputError("no reading of the local GPUs yet", field="gpu")
    if not snapshot.available:
        raise GpumemInputError(f"no local GPU: {snapshot.unavailable_reason}", field="gpu")
    dev = snapshot.device(key)
    if dev is None:
        raise GpumemInputError(f"local GPU {key} is not there now; pick a catalog GPU", field="gpu")
    instances = snapshot.mig_instances(dev.index) if dev.mig_mode else ()
    if instances:
        keys = ", ".join(m.key for m in instances)
        raise GpumemInputError(
            f"GPU {key} is in MIG mode: pick one of its MIG instances ({keys})", field="gpu"
        )
    if dev.is_mig_instance:
        if choice.count != 1:
            raise GpumemInputError("a MIG instance is one device: set the count to 1", field="gpu")
        chosen = [dev]
    else:
        # the picked GPU and the count - 1 freest others (most free memory first, ties by index),
        # in index order
        phys = [d for d in snapshot.physical_devices if not (d.mig_mode and snapshot.mig_instances(d.index))]
        if len(phys) < choice.count:
            raise GpumemInputError(
                f"only {len(phys)} local GPU(s) on this machine, not {choice.count}", field="gpu"
            )
        others = sorted(
            (d for d in phys if d.key != dev.key and d.ok),
            key=lambda d: (-(d.free_bytes or 0), d.index),
        )
        chosen = sorted([dev, *others[: choice.count - 1]], key=lambda d: d.index)
        if len(chosen) < choice.count:
            raise GpumemInputError(
                f"only {len(chosen)} usable local GPU(s) on this machine, not {choice.count}", field="gpu"
            )
    for d in chosen:
        if d.error:
            raise GpumemInputError(f"local GPU {d.key}: {d.error}", field="gpu")
        if d.total_bytes is None or d.free_bytes is None:
            raise GpumemInputError(f"local GPU {d.key} does not report its memory", field="gpu")
    return chosen


def resolve_target(choice: GpuChoice, snapshot: GpuSnapshot | None, unit: SizeUnit) -> ResolvedTarget:
    """The core's :class:`GpuTarget` for ``choice``; local GPUs need the latest ``snapshot``.

    Raises :class:`GpumemInputError` (field ``gpu``) when the choice cannot be met.
    """
    if choice.kind == "custom":
        return _custom_target(choice, unit)
    if choice.kind == "catalog":
        g = find_gpu(choice.gpu_id)
        target = catalog_target(g, choice.count)
        text = f"{choice.count} x {g.name} ({_each(target, unit)})"
        return ResolvedTarget(target=target, text=text)
    chosen = _local_devices(choice, snapshot)
    capacity = min(d.total_bytes or 0 for d in chosen)
    free = tuple(d.free_bytes or 0 for d in chosen)
    target = GpuTarget(
        name=chosen[0].name,
        capacity_bytes=capacity,
        # NVML shows the whole framebuffer; CUDA (what the engines read) leaves out the driver's reserve
        cuda_bytes=min(d.cuda_total_bytes or 0 for d in chosen) or None,
        count=len(chosen),
        free_bytes=free if choice.basis == "free" else None,
    )
    keys = ", ".join(d.key for d in chosen)
    basis = "free memory now" if choice.basis == "free" else "CUDA's total"
    text = f"local GPU {keys}: {chosen[0].name} ({_each(target, unit)}; checked against {basis})"
    return ResolvedTarget(target=target, text=text, free_now=free, devices=tuple(d.key for d in chosen))


def _custom_target(choice: GpuChoice, unit: SizeUnit) -> ResolvedTarget:
    """A custom GPU: ``count`` GPUs of the typed capacity (the CLI's ``--gpu 24GiB:COUNT``)."""
    text = (choice.capacity or "").strip()
    if ":" in text or parse_capacity(text) is None:
        raise GpumemInputError(
            "custom GPU: give its memory with a unit, e.g. 24GiB (2^30 bytes) or 80GB (10^9 bytes)",
            field="gpu",
        )
    t = gpu_target_from_text(text).model_copy(update={"count": choice.count})
    return ResolvedTarget(target=t, text=f"{choice.count} x {t.name} GPU ({_each(t, unit)})")


def _each(t: GpuTarget, unit: SizeUnit) -> str:
    """One GPU's memory in words, naming the figure: CUDA's total (what the engines and the verdict use) and,
    where it differs, nvidia-smi's."""
    out = f"{fmt_bytes(t.cuda_capacity, unit)} each as CUDA reports it"
    if t.cuda_capacity != t.capacity_bytes:
        out += f", {fmt_bytes(t.capacity_bytes, unit)} in nvidia-smi"
    return out


class TargetForm(FieldForm):
    """GPU target picker: a catalog GPU or a local GPU, how many, and the safety margin.

    Signals:
        changed(): the target was edited by the user.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._unit = SizeUnit.GIB
        self._local: list[tuple[str, str, int | None]] = []  # (key, name, total)
        self._basis: Literal["free", "total"] = "free"
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        g = QGroupBox("GPU target")
        f = QFormLayout(g)
        f.addRow(self.form_error)
        self._gpu = self._add_row(
            f,
            "gpu",
            "GPU",
            QComboBox(),
            "The GPU the plan must fit on: one of your GPUs (checked against its free memory now) or any GPU "
            "of the built-in catalog.",
        )
        assert isinstance(self._gpu, QComboBox)
        self._gpu.setMaxVisibleItems(24)
        self._capacity = self._add_row(
            f,
            "capacity",
            "Memory",
            QLineEdit(CUSTOM_EXAMPLE),
            "A custom GPU's memory: a number and a unit, GiB (2^30 bytes, what nvidia-smi's MiB add up "
            "to) or GB (10^9 bytes, what spec sheets say): 24GiB, 80GB, 23.5GiB. From 512 MiB to 4 TiB.",
        )
        assert isinstance(self._capacity, QLineEdit)
        self._capacity.setPlaceholderText("24GiB or 80GB")
        self._capacity.setMaxLength(80)  # GpuChoice.capacity's bound
        self._add_row(
            f,
            "count",
            "Count",
            spin(1, 4096, suffix=" GPUs"),
            "How many such GPUs (1 to 4096). Local GPUs: the picked one and the freest others.",
        )
        self._add_row(
            f,
            "margin_mib",
            "Safety margin",
            spin(0, 1 << 20, step=256, suffix=" MiB"),
            "Memory to keep free on every GPU (0 to 1,048,576 MiB; llama.cpp's --fit keeps 1024 MiB).",
        )
        outer.addWidget(g)
        for w in self._all_widgets():
            self._connect(w)
        self._capacity.textEdited.connect(self._capacity_typed)
        self._gpu.currentIndexChanged.connect(self._show_capacity)
        self._fill_gpus()
        self.set_value(GpuChoice())

    def _capacity_typed(self) -> None:
        self.typing = True  # the window waits for more keys before it recomputes
        self.changed.emit()

    def _show_capacity(self) -> None:
        row = self._rows["capacity"]
        row.layout.setRowVisible(row.label, str(self._gpu.currentData()).startswith("custom:"))  # type: ignore[attr-defined]

    def _fill_gpus(self) -> None:
        combo = self._gpu
        assert isinstance(combo, QComboBox)
        current = combo.currentData()
        model = QStandardItemModel(combo)
        bold = QFont()
        bold.setBold(True)

        def header(text: str) -> None:
            item = QStandardItem(text)
            item.setFlags(Qt.ItemFlag.NoItemFlags)
            item.setFont(bold)
            model.appendRow(item)

        def entry(text: str, data: str, tip: str = "") -> None:
            item = QStandardItem(text)
            item.setData(data, Qt.ItemDataRole.UserRole)
            if tip:
                item.setToolTip(tip)
            model.appendRow(item)

        if self._local:
            header("This machine")
            for key, name, total in self._local:
                size = f" ({fmt_bytes(total, self._unit, 1)})" if total else ""
                entry(f"    GPU {key}: {name.removeprefix('NVIDIA ')}{size}", f"local:{key}")
        header("Any GPU")
        entry(
            "    Custom GPU (give its memory)", "custom:", "A GPU that is not in the catalog, by its memory"
        )
        by_vendor: dict[str, list] = {}
        for g in load_gpu_catalog():
            by_vendor.setdefault(g.vendor, []).append(g)
        for vendor, gpus in by_vendor.items():
            header({"nvidia": "Catalog: NVIDIA", "amd": "Catalog: AMD"}.get(vendor, vendor))
            for g in gpus:
                entry(
                    f"    {g.name}  ({fmt_bytes(g.memory_bytes, self._unit, 1)})",
                    f"catalog:{g.id}",
                    f"{g.id}: {g.memory_nominal}; {g.memory_kind} figure from {g.memory_source}",
                )
        with QSignalBlocker(combo):
            combo.setModel(model)
            if current is not None:
                self._select(current)
        self._show_capacity()

    def _select(self, data: str) -> None:
        combo = self._gpu
        assert isinstance(combo, QComboBox)
        if combo_set(combo, data):
            return
        if data.startswith("local:"):  # keep a choice whose GPU has not been seen (yet)
            model = combo.model()
            assert isinstance(model, QStandardItemModel)
            item = QStandardItem(f"    local GPU {data.partition(':')[2]} (not seen now)")
            item.setData(data, Qt.ItemDataRole.UserRole)
            model.insertRow(0, item)
            combo.setCurrentIndex(0)
        else:
            combo_set(combo, f"catalog:{GpuChoice().gpu_id}")

    def set_local_devices(self, devices: Sequence[GpuDevice]) -> None:
        """Offer these local GPUs (rebuilt only when the set of devices changes)."""
        local = [(d.key, d.name, d.total_bytes) for d in devices]
        if local == self._local:
            return
        self._local = local
        self._fill_gpus()

    def set_unit(self, unit: SizeUnit) -> None:
        if unit != self._unit:
            self._unit = unit
            self._fill_gpus()

    def set_basis(self, basis: Literal["free", "total"]) -> None:
        self._basis = basis

    def value(self) -> GpuChoice:
        data = self._gpu.currentData() or f"catalog:{GpuChoice().gpu_id}"  # type: ignore[attr-defined]
        kind, _, ident = str(data).partition(":")
        return GpuChoice(
            kind=kind,
            gpu_id=ident if kind == "catalog" else GpuChoice().gpu_id,
            device=ident if kind == "local" else None,
            capacity=self._capacity.text()[:80] if kind == "custom" else None,  # type: ignore[attr-defined]
            count=self.widget("count").value(),  # type: ignore[attr-defined]
            margin_mib=self.widget("margin_mib").value(),  # type: ignore[attr-defined]
            basis=self._basis,
        )

    def set_value(self, choice: GpuChoice) -> None:
        with blocked(self._all_widgets()):
            data = {"local": f"local:{choice.device or '0'}", "custom": "custom:"}.get(
                choice.kind, f"catalog:{choice.gpu_id}"
            )
            self._select(data)
            if choice.kind == "custom":
                self._capacity.setText(choice.capacity or "")  # type: ignore[attr-defined]
            self.widget("count").setValue(choice.count)  # type: ignore[attr-defined]
            self.widget("margin_mib").setValue(choice.margin_mib)  # type: ignore[attr-defined]
        self._show_capacity()
        self._basis = choice.basis
        self.clear_errors()
