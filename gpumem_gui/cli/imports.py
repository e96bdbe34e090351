"""``gpumem estimate/fit --from "COMMAND"`` and ``--from-file FILE``: a runtime's own launch command or a
training framework's config, read as the run (:mod:`gpumem_gui.core.imports`), printed back (``read as:``
lines, then the warnings) before the estimate; run flags given alongside override what was read."""

from __future__ import annotations

import argparse
from typing import Any

from gpumem_gui.cli.flags import MODES, loaded_spec, run_fields_given, run_from_args
from gpumem_gui.core import GpumemInputError, ImportedRun, LoadedModel, import_command, import_file


class _ModeGiven(argparse.Action):
    """``--mode``, remembering that it was given (an import sets the mode unless the user did)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.mode_given = True


def add_import_flags(*parsers: argparse.ArgumentParser) -> None:
    """``--from`` / ``--from-file`` (estimate and fit); the model argument becomes optional with them."""
    for sp in parsers:
        _add(sp)


def _add(sp: argparse.ArgumentParser) -> None:
    for action in sp._actions:
        if action.dest == "model":
            action.nargs = "?"
            action.default = None
            action.help = (action.help or "") + " (optional with --from / --from-file: the one they name)"
        if action.dest == "mode":
            action.__class__ = _ModeGiven
    g = sp.add_argument_group("bring your own command or config")
    g.add_argument(
        "--from",
        dest="from_command",
        metavar="COMMAND",
        help='a launch command, quoted: "vllm serve Qwen/Qwen3-8B -tp 2 --max-model-len 32768", '
        '"python -m vllm.entrypoints.openai.api_server --model ...", "python -m sglang.launch_server ...", '
        '"llama-server -m model.gguf -c 8192 -ngl 99", "OLLAMA_NUM_PARALLEL=4 ollama run llama3.1:8b"',
    )
    g.add_argument(
        "--from-file",
        metavar="FILE",
        help="a training config: torchtune recipe, Axolotl or LLaMA-Factory YAML, DeepSpeed JSON, "
        "accelerate config, Trainer/TRL arguments JSON or YAML, torchtitan TOML",
    )


def imported(args: argparse.Namespace) -> ImportedRun | None:
    """What ``--from`` / ``--from-file`` name, or None."""
    command, path = getattr(args, "from_command", None), getattr(args, "from_file", None)
    if command is not None and path is not None:
        raise GpumemInputError("give --from or --from-file, not both", field="from")
    if command is not None:
        return import_command(command)
    if path is not None:
        return import_file(path)
    return None


def model_and_run(args: argparse.Namespace) -> tuple[LoadedModel, Any, dict[str, Any] | None]:
    """The model, the run and (with an import) the ``imported`` document: the imported run, then every run
    flag given on the command line on top (each override listed)."""
    imp = imported(args)
    if imp is None:
        if not args.model:
            raise GpumemInputError("name a model (or give --from / --from-file)", field="model")
        m = loaded_spec(args.model, args)
        return m, run_from_args(args, m), None
    name = args.model or imp.model
    if not name:
        why = "".join(f" ({w})" for w in imp.no_model)
        raise GpumemInputError(
            f"the {imp.source} names no model{why}: give one (gpumem estimate MODEL ...)", field="model"
        )
    overrides: list[str] = []
    if args.model and imp.model and args.model != imp.model:
        overrides.append(f"model {args.model} (instead of {imp.model})")
    if not getattr(args, "mode_given", False):
        args.mode = imp.mode
    elif args.mode != imp.mode:
        raise GpumemInputError(
            f"--mode {args.mode}, but the {imp.source} describes a {imp.mode} run", field="mode"
        )
    m = loaded_spec(name, args)
    imp = imp.with_model(m.spec, m.checkpoint_quantization)
    base = {k: getattr(imp.run, k) for k in imp.run.model_fields_set}
    for field, value in run_fields_given(args).items():
        if field in base and base[field] != value:
            overrides.append(f"{field} = {value} (instead of {base[field]}, from the command line)")
        elif field not in base:
            overrides.append(f"{field} = {value} (from the command line)")
    run = run_from_args(args, m, base=base)
    doc = {
        "model": imp.model,
        "source": imp.source,
        "read_as": [{"written": w, "read_as": r} for w, r in imp.read_as],
        "warnings": list(imp.warnings),
        "overrides": overrides,
    }
    return m, run, doc


def print_imported(doc: dict[str, Any] | None) -> None:
    """The ``read as:`` lines, the warnings and the overrides, before the estimate."""
    if doc is None:
        return
    model = f", model {doc['model']}" if doc["model"] else ", no model named"
    print(f"read as: {doc['source']}{model}")
    for row in doc["read_as"]:
        print(f"read as: {row['written']} -> {row['read_as']}")
    for w in doc["warnings"]:
        print(f"warning: {w}")
    for o in doc["overrides"]:
        print(f"override: {o}")
    print()


__all__ = ["MODES", "add_import_flags", "model_and_run", "print_imported"]
