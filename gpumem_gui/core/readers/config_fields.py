"""Typed access to a ``config.json`` dict (errors name the file and the field), and the pieces every reader
of a Llama-style config shares: the common fields and the sliding-window layouts."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.spec.model import MAX_LAYERS, MAX_SIZE

Config = Mapping[str, Any]
_MISSING = object()
_LAYER_FIELDS = {"num_hidden_layers", "n_layer", "max_window_layers", "first_k_dense_replace"}


class ConfigReader:
    """Typed access to one config dict with errors that name the file and the field."""

    def __init__(self, cfg: Config, source: str) -> None:
        self.cfg = cfg
        self.source = source

    def get(self, *names: str, default: Any = _MISSING) -> Any:
        for n in names:
            if n in self.cfg and self.cfg[n] is not None:
                return self.cfg[n]
        if default is _MISSING:
            raise GpumemInputError("required field is missing", source=self.source, field=names[0])
        return default

    def int(self, *names: str, default: Any = _MISSING, minimum: int = 1) -> int:
        v = self.get(*names, default=default)
        if v is None:
            return v
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or v != v
            or v in (float("inf"), float("-inf"))
        ):
            raise GpumemInputError(f"must be an integer, got {short(v)}", source=self.source, field=names[0])
        if int(v) != v:
            raise GpumemInputError(f"must be an integer, got {short(v)}", source=self.source, field=names[0])
        if v < minimum:
            raise GpumemInputError(
                f"must be >= {minimum}, got {short(v)}", source=self.source, field=names[0]
            )
        maximum = MAX_LAYERS if names[0] in _LAYER_FIELDS else MAX_SIZE
        if v > maximum:
            raise GpumemInputError(
                f"must be <= {maximum}, got {short(v)}", source=self.source, field=names[0]
            )
        return int(v)

    def opt_int(self, *names: str, minimum: int = 1) -> int | None:
        return self.int(*names, default=None, minimum=minimum)

    def window(self, class_default: int | None) -> int | None:
        """``sliding_window``: an explicit null disables it; an absent key takes the config class default."""
        if "sliding_window" not in self.cfg:
            return class_default
        return self.opt_int("sliding_window")

    def bool(self, *names: str, default: Any = _MISSING) -> bool:
        v = self.get(*names, default=default)
        if not isinstance(v, bool):
            raise GpumemInputError(
                f"must be true or false, got {short(v)}", source=self.source, field=names[0]
            )
        return v

    def head_dim(self, hidden: int, heads: int) -> int:
        hd = self.opt_int("head_dim")
        if hd is not None:
            return hd
        if hidden % heads:
            raise GpumemInputError(
                f"hidden_size ({hidden}) is not divisible by num_attention_heads ({heads}) and no head_dim "
                "is given",
                source=self.source,
                field="num_attention_heads",
            )
        return hidden // heads


def positive_number(v: Any, source: str, field: str) -> float:
    """A config's positive finite number (a soft-capping value) as a float: an integer too large for a float
    (10**400; float() raises OverflowError), inf, nan, zero and negatives are errors naming the field."""
    try:
        ok = not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(f := float(v)) and f > 0
    except OverflowError:
        ok = False
    if not ok:
        raise GpumemInputError(f"must be a positive number, got {short(v)}", source=source, field=field)
    return f


def layer_types_explicit(r: ConfigReader, n_layers: int) -> tuple[str, ...] | None:
    lt = r.get("layer_types", default=None)
    if lt is None:
        return None
    if not isinstance(lt, list) or len(lt) != n_layers:
        raise GpumemInputError(
            f"must list one type per layer ({n_layers})", source=r.source, field="layer_types"
        )
    allowed = {"full_attention", "sliding_attention"}
    bad = sorted({str(t) for t in lt} - allowed)
    if bad:
        raise GpumemInputError(
            f"unsupported layer type(s) {bad}; supported: {sorted(allowed)}",
            source=r.source,
            field="layer_types",
        )
    return tuple(lt)


def uniform_sliding(
    r: ConfigReader, n_layers: int, class_default: int | None = None
) -> tuple[tuple[str, ...], int | None]:
    """Mistral / Phi-3 / Starcoder2: every layer slides when ``sliding_window`` is set."""
    explicit = layer_types_explicit(r, n_layers)
    window = r.window(class_default)
    if explicit is not None:
        return explicit, window
    if window is None:
        return (), None
    return ("sliding_attention",) * n_layers, window


def qwen_sliding(r: ConfigReader, n_layers: int) -> tuple[tuple[str, ...], int | None]:
    """Qwen2/Qwen3: sliding only with ``use_sliding_window``, from layer ``max_window_layers`` on."""
    explicit = layer_types_explicit(r, n_layers)
    use = r.bool("use_sliding_window", default=False)
    window = r.opt_int("sliding_window") if use else None
    if explicit is not None:
        return explicit, window if "sliding_attention" in explicit else None
    if window is None:
        return (), None
    first = r.int("max_window_layers", default=n_layers, minimum=0)
    types = tuple("sliding_attention" if i >= first else "full_attention" for i in range(n_layers))
    return (types if "sliding_attention" in types else ()), (window if "sliding_attention" in types else None)


def pattern_sliding(
    r: ConfigReader, n_layers: int, default_pattern: int
) -> tuple[tuple[str, ...], int | None]:
    """Gemma-2 (every other layer) and Gemma-3 (5 sliding : 1 global): layer i is full when (i+1) % p == 0.

    Gemma2Config and Gemma3TextConfig default ``sliding_window`` to 4096.
    """
    explicit = layer_types_explicit(r, n_layers)
    window = r.window(4096)
    if explicit is not None:
        return explicit, window
    if window is None:
        return (), None
    p = r.int("sliding_window_pattern", "_sliding_window_pattern", default=default_pattern)
    return tuple("sliding_attention" if (i + 1) % p else "full_attention" for i in range(n_layers)), window


def common(r: ConfigReader, name: str, model_type: str, **over: Any) -> dict[str, Any]:
    """Fields shared by the Llama-style families (hidden_size, num_hidden_layers, ...)."""
    h = r.int("hidden_size")
    a = r.int("num_attention_heads")
    n_layers = r.int("num_hidden_layers")
    fields: dict[str, Any] = dict(
        name=name,
        model_type=model_type,
        hidden_size=h,
        num_layers=n_layers,
        num_attention_heads=a,
        num_kv_heads=r.int("num_key_value_heads", default=a),
        head_dim=r.head_dim(h, a),
        intermediate_size=r.int("intermediate_size"),
        vocab_size=r.int("vocab_size"),
        max_position_embeddings=r.int("max_position_embeddings", default=2048),
        activation=str(r.get("hidden_act", "hidden_activation", default="silu")),
    )
    fields.update(over)
    return fields


def rotary_factor(r: ConfigReader, default: float) -> float:
    """``partial_rotary_factor``: from ``rope_parameters`` (transformers 5 files), else the top level (4.x
    files; ``PreTrainedConfig`` moves it into rope_parameters), else the config class's default."""
    rp = r.get("rope_parameters", default={})
    if not isinstance(rp, Mapping):
        raise GpumemInputError("must be an object", source=r.source, field="rope_parameters")
    v = rp.get("partial_rotary_factor", r.get("partial_rotary_factor", default=default))
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
        raise GpumemInputError(
            f"must be a number in (0, 1], got {short(v)}", source=r.source, field="partial_rotary_factor"
        )
    return float(v)
