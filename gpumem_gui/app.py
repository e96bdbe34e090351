"""Composition root of the desktop app (``gpumem-gui``).

The window arrives with the GUI work; until then this entry point says so plainly instead of pretending,
and points to what does work today: the estimation core and the ``gpumem`` CLI.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from gpumem_gui import __version__


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--version" in args:
        print(f"gpumem-gui {__version__}")
        return 0
    print(
        f"gpumem-gui {__version__}: the desktop window is not built yet.\n"
        "What works today is the estimation core and its command line, for example:\n"
        "  .venv/bin/gpumem models\n"
        "  .venv/bin/gpumem inspect meta-llama/Llama-3.1-8B\n"
        "  .venv/bin/gpumem gpus --catalog",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
