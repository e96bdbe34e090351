"""gpumem: will this model, in this setup, fit on my GPUs, and what is eating the memory?

Layers (enforced by import-linter, see ``pyproject.toml``):

* :mod:`gpumem_gui.core`: pure estimation core (stdlib, pydantic, gguf).
* :mod:`gpumem_gui.hardware`: GPU backends (no Qt; only its NVML module imports ``pynvml``).
* :mod:`gpumem_gui.ui`: the Qt window (thin: forms in, core results out).
* :mod:`gpumem_gui.cli` and :mod:`gpumem_gui.app`: entry points and the composition root.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("gpumem")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"


def _hub_client_factory():  # type: ignore[no-untyped-def]
    from gpumem_gui.hub_client import HfHubClient

    return HfHubClient()


def _wire_defaults() -> None:
    # Hub ids given to ``gpumem_gui.core.load_model`` use the real Hub client unless the caller passes one;
    # the core itself never imports huggingface_hub.
    from gpumem_gui.core.readers.loader import set_default_hub_client

    set_default_hub_client(_hub_client_factory)


_wire_defaults()
