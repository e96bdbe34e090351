"""The training run's FSDP fields: which version, and how FSDP2 cuts the model into units and reshards them
after forward; declared once (types, ranges, UI) and listed in
:class:`~gpumem_gui.core.training.run.TrainingRun`. The semantics live in
:mod:`gpumem_gui.core.training.frameworks.fsdp` and :mod:`gpumem_gui.core.training.fsdp2`; a framework's
default in :mod:`gpumem_gui.core.training.profile_table`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field

from gpumem_gui.core.fields import UI

_D = "Sharding details"


def _fsdp_on(v: Mapping[str, Any]) -> bool:
    return v.get("fsdp", "none") != "none"


def _fsdp2(v: Mapping[str, Any]) -> bool:
    return _fsdp_on(v) and v.get("fsdp_version", 2) == 2


FsdpVersion = Annotated[
    Literal[1, 2],
    UI(
        "FSDP version",
        _D,
        "2: fully_shard (per-parameter DTensor shards, torchtitan, torchtune, accelerate fsdp_version 2); "
        "1: FullyShardedDataParallel (one flat parameter per unit, HF Trainer's default)",
        choices=(("FSDP2 (fully_shard)", 2), ("FSDP1 (FullyShardedDataParallel)", 1)),
        shown=_fsdp_on,
    ),
]
ReshardSize = Annotated[
    int | None,
    Field(ge=1, le=4096),
    UI(
        "Reshard to",
        _D,
        "FSDP2 reshard_after_forward = N: after forward a unit's parameters are resharded over N ranks "
        "(e.g. the GPUs of a node) instead of freed; auto: as the strategy says",
        unit=" ranks",
        special="strategy",
        none=0,
        shown=lambda v: v.get("fsdp") == "full_shard" and v.get("fsdp_version", 2) == 2,
    ),
]
# torchtune recipes/full_finetune_distributed.py _setup_model: the config's custom_sharded_layers names the
# modules training.shard_model (torchtune/training/_distributed.py, bd2a0fc) wraps with fully_shard apart
FsdpUnits = Annotated[
    Literal["auto", "layers", "embedding", "embedding+head"],
    UI(
        "FSDP2 units",
        _D,
        "which modules fully_shard makes units: the decoder layers, with the embedding and the head in the "
        "root unit (layers), or the token embedding (embedding) and the output projection too "
        "(embedding+head) as units of their own, gathered only around their own forward and backward "
        "(torchtune custom_sharded_layers: ['tok_embeddings', 'output']; not with a head tied to the "
        "embedding); auto: the framework's default, the layers for every framework (torchtune's recipes "
        "shard apart only what a config names: its Llama 3 / 3.1 / 3.3 full configs name both)",
        choices=(
            ("framework default", "auto"),
            ("decoder layers (embedding, head in the root)", "layers"),
            ("layers + embedding apart", "embedding"),
            ("layers + embedding and head apart", "embedding+head"),
        ),
        shown=_fsdp2,
    ),
]
