"""vLLM's paged KV layouts behind one protocol, and the one place that picks a model's.

vLLM sizes its pool from the cache specs the model's layers report (``vllm/v1/worker/gpu_model_runner.py``
``get_kv_cache_spec``), grouped by ``vllm/v1/core/kv_cache_utils.py`` ``get_kv_cache_groups``: one group of
every layer (full attention, MLA), the hybrid allocator's groups sharing one pool of blocks (sliding-window,
chunked-local and state layers: :class:`.vllm_kv.KvLayout`), or DeepSeek-V4's packed groups of five page
sizes (:class:`.vllm_dsv4.Dsv4Layout`). The estimate (``runtimes/vllm.py``) asks a :class:`PagedLayout` what
a pool holds and what a request takes; :func:`layout` picks it from the model's kinds (spec/kinds.py),
:func:`block_run` sets the block size it takes, :func:`check` says what its path refuses.
"""

from __future__ import annotations

from typing import Protocol

from gpumem_gui.core.results.estimate import Component
from gpumem_gui.core.runtimes import state_pools as sp
from gpumem_gui.core.runtimes import vllm_dsv4 as vd
from gpumem_gui.core.runtimes import vllm_kv as vk
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.kinds import Bound, CompressedAttention
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.state import has_state


class PagedLayout(Protocol):
    """The KV groups of one rank as the vLLM estimate asks them: the pool's blocks, what one request takes
    from it, vLLM's start-up check and the profiling run's reserve."""

    @property
    def windows(self) -> tuple[Bound | None, ...]:
        """One entry per attention group: None for every token kept, else its window or chunk."""
        ...

    @property
    def windowed(self) -> bool:
        """Requests take blocks by the groups' own rules (vLLM's hybrid manager), not one page per layer."""
        ...

    @property
    def groups(self) -> int: ...

    @property
    def group_size(self) -> int:
        """Layer tuples sharing each block id."""
        ...

    @property
    def block_bytes(self) -> int:
        """The bytes of one block id (the block stride)."""
        ...

    @property
    def per_token_bytes(self) -> int:
        """The pool's bytes per token of context where the layout has its own figure (0: the engine's)."""
        ...

    def blocks(self, pool: int) -> int:
        """``num_blocks`` of a pool of ``pool`` bytes."""
        ...

    def blocks_per_request(
        self, tokens: int, block_size: int, batched_tokens: int, held: bool = False
    ) -> int:
        """Blocks one request of ``tokens`` tokens takes, summed over the groups: vLLM's bound, or with
        ``held`` what it can hold."""
        ...

    def reported_tokens(self, blocks: int, block_size: int) -> int:
        """vLLM's "GPU KV cache size" of ``blocks`` blocks."""
        ...

    def request_bytes(self, per_request: int) -> int:
        """What vLLM's start-up check needs for one request of ``per_request`` blocks."""
        ...

    def start_refusal(self, pool: int, per_request: int, max_len: int) -> str | None:
        """The warning when vLLM would not start (one ``max_model_len`` request does not fit), else None."""
        ...

    def pool_formula(self, block_size: int) -> str: ...

    def profiled(self, activation: Component) -> Component:
        """The profiled peak with what this layout's attention reserves in the dummy run."""
        ...


def check(spec: ModelSpec, run: InferenceRun) -> list[str]:
    """What the model's layout path takes (one-line errors) and its warnings: DeepSeek-V4's compressed
    attention (runtimes/vllm_dsv4.py); nothing for the others."""
    at = model_kinds(spec).compressed
    return vd.check(at, run) if at is not None else []


def block_run(spec: ModelSpec, run: InferenceRun, kv_elem: float) -> tuple[InferenceRun, dict[str, int]]:
    """The run with the block size the model's layout takes, and the facts of a hybrid state model's pages:
    DeepSeek-V4's backend's own block when --block-size is not given (runtimes/vllm_dsv4.py); a state model's
    attention block raised until one attention page of one layer holds a state page, which is padded to it
    (runtimes/state_pools.py); else the run as is."""
    if model_kinds(spec).compressed is not None:
        run = vd.dsv4_run(run)
    if not has_state(spec):
        return run, {}
    attn_1 = vk.kv_per_token(spec, kv_elem, run.tp, 1)
    page = sp.vllm_state_page(spec, run.tp, run.dt)
    mla = model_kinds(spec).latent is not None
    align = sp.VLLM_MLA_KERNEL_BLOCK_ALIGNMENT if mla else sp.VLLM_KERNEL_BLOCK_ALIGNMENT
    bs = sp.vllm_attention_block_size(page, attn_1, run.block_size, align)
    facts = {
        # on the fullest pipeline stage (vllm/distributed/utils.py get_pp_indices: each stage its layers)
        "attention_layers": vk.fullest_stage_count(spec, run.pp, sp.attention_layer_indices(spec)),
        "state_layers": vk.fullest_stage_count(spec, run.pp, sp.state_layer_indices(spec)),
        "state_page_bytes": page,
        "state_page_padded_bytes": bs * attn_1,
        "attention_block_size": bs,
    }
    return run.model_copy(update={"block_size": bs}), facts


def layout(
    spec: ModelSpec, run: InferenceRun, kv_elem: float, per_tok: int, max_len: int, batched: int
) -> PagedLayout:
    """The rank's KV groups: DeepSeek-V4's packed groups for its compressed layers (runtimes/vllm_dsv4.py);
    vLLM's hybrid allocator when some layers keep a state or slide or attend within chunks (Llama 4),
    else one group of the fullest stage's layers (also with the hybrid manager off, ``--no-hybrid-kv-cache``:
    ``unify_hybrid_kv_cache_specs`` turns the sliding and chunked layers of a mixed model into full-attention
    ones; an all-sliding model stays one group). vLLM turns the manager off for chunked models itself when
    ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE`` is 0 (``VllmConfig.__post_init__``; the default
    up to v0.12, 1 since v0.16) or with EAGLE drafts: model those with ``--no-hybrid-kv-cache``."""
    kinds = model_kinds(spec)
    if kinds.compressed is not None and kinds.of(CompressedAttention):
        return vd.layout(kinds.compressed, run, max_len, batched)
    if has_state(spec):  # state layers: their own groups, pages padded to the raised attention page
        page = run.block_size * vk.kv_per_token(spec, kv_elem, run.tp, 1)
        return vk.state_layout(spec, run.pp, page)
    bounds = set(kinds.bounds().values())
    if any(bounds) and (run.hybrid_kv_cache or len(bounds) == 1):
        return vk.layout(spec, run.pp, run.block_size * vk.kv_per_token(spec, kv_elem, run.tp, 1))
    return vk.KvLayout(windows=(None,), group_size=1, layer_page_bytes=run.block_size * per_tok)
