"""What ``gpumem inspect`` shows of a hybrid model's cache: per layer type, the KV bytes one token adds (the
attention layers) and the fixed state one sequence keeps (linear-attention layers: conv + recurrent state),
as transformers allocates them for bf16 activations (:mod:`gpumem_gui.core.spec.state`)."""

from __future__ import annotations

from typing import Any

from gpumem_gui.cli.output import print_table
from gpumem_gui.core import (
    ModelSpec,
    has_state,
    memory_by_layer_type,
    state_bytes_per_sequence,
    state_bytes_per_sequence_per_layer,
    state_parts_per_sequence,
)

MiB = 1 << 20


def state_json(spec: ModelSpec) -> dict[str, Any]:
    """The ``gpumem inspect --json`` keys of the fixed state (0 without linear-attention layers)."""
    conv, rec = state_parts_per_sequence(spec)
    return {
        "state_bytes_per_sequence": state_bytes_per_sequence(spec),
        "state_bytes_per_sequence_per_layer": list(state_bytes_per_sequence_per_layer(spec)),
        "state_per_linear_layer": {"conv_state_bytes": conv, "recurrent_state_bytes": rec},
        "memory_by_layer_type": [
            {
                "layer_type": r.layer_type,
                "layers": r.layers,
                "kv_bytes_per_token": r.kv_bytes_per_token,
                "state_bytes_per_sequence": r.state_bytes_per_sequence,
            }
            for r in memory_by_layer_type(spec)
        ],
    }


def print_state(spec: ModelSpec) -> None:
    """The per-layer-type table, printed only for models that keep a fixed state."""
    if not has_state(spec):
        return
    rows = [
        [r.layer_type, str(r.layers), f"{r.kv_bytes_per_token:,}", f"{r.state_bytes_per_sequence:,}"]
        for r in memory_by_layer_type(spec)
    ]
    total = state_bytes_per_sequence(spec)
    print_table(rows, ["layer type", "layers", "KV B/token", "state B/sequence"], right={1, 2, 3})
    conv, rec = state_parts_per_sequence(spec)
    la = spec.linear_attention
    rec_dt = "bf16" if la is not None and not la.recurrent_state_fp32 else "fp32"
    parts = f"bf16 conv {conv:,} B + {rec_dt} recurrent {rec:,} B" if rec else f"bf16 conv {conv:,} B"
    if la is not None and not la.conv_kernel:  # lightning attention: no conv
        parts = f"{rec_dt} recurrent {rec:,} B"
    print(
        f"fixed state ({parts} per stateful layer): {total:,} bytes per sequence ({total / MiB:.2f} MiB), "
        "whatever its length"
    )
