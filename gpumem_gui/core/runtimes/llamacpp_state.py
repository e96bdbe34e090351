"""llama.cpp's recurrent-state (RS) buffer as an estimate's component and facts (the bytes themselves:
:func:`.state_pools.llamacpp_state_buffers`)."""

from __future__ import annotations

from gpumem_gui.core.results.estimate import Component
from gpumem_gui.core.runtimes.base import component


def state_component(rs: dict[str, int]) -> Component:
    """llama_memory_recurrent's RS buffer on the GPU (the recurrent layers offloaded, with KV offload)."""
    return component(
        "recurrent_state",
        "recurrent state (RS buffer)",
        rs["gpu_bytes"],
        "max(1, n_seq_max) cells x (n_embd_r + n_embd_s) x 4 B (f32) per recurrent layer on the GPU",
        "llama.cpp src/llama-memory-recurrent.cpp (r_l, s_l); llama-hparams.cpp n_embd_r / n_embd_s; "
        "llama-model.cpp create_memory (llama_memory_hybrid, recurrent types F32)",
        cells=rs["cells"],
        r_bytes=rs["r_bytes"],
        s_bytes=rs["s_bytes"],
        host_bytes=rs["host_bytes"],
    )


def state_facts(rs: dict[str, int]) -> dict[str, int]:
    """The RS buffer as llama.cpp logs it (R and S over all recurrent layers) and its host part."""
    out = {"rs_cells": rs["cells"], "rs_r_bytes": rs["r_bytes"], "rs_s_bytes": rs["s_bytes"]}
    return out | ({"rs_host_bytes": rs["host_bytes"]} if rs["host_bytes"] else {})
