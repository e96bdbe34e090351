"""``python -m gpumem_gui`` runs the command-line interface."""

from gpumem_gui.cli import main

raise SystemExit(main())
