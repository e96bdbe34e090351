"""Entry script of the frozen ``gpumem`` CLI (the same as the ``gpumem`` console script)."""

from gpumem_gui.cli import main

raise SystemExit(main())
