"""vLLM V1's hybrid KV-cache allocator: how the pool is shared by full-attention, sliding-window and
chunked-local attention layers.

``vllm/v1/core/kv_cache_utils.py``:

* ``get_kv_cache_groups``: layers of one kind (all full, or all sliding with one window) form one group;
  a model with both kinds goes through ``_get_kv_cache_groups_uniform_page_size``: the layers of each kind
  are dealt into groups of ``group_size`` layers (the smaller kind's layer count, or the larger's when it is
  under 1.5 times the smaller), ``layers[i::n]`` to the ``i``-th of the kind's ``n = ceil(count / size)``
  groups, the last padded.
* ``get_kv_cache_config_from_groups``: ``group_size`` tensors of ``num_blocks`` pages each, tensor ``i``
  shared by the ``i``-th layer of every group; ``num_blocks = available // page // group_size``. One block
  id is thus one page in each of ``group_size`` layers, and the groups draw block ids from one shared pool.
* ``_report_kv_cache_config``: "GPU KV cache size" is ``num_blocks // len(groups) x block_size`` tokens;
  ``get_max_concurrency_for_kv_cache_config``: ``num_blocks`` over the blocks one ``max_model_len``
  request takes summed over the groups.

``vllm/v1/kv_cache_interface.py`` ``max_memory_usage_bytes``: a full-attention group needs
``ceil(max_model_len / block)`` blocks per request, a sliding-window group
``ceil(min(window - 1 + max_num_batched_tokens, max_model_len) / block) + 1`` (the window may start inside
a block); ``single_type_kv_cache_manager.py`` ``SlidingWindowManager`` frees the blocks that fall out of the
window. A chunked-local group (Llama 4, ``ChunkedLocalAttentionSpec``) needs
``ceil(min(chunk + max_num_batched_tokens, max_model_len) / block)`` (a chunk starts on a block boundary;
``ChunkedLocalAttentionManager`` frees the blocks before the current chunk). With pipeline stages the
groups are formed over the whole model and projected on each stage (``_project_kv_cache_groups_to_worker``);
every stage takes the smallest ``num_blocks``.

A hybrid state model (:func:`state_layout`): the state layers (``MambaSpec``, their page padded to the
attention page, ``mamba_page_size_padded``) are a second kind of layers grouped by the same rule; a state
group takes one block per request (``MambaSpec.max_memory_usage_bytes``: one page), which vLLM counts in
the groups of "GPU KV cache size" and in the blocks of "Maximum concurrency".
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from gpumem_gui.core.results.estimate import Component
from gpumem_gui.core.runtimes.state_pools import attention_layer_indices, state_layer_indices
from gpumem_gui.core.spec.kinds import Bound, LatentAttention
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.parallel import Remainder, stage_layers

# vLLM's uneven pipeline split: the layers left over go to the stages before the last (vllm/distributed/
# utils.py get_pp_indices: partitions[-i] += 1 for i in 2 .. remainder + 1)
VLLM_REMAINDER: Remainder = "before_last"
# kv_cache_utils.py _get_kv_cache_groups_uniform_page_size: the larger kind's layer count is the group size
# when it is under this multiple of the smaller's (fewer padding layers)
GROUP_SIZE_SLACK = 1.5


def kv_per_token(spec: ModelSpec, kv_elem: float, tp: int, layers: int | None = None) -> int:
    """KV bytes one token costs over ``layers`` layers (default: all) on one TP rank (K and V, KV heads
    split, at least one; MLA layers store the latent and its rope part, replicated, DSA layers their
    indexer's keys too: spec/kinds.py LatentAttention.vllm_bytes)."""
    n = spec.num_layers if layers is None else layers
    mla = model_kinds(spec).of(LatentAttention)
    if mla:  # a stage of n layers: its share of the layers with and without an indexer (none differ on a
        # published checkpoint: GLM-5 and DeepSeek-V3.2 index every layer)
        total = sum(len(k.layers) for k in mla)
        return round(n * sum(len(k.layers) * k.vllm_bytes(kv_elem) for k in mla) / total)
    kvh = max(1, spec.num_kv_heads // tp)
    return round(n * 2 * kvh * spec.head_dim * kv_elem)


@dataclass(frozen=True)
class KvLayout:
    """The KV groups of one rank: the pool's shape and what one request takes from it (a
    :class:`.vllm_layout.PagedLayout`)."""

    windows: tuple[Bound | None, ...]  # one per group: None for full attention, else its window or chunk
    group_size: int  # layers of the rank per group (tensors sharing each block id)
    layer_page_bytes: int  # one page (block_size tokens) of one layer on the rank
    state_groups: int = 0  # groups of state layers (MambaSpec): one page per request each
    per_token_bytes: int = 0  # 0: the engine's per-token figure (a DeepSeek-V4 layout has its own)

    @property
    def hybrid(self) -> bool:
        return self.groups > 1

    @property
    def groups(self) -> int:
        """KV groups of attention layers and of state layers."""
        return len(self.windows) + self.state_groups

    @property
    def windowed(self) -> bool:
        """Some group slides or keeps a state: requests take blocks by the groups' own rules (vLLM's hybrid
        manager)."""
        return any(w is not None for w in self.windows) or self.state_groups > 0

    @property
    def block_bytes(self) -> int:
        """Bytes one block id holds: one page in each of the ``group_size`` tensors."""
        return self.layer_page_bytes * self.group_size

    def blocks(self, pool: int) -> int:
        """``num_blocks`` of a pool of ``pool`` bytes."""
        return pool // self.block_bytes if self.block_bytes else 0

    def reported_tokens(self, blocks: int, block_size: int) -> int:
        """vLLM's "GPU KV cache size": the blocks split evenly over the groups, in tokens."""
        return blocks // self.groups * block_size

    def blocks_per_request(
        self, tokens: int, block_size: int, batched_tokens: int, held: bool = False
    ) -> int:
        """Blocks one request of ``tokens`` tokens takes at most, summed over the groups: vLLM's own bound
        (``max_memory_usage_bytes``, what it logs and admits against), or with ``held`` the blocks such a
        request can actually hold (a sliding group never more than the request's own pages)."""
        full = ceil(tokens / block_size)

        def group(b: Bound | None) -> int:
            if b is None:
                return full
            kind, w = b
            if kind == "chunked":  # ChunkedLocalAttentionSpec.max_memory_usage_bytes
                bound = ceil(min(w + batched_tokens, tokens) / block_size)
            else:  # SlidingWindowSpec.max_memory_usage_bytes
                bound = ceil(min(w - 1 + batched_tokens, tokens) / block_size) + 1
            return min(full, bound) if held else bound

        return sum(group(w) for w in self.windows) + self.state_groups  # MambaSpec: one page per request

    def request_bytes(self, per_request: int) -> int:
        """What vLLM's start-up check needs for one ``max_model_len`` request of ``per_request`` blocks."""
        return per_request * self.block_bytes

    def start_refusal(self, pool: int, per_request: int, max_len: int) -> str | None:
        """The warning when vLLM would not start: one ``max_model_len`` request does not fit the pool."""
        blocks = self.blocks(pool)
        if blocks >= per_request:
            return None
        return (
            f"max_model_len: vLLM would refuse to start: the KV pool holds {blocks} blocks, fewer than the "
            f"{per_request} one request of max_model_len {max_len} takes over its {self.groups} KV groups"
        )

    def pool_formula(self, block_size: int) -> str:
        return (
            f"in whole blocks of {block_size} tokens x {self.group_size} layers (one page per layer of a KV "
            f"group; {self.groups} groups share the blocks)"
        )

    def profiled(self, activation: Component) -> Component:
        """The profiled peak as the profiling run measures it: these layouts reserve nothing in it."""
        return activation


def kv_stage_layers(spec: ModelSpec, pp: int) -> int:
    """Layers of the fullest pipeline stage holding a KV cache of their own: a layer reading an earlier
    layer's keys and values holds none (vLLM ``gpu_model_runner.get_kv_cache_spec`` skips an attention layer
    with ``kv_sharing_target_layer_name``, which ``models/gemma3n.py`` sets on Gemma 3n's last
    ``num_kv_shared_layers``)."""
    cached = model_kinds(spec).bounds()
    if len(cached) == spec.num_layers:  # every layer caches: the fullest stage's layer count
        return ceil(spec.num_layers / pp)
    return max(sum(1 for i in r if i in cached) for r in _stages(spec, pp))


def _stages(spec: ModelSpec, pp: int) -> list[range]:
    return [stage_layers(spec, pp, s, VLLM_REMAINDER) for s in range(pp)]


def fullest_stage_count(spec: ModelSpec, pp: int, layers: tuple[int, ...]) -> int:
    """How many of ``layers`` the pipeline stage holding most of them has (all of them at pp 1)."""
    return max(sum(1 for i in layers if i in r) for r in _stages(spec, pp))


def _groups(spec: ModelSpec) -> list[tuple[Bound | None, tuple[int, ...]]]:
    """(window / chunk or None, layer indices) of every group of the whole model, in vLLM's order (kinds by
    first appearance, ``layers[i::n]`` within a kind)."""
    kinds: dict[Bound | None, list[int]] = {}
    for i, b in model_kinds(spec).bounds().items():  # layers sharing another's KV hold none (Gemma 3n)
        kinds.setdefault(b, []).append(i)
    if len(kinds) == 1:
        ((w, layers),) = kinds.items()
        return [(w, tuple(layers))]
    size = _group_size([len(v) for v in kinds.values()])
    out: list[tuple[Bound | None, tuple[int, ...]]] = []
    for w, layers in kinds.items():
        n = ceil(len(layers) / size)
        out += [(w, tuple(layers[i::n])) for i in range(n)]
    return out


def _group_size(counts: list[int]) -> int:
    """Layers per group when kinds of ``counts`` layers share the pool: the larger count when under
    ``GROUP_SIZE_SLACK`` times the smaller, else the smaller (fewer padding layers)."""
    return max(counts) if max(counts) < min(counts) * GROUP_SIZE_SLACK else min(counts)


def state_layout(spec: ModelSpec, pp: int, layer_page_bytes: int) -> KvLayout:
    """A hybrid state model: its full-attention layers and its state layers (one ``MambaSpec``, its page
    padded to the attention page) form two kinds of groups of one group size over the whole model
    (``_get_kv_cache_groups_uniform_page_size``, ``layers[i::n]``); with pipeline stages the groups are
    projected on each stage (``_project_kv_cache_groups_to_worker``: every stage keeps every group, some of
    them emptier) and a stage's tensors are its fullest group's layers (``get_kv_cache_config_from_groups``);
    the rank returned is the fullest stage's (the fewest blocks: every stage takes the smallest
    ``num_blocks``)."""
    attention, state = attention_layer_indices(spec), state_layer_indices(spec)
    size = _group_size([len(attention), len(state)])
    n_attn, n_state = ceil(len(attention) / size), ceil(len(state) / size)
    groups = [attention[i::n_attn] for i in range(n_attn)] + [state[i::n_state] for i in range(n_state)]
    tensors = max(max(sum(1 for i in g if i in r) for g in groups) for r in _stages(spec, pp))
    return KvLayout(
        windows=(None,) * n_attn, group_size=tensors, layer_page_bytes=layer_page_bytes, state_groups=n_state
    )


def layout(spec: ModelSpec, pp: int, layer_page_bytes: int) -> KvLayout:
    """The groups of the rank whose stage has the fullest group (the fewest blocks; every stage takes the
    smallest ``num_blocks``)."""
    groups = _groups(spec)
    if len(groups) == 1:  # one kind: one group of the stage's layers (the fullest stage)
        size = kv_stage_layers(spec, pp)
    else:
        size = max(max(sum(1 for i in layers if i in r) for _, layers in groups) for r in _stages(spec, pp))
    return KvLayout(windows=tuple(w for w, _ in groups), group_size=size, layer_page_bytes=layer_page_bytes)
