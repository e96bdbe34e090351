"""What the window exports and copies: the JSON plan, the Markdown report, the command lines. No Qt here.

The JSON plan is the core's own ``gpumem estimate --json`` document (:mod:`gpumem_gui.core.fit.documents`,
which the CLI prints too), so a plan exported from the window and one printed by the CLI for the same inputs
are identical.
"""

from __future__ import annotations

import html
import json
import shlex
from collections.abc import Sequence
from typing import Any

from gpumem_gui.core import (
    DEFAULT_MARGIN_BYTES,
    Component,
    Estimate,
    FitReport,
    InferenceRun,
    LoadedModel,
    MiB,
    SizeUnit,
    TaskHead,
    TrainingRun,
    Verdict,
    command_args,
    estimate_document,
    fmt_bytes,
    fmt_count,
    maxima_phrases,
    reported_for,
    runtime,
)

# ---- files -------------------------------------------------------------------------------------------------


# ---- the JSON plan ---------------------------------------------------------------------------------------


def plan_document(
    m: LoadedModel, run: InferenceRun | TrainingRun, est: Estimate, rep: FitReport | None = None
) -> dict[str, Any]:
    """What ``gpumem estimate ... --json`` prints (the core's document, so the two are always identical)."""
    return estimate_document(m.name, m.params, run, est, rep, m.spec.approximate if m.spec else None)


def plan_json(
    m: LoadedModel, run: InferenceRun | TrainingRun, est: Estimate, rep: FitReport | None = None
) -> str:
    """The plan as the CLI prints it (``indent=2``, trailing newline)."""
    return json.dumps(plan_document(m, run, est, rep), indent=2, sort_keys=False) + "\n"


# ---- words -------------------------------------------------------------------------------------------------


def verdict_words(v: Verdict, unit: SizeUnit) -> str:
    """``fits with 3.20 GiB headroom`` / ``misses by 1.50 GiB`` (:meth:`Verdict.words`)."""
    return v.words(unit)


def worst_verdict(vs: Sequence[Verdict]) -> Verdict | None:
    """The verdict of the GPU in the worst shape (a miss before a fit, then the least headroom)."""
    return min(vs, key=lambda v: (v.fits, v.headroom_bytes)) if vs else None


# ---- command lines -----------------------------------------------------------------------------------------


def cli_command(
    source: str,
    run: InferenceRun | TrainingRun,
    gpu: str | None = None,
    count: int = 1,
    margin_bytes: int = DEFAULT_MARGIN_BYTES,
    task: TaskHead | None = None,
) -> str:
    """The ``gpumem estimate ...`` command line that rebuilds this plan, shell-quoted: the flags come from
    the run model's own field declarations (:func:`command_args`), the same the CLI's parser is built from.
    Inference always names ``--weights``: the CLI's default depends on the model (its files' bytes when it
    has weight files). An encoder's ``task`` head is named too (``--task``, ``--num-labels``)."""
    args = ["gpumem", "estimate", source]
    if task is not None:
        args += command_args(task)
    if isinstance(run, TrainingRun):
        args += ["--mode", "train"]
    else:
        args += ["--weights", run.weights]
    args += _without_weights(command_args(run))
    if gpu:
        args += ["--gpu", f"{gpu}:{count}" if count > 1 else gpu]
    margin_mib = margin_bytes // MiB
    if margin_mib != DEFAULT_MARGIN_BYTES // MiB:
        args += ["--margin-mib", str(margin_mib)]
    return shlex.join(args)


def _without_weights(args: list[str]) -> list[str]:
    if "--weights" not in args:
        return args
    i = args.index("--weights")
    return args[:i] + args[i + 2 :]


def runtime_flags(model: str, run: InferenceRun, est: Estimate) -> str:
    """The engine's own command line this plan implies (vLLM, llama.cpp), or transformers' load call."""
    return runtime(run.engine).command(model, run, est)


def run_summary(run: InferenceRun | TrainingRun) -> str:
    """One line saying what the run does (reports and the compare dialog)."""
    if isinstance(run, TrainingRun):
        method = {
            "full": "full fine-tune",
            "lora": f"LoRA r{run.lora_rank}",
            "qlora": f"QLoRA r{run.lora_rank}",
        }
        shard = f", ZeRO-{run.zero}" if run.zero else f", FSDP {run.fsdp}" if run.fsdp != "none" else ""
        offload = f", offload {run.offload}" if run.offload != "none" else ""
        return (
            f"training: {method[run.method]}, {run.precision}, {run.optimizer}; micro-batch {run.batch} x "
            f"{run.seq:,} tokens, accumulation {run.grad_accum}"
            + (", gradient checkpointing" if run.grad_ckpt else "")
            + f", attention {run.attn}; dp {run.dp} x tp {run.tp} x pp {run.pp} x cp {run.cp} (ep {run.ep})"
            + shard
            + offload
        )
    return (
        f"{run.engine}; batch {run.batch}, prompt {run.seq:,} + {run.new_tokens:,} new tokens; weights "
        f"{run.weights}, compute {run.compute_dtype}, KV cache {run.kv_dtype_resolved}, "
        f"attention {run.attn}, "
        f"tp {run.tp} x pp {run.pp} (ep {run.ep})"
    )


# ---- Markdown ----------------------------------------------------------------------------------------------


def _md_cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_report(
    m: LoadedModel,
    run: InferenceRun | TrainingRun,
    est: Estimate,
    rep: FitReport | None,
    *,
    unit: SizeUnit,
    target_text: str,
    command: str,
    flags: str,
    chart_png: str | None = None,
) -> str:
    """A self-contained Markdown report: the numbers, the verdict, the changes and every explanation."""
    out = _md_summary(m, run, est, unit, target_text)
    if rep is not None:
        out += _md_verdict(run, rep, unit)
    out += _md_tables(est, unit)
    if chart_png:
        out += ["", "## Charts", "", f"![charts]({chart_png})"]
    out += _md_explanations(est, unit)
    out += ["## Reproduce", "", "```bash", command, "```", "", "Runtime flags this plan implies:", ""]
    out += ["```", flags, "```", ""]
    return "\n".join(out)


def _md_summary(
    m: LoadedModel, run: InferenceRun | TrainingRun, est: Estimate, unit: SizeUnit, target_text: str
) -> list[str]:
    """The title, what is planned on what, and the memory it needs."""
    return [
        f"# gpumem plan: {m.name}",
        "",
        f"- model: `{m.source}` ({m.source_kind})"
        + (f", {fmt_count(m.params.total)} parameters" if m.params else ""),
        f"- run: {run_summary(run)}",
        f"- target: {target_text}",
        "",
        f"**GPU memory needed: {fmt_bytes(est.total_bytes, unit)} per GPU** (what a fit checks); "
        f"peak of live tensors {fmt_bytes(est.peak_bytes, unit)} in phase `{est.peak_phase}`"
        + (
            f"; on a GPU with room: reserved {fmt_bytes(rep.reserved_bytes, unit)} "
            f"(torch.cuda.max_memory_reserved), nvidia-smi {fmt_bytes(rep.nvidia_smi_bytes, unit)} "
            f"({rep.basis})"
            if (rep := reported_for(est))
            else ""
        )
        + (
            f"; CPU RAM for offloaded state {fmt_bytes(int(est.facts.get('cpu_bytes') or 0), unit)} per rank."
            if isinstance(run, TrainingRun)
            else f"; KV cache {fmt_bytes(est.kv_cache_bytes, unit)}."
        ),
        "",
    ]


def _md_verdict(run: InferenceRun | TrainingRun, rep: FitReport, unit: SizeUnit) -> list[str]:
    """The verdict per GPU, the maxima that fit and the ranked changes."""
    state = "fits" if rep.fits else "does not fit"
    out = [f"## Verdict: {state}", ""]
    for v in rep.verdicts:
        out.append(
            f"- GPU {v.gpu_index} ({v.role}): needs {fmt_bytes(v.needed_bytes, unit)} of "
            f"{fmt_bytes(v.available_bytes, unit)} (margin {fmt_bytes(v.margin_bytes, unit)}): "
            f"{verdict_words(v, unit)}"
        )
    # the core's words, as the CLI prints them: "no batch size fits" where nothing does, and a weight format
    # or KV dtype only where a strictly smaller one makes the run fit
    out += ["", f"Limits on this target: {', '.join(maxima_phrases(rep))}."]
    if rep.changes:
        out += ["", "### To make it fit (ranked)" if not rep.fits else "### Other options", ""]
        for c in rep.changes:
            out.append(
                f"- {'fits' if c.fits else 'still misses'}: {c.description} "
                f"({fmt_bytes(c.total_bytes, unit)})"
            )
    out.append("")
    return out


def _md_tables(est: Estimate, unit: SizeUnit) -> list[str]:
    """Components at the peak, phases, GPUs (when more than one) and warnings."""
    total = max(1, est.total_bytes)
    out = [
        "## Components at the peak",
        "",
        f"| component | bytes | {unit.value} | share |",
        "|---|---:|---:|---:|",
    ]
    for c in est.components:
        out.append(
            f"| {_md_cell(c.label)} | {c.bytes:,} | {c.bytes / unit.factor:.2f} "
            f"| {100 * c.bytes / total:.1f} % |"
        )
    out.append(f"| **total** | {est.total_bytes:,} | {est.total_bytes / unit.factor:.2f} | 100 % |")
    out += ["", "## Phases", "", f"| phase | peak ({unit.value}) | reserved ({unit.value}) | note |"]
    out.append("|---|---:|---:|---|")
    for name, ph in est.phases.items():
        mark = " (peak)" if name == est.peak_phase else ""
        reserved = "" if ph.reserved_bytes is None else f"{ph.reserved_bytes / unit.factor:.2f}"
        out.append(f"| {name}{mark} | {ph.peak_bytes / unit.factor:.2f} | {reserved} | {_md_cell(ph.note)} |")
    if len(est.per_gpu) > 1:
        out += ["", "## Per GPU", "", f"| GPU | role | total ({unit.value}) |", "|---|---|---:|"]
        for g in est.per_gpu:
            out.append(f"| {g.index} | {_md_cell(g.role)} | {g.total_bytes / unit.factor:.2f} |")
    if est.warnings:
        out += ["", "## Warnings", ""] + [f"- {w}" for w in est.warnings]
    return out


def _md_explanations(est: Estimate, unit: SizeUnit) -> list[str]:
    """How each component is computed: formula, inputs, source."""
    out = ["", "## How each number is computed", ""]
    for c in est.components:
        out += [f"### {c.label} (`{c.key}`): {fmt_bytes(c.bytes, unit)}", "", f"{c.explain.formula}", ""]
        if c.explain.inputs:
            out += [f"- {k} = `{v}`" for k, v in c.explain.inputs.items()]
            out.append("")
        if c.explain.source:
            out += [f"Source: {c.explain.source}", ""]
    return out


def explanation_html(c: Component, unit: SizeUnit, total_bytes: int) -> str:
    """One component's explanation (formula, inputs, source) as simple HTML for a text panel."""
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(str(k))}</td><td>&nbsp;=&nbsp;</td><td><code>{e(str(v))}</code></td></tr>"
        for k, v in c.explain.inputs.items()
    )
    share = 100 * c.bytes / max(1, total_bytes)
    parts = [
        f"<h3>{e(c.label)}</h3>",
        f"<p><b>{e(fmt_bytes(c.bytes, unit))}</b> ({c.bytes:,} bytes, {share:.1f} % of the total)"
        f" &mdash; key <code>{e(c.key)}</code></p>",
        f"<p><b>Formula</b><br>{e(c.explain.formula)}</p>",
    ]
    if rows:
        parts.append(f"<p><b>Inputs</b></p><table>{rows}</table>")
    if c.explain.source:
        parts.append(f"<p><b>Source</b><br>{e(c.explain.source)}</p>")
    return "".join(parts)
