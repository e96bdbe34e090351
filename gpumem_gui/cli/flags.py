"""The run flags of ``gpumem estimate/fit/sweep``, generated from the run models' field declarations.

Every :class:`~gpumem_gui.core.InferenceRun` and :class:`~gpumem_gui.core.TrainingRun` field with a UI
entry becomes one flag (``--new-tokens``, ``--grad-ckpt/--no-grad-ckpt``, the engine's own spellings such as
``-ngl`` as aliases); a flag given is passed to the model, which validates it and names the field; a flag
left out takes the model's default. The window's copied command line is written by the same declarations
(:func:`gpumem_gui.core.command_args`), so the two cannot drift. ``make readme`` rewrites the README's
flag table from them.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from gpumem_gui.cli.output import clip
from gpumem_gui.core import (
    MAX_GPUS,
    GpumemInputError,
    GpuTarget,
    InferenceRun,
    LoadedModel,
    RunField,
    TaskHead,
    TrainingRun,
    gpu_target_from_text,
    load_model,
    make_run,
    make_task_head,
    make_training_run,
    model_kinds,
    run_fields,
    spec_from_config,
)

MODES: dict[str, type] = {"inference": InferenceRun, "train": TrainingRun}
_DEST = "run__"
# --margin-mib: memory kept free per GPU, 0 to 1 TiB (the window's safety margin takes the same range,
# ui/target_form.GpuChoice.margin_mib): below 0 it would add memory no GPU has, and no GPU has 1 TiB
MARGIN_MIB_RANGE = (0, 1 << 20)


def bounded_int(lo: int, hi: int, unit: str = "") -> Any:
    """argparse ``type=``: an integer from ``lo`` to ``hi`` (argparse's error names the flag)."""

    def parse(text: str) -> int:
        t = text.strip()
        if not re.fullmatch(r"[-+]?\d{1,20}", t) or not lo <= int(t) <= hi:
            raise argparse.ArgumentTypeError(
                f"must be an integer from {lo:,} to {hi:,}{unit}, got {clip(text)}"
            )
        return int(t)

    parse.__name__ = "integer"
    return parse


class _Value:
    """argparse ``type=``: the field's own parser, named after its kind in argparse's messages."""

    def __init__(self, field: RunField) -> None:
        self.field = field
        self.__name__ = "number" if field.kind in ("int", "float") else field.kind

    def __call__(self, text: str) -> Any:
        try:
            return self.field.parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"invalid {self.field.kind} value {clip(text)} (allowed: {self.field.range_text()})"
            ) from None


def _help(f: RunField, modes: list[str]) -> str:
    where = "" if len(modes) == len(MODES) else f"[{' / '.join(modes)}] "
    engines = f"[{', '.join(f.ui.engines)}] " if f.ui.engines else ""
    return f"{where}{engines}{f.ui.help} ({f.range_text()}; default {f.default_text()})".replace("%", "%%")


def _owners() -> dict[str, tuple[RunField, list[str]]]:
    """Each field name with its declaration and the modes that have it (shared fields declared alike)."""
    out: dict[str, tuple[RunField, list[str]]] = {}
    for mode, model in MODES.items():
        for f in run_fields(model):
            if f.name in out:
                first = out[f.name][0]
                assert (first.kind, first.flag) == (f.kind, f.flag), f"{f.name} declared two ways"
                out[f.name][1].append(mode)
            else:
                out[f.name] = (f, [mode])
    return out


def add_run_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("model", help="catalog id, config.json, model folder, .safetensors, .gguf or hub id")
    sp.add_argument("--mode", choices=list(MODES), default="inference")
    add_task_flags(sp)
    groups: dict[str, Any] = {}
    for name, (f, modes) in _owners().items():
        title = f.ui.group if len(modes) == len(MODES) else f"{f.ui.group} (--mode {modes[0]})"
        group = groups.get(title) or groups.setdefault(title, sp.add_argument_group(title))
        kw: dict[str, Any] = {"dest": _DEST + name, "default": argparse.SUPPRESS, "help": _help(f, modes)}
        if f.kind == "bool":
            group.add_argument(f.flag, *f.ui.aliases, action=argparse.BooleanOptionalAction, **kw)
            continue
        if f.values:
            kw["choices"] = list(f.values)
        else:
            kw["metavar"] = {"int": "N", "float": "X"}.get(f.kind, "TEXT")
        group.add_argument(f.flag, *f.ui.aliases, type=_Value(f), **kw)


def run_fields_given(args: argparse.Namespace) -> dict[str, Any]:
    return {k[len(_DEST) :]: v for k, v in vars(args).items() if k.startswith(_DEST)}


def run_from_args(
    args: argparse.Namespace, m: LoadedModel, base: dict[str, Any] | None = None
) -> InferenceRun | TrainingRun:
    """The run the flags describe (on top of ``base``: an imported command's or config's fields); a flag of
    the other mode is an input error naming it."""
    flags = run_fields_given(args)
    given = {**(base or {}), **flags}
    model = MODES[args.mode]
    names = {f.name for f in run_fields(model)}
    for name in flags:
        if name not in names:
            f, modes = _owners()[name]
            raise GpumemInputError(
                f"{f.flag} belongs to --mode {modes[0]}, not --mode {args.mode}", field=name
            )
    _encoder_defaults(m, model, given)
    if model is TrainingRun:
        return make_training_run(**given)
    given.setdefault("weights", m.default_weights)
    return make_run(**given)


def _encoder_defaults(m: LoadedModel, model: type, given: dict[str, Any]) -> None:
    """An encoder (BERT, RoBERTa, ...) reads at most its position table and generates nothing: unless given,
    the sequence is the run's default capped at ``max_position_embeddings`` and no tokens are generated."""
    if m.spec is None or model_kinds(m.spec).model != "encoder":
        return
    given.setdefault("seq", min(model.model_fields["seq"].default, m.spec.max_position_embeddings))
    if model is not TrainingRun:
        given.setdefault("new_tokens", 0)


def _local_target(fake: str | None) -> Any:
    """The CUDA-visible local GPUs as a fit target: the smallest total as capacity, free memory per GPU."""
    from gpumem_gui.hardware import default_backend

    backend = default_backend(fake)
    try:
        snap = backend.snapshot()
    finally:
        backend.close()
    if not snap.available:
        raise GpumemInputError(f"no local GPU to check against: {snap.unavailable_reason}", field="local")
    devs = [d for d in snap.cuda_devices if d.ok and d.total_bytes]
    if not devs:
        raise GpumemInputError("no usable local GPU (none visible to CUDA, or all lost)", field="local")
    if len(devs) > MAX_GPUS:
        raise GpumemInputError(
            f"{len(devs):,} local GPUs; a plan is checked on at most {MAX_GPUS:,} "
            "(pick them with CUDA_VISIBLE_DEVICES)",
            field="local",
        )
    names = {d.name for d in devs}
    smallest = min(devs, key=lambda d: d.total_bytes)
    return GpuTarget(
        name=devs[0].name if len(names) == 1 else "local GPUs (mixed)",
        capacity_bytes=smallest.total_bytes,
        # NVML shows the whole framebuffer; CUDA (what the engines read) leaves out the driver's reserve
        cuda_bytes=min(d.cuda_total_bytes or 0 for d in devs) or None,
        count=len(devs),
        free_bytes=tuple(d.free_bytes or 0 for d in devs),
    )


def add_target_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--gpu",
        default=None,
        metavar="GPU[:COUNT]",
        help="a catalog GPU (H100-80GB:4; gpumem gpus --catalog lists them) or any GPU by its memory "
        "(24GiB, 80GB:4, 23.5GiB:2; GiB = 2^30 bytes, GB = 10^9)",
    )
    sp.add_argument(
        "--local", action="store_true", help="check against the local GPUs' free memory now (NVML)"
    )
    sp.add_argument(
        "--fake-gpus",
        metavar="FILE",
        help="a fake-GPU scenario as the local GPUs instead of NVML (implies --local)",
    )
    lo, hi = MARGIN_MIB_RANGE
    sp.add_argument(
        "--margin-mib",
        type=bounded_int(lo, hi, " MiB"),
        default=1024,
        help=f"safety margin kept free per GPU ({lo:,} to {hi:,} MiB; default 1024)",
    )
    sp.add_argument(
        "--no-calibration",
        action="store_true",
        help="leave out the saved calibrations of the --gpu / --local / --prometheus GPUs",
    )
    sp.add_argument("--json", action="store_true", help="machine-readable output")


def target_from_args(args: argparse.Namespace) -> GpuTarget | None:
    """The target the flags name: --gpu, or the local GPUs (--local; --fake-gpus implies it: the scenario
    stands for this machine's GPUs, as in ``gpumem gpus --fake-gpus``); both at once is an input error."""
    local = args.local or args.fake_gpus is not None
    if local and args.gpu:
        flag = "--local" if args.local else "--fake-gpus"
        raise GpumemInputError(f"--gpu names the GPUs to check against; leave out {flag}", field="gpu")
    if local and getattr(args, "prometheus", None) is not None:
        raise GpumemInputError(
            "--prometheus reads a cluster; leave out --local and --fake-gpus", field="local"
        )
    if local:
        return _local_target(args.fake_gpus)
    return gpu_target_from_text(args.gpu) if args.gpu else None


def add_task_flags(sp: argparse.ArgumentParser) -> None:
    """An encoder's task head (BERT, RoBERTa), which decides its head's parameters and activations: one flag
    per :class:`TaskHead` field (``--task``, ``--num-labels``), as the window's encoder form is built."""
    for f in run_fields(TaskHead):
        kw: dict[str, Any] = {"help": f"{f.ui.help} (default: the config's)"}
        if f.values:
            kw["choices"] = list(f.values)
        else:  # a count: argparse's message names the flag and the range
            lo = int(f.lo or 0) + (1 if f.lo_open else 0)
            kw.update(type=bounded_int(lo, int(f.hi or lo)), metavar="N")
        sp.add_argument(f.flag, dest=f.name, **kw)


def add_inspect_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    add_task_flags(sp)


def with_task(m: LoadedModel, args: argparse.Namespace | None) -> LoadedModel:
    """``m`` with the task head ``--task`` / ``--num-labels`` name (spec/encoder.py with_head), its parameter
    counts recounted; unchanged without those flags."""
    fields = {f.name: getattr(args, f.name, None) for f in run_fields(TaskHead)}
    return m.with_task(make_task_head(**fields))


def encoder_line(spec: Any) -> str:
    """inspect's line for an encoder: bidirectional, its vocabulary and its task head."""
    enc = spec.encoder
    labels = f", {enc.num_labels} labels" if enc.head != "masked_lm" else ""
    return f"bidirectional, vocab {spec.vocab_size}; task head {enc.head}{labels} (--task to change)"


def loaded_spec_or_config(model: str, args: argparse.Namespace | None = None) -> Any:
    """The model for a trace: a config of an architecture the readers do not describe is fine (transformers
    builds it); a source without any config.json is not."""
    m = load_model(model, unknown_architecture_ok=True)
    if m.config is None and m.spec is None:
        raise GpumemInputError("no config.json to build the model from", source=model)
    return with_task(m, args)


def loaded_spec(model: str, args: argparse.Namespace | None = None) -> Any:
    m = with_task(load_model(model), args)
    if m.spec is None and m.config is not None and m.weights is not None:
        # weights beside a config the readers cannot model: that config's own one-line reason
        spec_from_config(m.config, name=m.name, source=f"{model} (config.json)")
    if m.spec is None:
        raise GpumemInputError(
            "the architecture is unknown (no config.json); estimates need it", source=model
        )
    return m


def flag_table() -> str:
    """The README's table of run flags (Markdown), one row per field."""
    rows = ["| flag | mode | what | values | default |", "|---|---|---|---|---|"]
    for _name, (f, modes) in _owners().items():
        flags = " ".join(f"`{x}`" for x in (f.flag, *f.ui.aliases))
        if f.kind == "bool":
            flags = f"`{f.flag}` / `{f.negated_flag}`"
        mode = "both" if len(modes) == len(MODES) else modes[0]
        if f.ui.engines:
            mode += f" ({', '.join(f.ui.engines)})"
        what = f.ui.help.replace("|", "/")
        rows.append(f"| {flags} | {mode} | {what} | {f.range_text()} | {f.default_text()} |")
    return "\n".join(rows) + "\n"


def update_readme(path: str) -> bool:
    """Rewrite the table between ``<!-- flags:begin -->`` and ``<!-- flags:end -->`` in ``path``; True when
    it changed."""
    from pathlib import Path

    p = Path(path)
    text = p.read_text(encoding="utf-8")
    begin, end = "<!-- flags:begin -->\n", "<!-- flags:end -->"
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    new = head + begin + "\n" + flag_table() + "\n" + end + tail
    if new != text:
        p.write_text(new, encoding="utf-8")
    return new != text
