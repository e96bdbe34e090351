"""NVML's errors mapped to states, for the NVML backend (:mod:`gpumem_gui.hardware.nvml`).

:class:`NvmlCalls` wraps the NVML module that :class:`~gpumem_gui.hardware.nvml.NvmlBackend` was given or
imported (``pynvml``, or a stand-in in tests); this module never imports ``pynvml`` itself. It classifies
NVML's exceptions (an NVML error at all, its return code, "not supported"), words them, and calls optional
getters that give ``None`` when the binding, the driver or the GPU does not have them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpumem_gui.hardware.backend import InitFailure, init_failure_reason

# NVML return codes (nvml.h; stable ABI). Read from the module when it has them.
DEFAULT_CODES = {
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "NOT_FOUND": 6,
    "DRIVER_NOT_LOADED": 9,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "GPU_IS_LOST": 15,
    "LIB_RM_VERSION_MISMATCH": 18,
    "ARGUMENT_VERSION_MISMATCH": 25,
    "INVALID_ARGUMENT": 2,
}

_INIT_FAILURES = {
    "LIBRARY_NOT_FOUND": InitFailure.LIBRARY_NOT_FOUND,
    "DRIVER_NOT_LOADED": InitFailure.DRIVER_NOT_LOADED,
    "LIB_RM_VERSION_MISMATCH": InitFailure.LIB_RM_VERSION_MISMATCH,
    "NO_PERMISSION": InitFailure.NO_PERMISSION,
}


def text(value: Any) -> str:
    """NVML strings arrive as ``str`` (most calls) or ``bytes`` (struct fields such as ``busId``)."""
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value)


def cuda_version_text(v: int) -> str:
    """NVML's CUDA driver version ``12040`` is ``"12.4"``."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def describe(e: BaseException) -> str:
    """An exception's message, or its class name when it has none (or cannot be printed)."""
    try:
        message = str(e)
    except Exception:
        message = ""
    return message or type(e).__name__


class NvmlCalls:
    """The NVML module and its return codes (the module's own values where it defines them)."""

    def __init__(self, nv: Any) -> None:
        self.nv = nv
        self.codes: dict[str, int] = {
            key: int(getattr(nv, f"NVML_ERROR_{key}", default)) for key, default in DEFAULT_CODES.items()
        }

    # ---- error classification ----------------------------------------------------------------------------

    def is_nvml_error(self, e: BaseException) -> bool:
        base = getattr(self.nv, "NVMLError", None)
        mismatch = getattr(self.nv, "NVMLLibraryMismatchError", None)
        return any(isinstance(cls, type) and isinstance(e, cls) for cls in (base, mismatch))

    def code(self, e: BaseException) -> int | None:
        """The NVML return code of ``e``; None for a non-NVML error or one without a code."""
        if not self.is_nvml_error(e):
            return None
        value = getattr(e, "value", None)
        return value if isinstance(value, int) else None

    def is_code(self, e: BaseException, *keys: str) -> bool:
        """Whether ``e`` carries one of these return codes (names as in :data:`DEFAULT_CODES`)."""
        return self.code(e) in tuple(self.codes[key] for key in keys)

    def is_unsupported(self, e: BaseException) -> bool:
        """NotSupported / FunctionNotFound / a binding newer than the driver: the field is unknown."""
        mismatch = getattr(self.nv, "NVMLLibraryMismatchError", None)
        if isinstance(mismatch, type) and isinstance(e, mismatch):
            return True
        return self.is_code(e, "NOT_SUPPORTED", "FUNCTION_NOT_FOUND")

    def init_reason(self, e: Exception) -> str:
        """Why ``nvmlInit`` failed, in the words of :func:`init_failure_reason`."""
        code = self.code(e)
        for key, kind in _INIT_FAILURES.items():
            if code == self.codes[key]:
                return init_failure_reason(kind)
        return init_failure_reason(InitFailure.UNKNOWN, describe(e))

    # ---- calls -------------------------------------------------------------------------------------------

    def fact(self, fn_name: str, convert: Callable[[Any], Any]) -> Any:
        """A driver-wide fact read once at init; any failure makes it unknown."""
        fn = getattr(self.nv, fn_name, None)
        if fn is None:
            return None
        try:
            return convert(fn())
        except Exception:
            return None

    def optional(self, fn_name: str, *args: Any, permission_ok: bool = True) -> Any:
        """Call an NVML getter; None when the binding, the driver or the GPU does not have it."""
        fn = getattr(self.nv, fn_name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except Exception as e:
            if self.is_unsupported(e):
                return None
            if permission_ok and self.is_code(e, "NO_PERMISSION"):
                return None
            raise
