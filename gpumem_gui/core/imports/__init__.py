"""Bring your own command or config: a runtime's launch command or a framework's config file, read as the run
gpumem estimates (pure parsing: ``shlex``, PyYAML, ``tomllib``, ``json``; the runtimes are never imported).

See :mod:`.base` for the protocol a parser implements and :mod:`.registry` for how parsers are found.
"""

from gpumem_gui.core.imports.base import (
    Arg,
    CommandParser,
    FileParser,
    ImportedRun,
    Reading,
    bad,
    program,
    split_options,
    to_bool,
    to_choice,
    to_float,
    to_int,
)
from gpumem_gui.core.imports.registry import (
    command_parsers,
    file_parsers,
    import_command,
    import_file,
    read_config,
    split_command,
)

__all__ = [
    "Arg",
    "CommandParser",
    "FileParser",
    "ImportedRun",
    "Reading",
    "bad",
    "command_parsers",
    "file_parsers",
    "import_command",
    "import_file",
    "program",
    "read_config",
    "split_command",
    "split_options",
    "to_bool",
    "to_choice",
    "to_float",
    "to_int",
]
