"""SGLang's pool configurators behind one protocol, and the one place that picks a model's.

SGLang sizes its KV pools with a configurator chosen by the model (``model_executor/pool_configurator.py``:
the token-to-KV pool of every layer, split into a full and an SWA pool for a hybrid sliding-window model,
with a mamba pool beside it for a hybrid state model; ``DSV4PoolConfigurator`` for DeepSeek-V4's compressed
pools). The estimate (``runtimes/sglang.py``) asks a :class:`PoolConfigurator` for the run it takes, the
stage's KV cells, the pool's size and the stage's KV component; :func:`configurator` picks it from the
model's kinds (spec/kinds.py).
"""

from __future__ import annotations

from typing import Protocol

from gpumem_gui.core.runtimes import sglang_dsv4 as s4
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.runtimes.sglang_defaults import ServerDefaults
from gpumem_gui.core.runtimes.sglang_pool import Pool, StageMemory, size_pool
from gpumem_gui.core.runtimes.sglang_state import StagedState, hybrid_cells
from gpumem_gui.core.runtimes.sglang_swa import Cells, stage_cells
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.state import has_state


class PoolConfigurator(Protocol):
    """What the SGLang estimate asks of the configurator sizing a model's pools."""

    @property
    def swa_source(self) -> str:
        """The configurator splitting the sliding-window layers' pool off (named in the facts)."""
        ...

    def check(self, spec: ModelSpec, run: InferenceRun) -> list[str]:
        """What its path takes (one-line errors) and the defaults it imposes (warnings)."""
        ...

    def server_run(self, spec: ModelSpec, run: InferenceRun) -> InferenceRun:
        """The run with the server defaults its path imposes."""
        ...

    def cells(self, spec: ModelSpec, kv_elem: float, attn_tp: int, layers: range) -> Cells:
        """Per-token bytes of a stage of ``layers`` on one attention-TP rank."""
        ...

    def size_pool(
        self,
        spec: ModelSpec,
        run: InferenceRun,
        capacity: int | None,
        sd: ServerDefaults,
        stages: list[tuple[int, Cells]],
        context_len: int,
        state: StagedState | None,
    ) -> Pool:
        """The pool from each stage's (weights bytes, KV cells) and a hybrid state model's state."""
        ...

    def stage_memory(self, spec: ModelSpec, run: InferenceRun, mem: StageMemory, pool: Pool) -> StageMemory:
        """A stage's memory with its KV component as this configurator's pools allocate it."""
        ...


class _TokenToKV:
    """The token-to-KV pool (``MHATokenToKVPool`` / ``MLATokenToKVPool``; ``SWAKVPool`` for a hybrid
    sliding-window model, ``HybridReqToTokenPool`` beside it for a hybrid state model):
    runtimes/sglang_pool.py, sglang_swa.py and sglang_state.py."""

    swa_source = "HybridSWAPoolConfigurator"

    def check(self, spec: ModelSpec, run: InferenceRun) -> list[str]:
        return []

    def server_run(self, spec: ModelSpec, run: InferenceRun) -> InferenceRun:
        return run

    def cells(self, spec: ModelSpec, kv_elem: float, attn_tp: int, layers: range) -> Cells:
        cell = hybrid_cells if has_state(spec) else stage_cells  # a hybrid's pool holds its attention layers
        return cell(spec, kv_elem, attn_tp, layers)

    def size_pool(
        self,
        spec: ModelSpec,
        run: InferenceRun,
        capacity: int | None,
        sd: ServerDefaults,
        stages: list[tuple[int, Cells]],
        context_len: int,
        state: StagedState | None,
    ) -> Pool:
        return size_pool(run, capacity, sd, stages, context_len, state)

    def stage_memory(self, spec: ModelSpec, run: InferenceRun, mem: StageMemory, pool: Pool) -> StageMemory:
        return mem


class _Dsv4:
    """DeepSeek-V4's compressed pools (``DSV4PoolConfigurator``, ``DeepSeekV4TokenToKVPool``):
    runtimes/sglang_dsv4.py."""

    swa_source = "DSV4PoolConfigurator"

    def check(self, spec: ModelSpec, run: InferenceRun) -> list[str]:
        return s4.check(spec, run)

    def server_run(self, spec: ModelSpec, run: InferenceRun) -> InferenceRun:
        return s4.dsv4_run(run)

    def cells(self, spec: ModelSpec, kv_elem: float, attn_tp: int, layers: range) -> Cells:
        return s4.cells(spec)  # the compressed entries every token adds and the window every layer keeps

    def size_pool(
        self,
        spec: ModelSpec,
        run: InferenceRun,
        capacity: int | None,
        sd: ServerDefaults,
        stages: list[tuple[int, Cells]],
        context_len: int,
        state: StagedState | None,
    ) -> Pool:
        return s4.size_pool(spec, run, capacity, sd, stages[0][0], context_len)  # one stage (s4.check)

    def stage_memory(self, spec: ModelSpec, run: InferenceRun, mem: StageMemory, pool: Pool) -> StageMemory:
        return s4.with_pools(spec, run, mem, pool)


TOKEN_TO_KV, DSV4 = _TokenToKV(), _Dsv4()


def configurator(spec: ModelSpec) -> PoolConfigurator:
    """The configurator of the model's pools: DeepSeek-V4's for a model with compressed attention (the
    ``ModelKinds.compressed`` capability), else the token-to-KV pool's."""
    return DSV4 if model_kinds(spec).compressed is not None else TOKEN_TO_KV
