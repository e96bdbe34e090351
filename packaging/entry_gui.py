"""Entry script of the frozen ``gpumem-gui`` (the same as the ``gpumem-gui`` console script)."""

from gpumem_gui.app import main

raise SystemExit(main())
