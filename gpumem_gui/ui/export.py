"""What the window's Export, Copy and Compare commands compute from the session's plan. No widgets here.

The command lines and the files come from :mod:`gpumem_gui.ui.report`; this module picks the inputs (the
catalog GPU a local target corresponds to, the plan to export) and writes the three export files.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpumem_gui.core import (
    Estimate,
    FitReport,
    GpumemInputError,
    LoadedModel,
    SizeUnit,
    TaskHead,
    TrainingRun,
    estimate_any,
    find_gpu,
    parse_capacity,
    runtime,
    training_command,
)
from gpumem_gui.files import atomic_write
from gpumem_gui.ui.plan import AnyRun
from gpumem_gui.ui.report import (
    cli_command,
    markdown_report,
    plan_json,
    runtime_flags,
)
from gpumem_gui.ui.scenario import ScenarioError, Side, read_scenario
from gpumem_gui.ui.target_form import GpuChoice, ResolvedTarget


def cli_gpu(choice: GpuChoice, resolved: ResolvedTarget | None) -> tuple[str | None, int]:
    """The ``--gpu`` catalog id and count for ``choice``: a local GPU by its catalog name when it has one."""
    if choice.kind == "catalog":
        return choice.gpu_id, choice.count
    if (
        choice.kind == "custom"
    ):  # the capacity as typed: --gpu takes the same grammar (core gpu_target_from_text)
        return ("".join((choice.capacity or "").split()) or None), choice.count
    if resolved is not None:
        name = resolved.target.name
        for candidate in (name, name.replace("NVIDIA ", ""), name.replace("NVIDIA GeForce ", "")):
            try:
                return find_gpu(candidate).id, choice.count
            except GpumemInputError:
                continue
    return None, choice.count


def command_line(
    m: LoadedModel | None, run: AnyRun | None, choice: GpuChoice, resolved: ResolvedTarget | None
) -> str:
    """The ``gpumem estimate ...`` command that rebuilds the plan."""
    if m is None or run is None:
        raise GpumemInputError("no plan yet")
    gpu, count = cli_gpu(choice, resolved)
    task = TaskHead.of(m.spec) if m.spec is not None else None
    return cli_command(m.source, run, gpu, count, choice.margin_bytes, task)


def runtime_flags_text(m: LoadedModel | None, run: AnyRun | None, est: Estimate | None) -> str:
    """The engine's command line (inference) or the Hugging Face training arguments (training)."""
    if m is None or run is None or est is None:
        raise GpumemInputError("no plan yet")
    if isinstance(run, TrainingRun):
        return training_command(m.source, run)
    # an engine that cannot load this model as the run has it (llama.cpp and a repository without GGUF
    # files, vLLM and a format it does not quantize to) gets the reason, not a command that would fail
    why = (
        None if m.spec is None else runtime(run.engine).expresses(m.spec, run, m.source, m.checkpoint_weights)
    )
    if why is not None:
        return f"# no {run.engine} command: {why}"
    return runtime_flags(m.source, run, est)


def export_base(base: Path | str) -> Path:
    """``base`` without a .md, .json or .png suffix."""
    base = Path(base)
    return base.with_suffix("") if base.suffix.lower() in (".md", ".json", ".png") else base


def write_export(
    base: Path,
    m: LoadedModel,
    run: AnyRun,
    est: Estimate,
    rep: FitReport | None,
    *,
    chart_png: bytes,
    unit: SizeUnit,
    target_text: str,
    command: str,
    flags: str,
) -> list[Path]:
    """Write ``base``.md (report), ``base``.png (charts) and ``base``.json (the plan as ``gpumem estimate
    --json`` prints it), each atomically; returns the paths."""
    json_path = base.with_suffix(".json")
    png_path = base.with_suffix(".png")
    md_path = base.with_suffix(".md")
    atomic_write(json_path, plan_json(m, run, est, rep))
    atomic_write(png_path, chart_png)
    md = markdown_report(
        m,
        run,
        est,
        rep,
        unit=unit,
        target_text=target_text,
        command=command,
        flags=flags,
        chart_png=png_path.name,
    )
    atomic_write(md_path, md)
    return [md_path, png_path, json_path]


def scenario_side(path: Path | str, load: Callable[[str], LoadedModel]) -> Side:
    """One side of a comparison: the scenario file's plan, estimated against its catalog GPU (if any)."""
    try:
        sc = read_scenario(path)
    except ScenarioError as e:
        raise GpumemInputError(str(e)) from None
    m = load(sc.model.source)
    if m.spec is None:
        raise GpumemInputError("the architecture is unknown (no config.json)", source=sc.model.source)
    run = sc.active_run
    cap = None
    if sc.gpu.kind == "catalog":
        cap = find_gpu(sc.gpu.gpu_id).memory_bytes
    elif sc.gpu.kind == "custom" and sc.gpu.capacity:
        cap = parse_capacity(sc.gpu.capacity)
    est = estimate_any(m.spec, run, cap, m.weights)
    return Side(Path(path).name, m.name, run, est)
