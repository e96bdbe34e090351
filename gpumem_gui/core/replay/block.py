"""One decoder layer: LlamaDecoderLayer.forward with the architecture's norm placement and parallel blocks,
or Falcon's and BLOOM's own blocks (:mod:`.legacy`); and what tensor parallelism adds around the layers:
sequence parallelism's scatter and gather (``ReplayConfig.sequence_shards``, Megatron-LM's persistent gather
buffer with ``sp_saves_shard``) and a head gathering the full vocabulary (``ReplayConfig.logits_gather``)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from gpumem_gui.core.replay import attention, mlp, registry
from gpumem_gui.core.replay.autograd import Sim
from gpumem_gui.core.replay.memory import DT_BYTES, Storage, T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM

# Megatron-LM's global memory buffer ("mpu"): one all-gather buffer per replay, allocated at first use and
# reused by every sequence-parallel all-gather of the step (megatron/core/parallel_state.py
# GlobalMemoryBuffer.get_tensor)
_GATHER_BUFFERS: WeakKeyDictionary[Sim, Storage] = WeakKeyDictionary()


def sp_scatter(m: CausalLM, x: T) -> T:
    """Sequence parallelism: a row-parallel output (or the embedding's partial sum) reduce-scattered to the
    rank's ``q / sequence_shards`` tokens (Megatron ``reduce_scatter_to_sequence_parallel_region``,
    torchtitan ``RowwiseParallel(output_layouts=Shard(1))``); the full partial result dies with its last
    name. Without sequence parallelism: ``x``."""
    sp = m.cfg.sequence_shards
    if sp == 1:
        return x
    out = m.s.new(-(-x.n // sp), x.dt)
    m.s.node("copy", (x,), (out,))
    return out


def sp_residual(m: CausalLM) -> int:
    """Elements of the residual stream on this rank: every token's, or ``1 / sequence_shards`` of them
    under sequence parallelism (what a pipeline stage receives)."""
    return -(-m.cfg.tokens * m.spec.hidden_size // m.cfg.sequence_shards)


def sp_embedding(m: CausalLM, hidden_states: T, keep: list[T]) -> tuple[T, list[T]]:
    """Sequence parallelism: the embedding's output reduce-scattered (torchtitan
    ``RowwiseParallel(output_layouts=Shard(1))`` on the token embedding, Megatron
    ``LanguageModelEmbedding`` with ``reduce_scatter_embeddings``): the model's forward keeps the shard."""
    if m.cfg.sequence_shards == 1:
        return hidden_states, keep
    out = sp_scatter(m, hidden_states)
    return out, [out]


def gather_logits(m: CausalLM, logits: T) -> T:
    """A column-parallel head whose output is all-gathered over ``logits_gather`` TP ranks into the full
    vocabulary (transformers' ``colwise_gather_output``; DTensor ``Shard(-1)`` -> ``Replicate()``): a new
    tensor, the local shard dying with its last name."""
    g = m.cfg.logits_gather
    if g == 1:
        return logits
    out = m.s.new(logits.n * g, logits.dt)
    m.s.node("copy", (logits,), (out,))
    return out


def sp_gather(m: CausalLM, x: T, full: int) -> T:
    """Sequence parallelism: the ``full``-element input of a column-parallel linear all-gathered from the
    rank's shard. DTensor (torchtitan ``PrepareModuleInput(desired_input_layouts=Replicate())``): a new
    tensor, which the linears save for their weight gradient. Megatron-LM
    (``LinearWithGradAccumulationAndAsyncCommunication``): the shard is saved and the gather lands in the
    one persistent buffer, gathered again in backward. Without sequence parallelism: ``x``."""
    if m.cfg.sequence_shards == 1:
        return x
    s = m.s
    if not m.cfg.sp_saves_shard:
        out = s.new(full, x.dt)
        s.node("copy", (x,), (out,))
        return out
    nbytes = round(full * DT_BYTES[x.dt])
    buf = _GATHER_BUFFERS.get(s)
    if buf is None or buf.nbytes < nbytes:
        buf = _GATHER_BUFFERS[s] = s.storage(nbytes, "sequence-parallel buffer", "act")
    out = T(buf, full, x.dt)
    s.node("copy", (x,), (out,), (x,))
    return out


def decoder_layer(
    m: CausalLM, i: int, hidden_states: T, cos: T | None, sin: T | None, mask: T | None, *_: object
) -> tuple[T, T | None]:
    """LlamaDecoderLayer.forward, with the norm placement of the architecture (pre, post, sandwich) and
    parallel attention + MLP (GPT-NeoX); Falcon's and BLOOM's own blocks (:mod:`.legacy`). Returns the
    output and the attention weights (eager)."""
    o, s, spec = m.o, m.s, m.spec
    # an architecture's own layer (registry.BLOCKS: Falcon's and BLOOM's in legacy.py, MiniMax's in
    # lightning.py, NemotronHBlock in mamba2.py, FalconH1DecoderLayer in falcon_h1.py)
    own = registry.block(m)
    if own is not None:
        return own(m, i, hidden_states, cos, sin, mask)
    placement = spec.traits.norm_placement
    full = m.cfg.tokens * spec.hidden_size  # the residual stream of every token (inside the TP regions)
    residual = hidden_states
    s.tr.where = f"layer {i} attention"
    if placement != "post":
        hidden_states = m.region_norm(hidden_states, f"layers.{i}.norm0")
    if spec.parallel_attn_mlp:
        # GPTNeoXLayer / FalconDecoderLayer: the MLP reads the residual input through its own norm when
        # the layer has one (post_attention_layernorm, ln_mlp), else the attention's normed input
        attn, _weights = attention.attention(m, i, hidden_states, cos, sin, mask)
        s.tr.where = f"layer {i} MLP"
        if spec.norms_per_layer > 1:
            del hidden_states
            hidden_states = m.region_norm(residual, f"layers.{i}.norm1")
        mlp_out = mlp.mlp(m, i, hidden_states)
        del hidden_states
        s.region = "hidden_states"
        return o.add(o.add(residual, attn), mlp_out), _weights
    mix = registry.mixer(m, i)  # self-attention, or the layer kind's recurrent mixer (registry.MIXERS)
    hidden_states, _weights = mix(m, i, sp_gather(m, hidden_states, full), cos, sin, mask)
    hidden_states = sp_scatter(m, hidden_states)
    n = 1 if placement == "sandwich" else 0
    if placement != "pre":
        hidden_states = m.region_norm(hidden_states, f"layers.{i}.norm{n}")
    s.region = "hidden_states"
    _attn_output = hidden_states if spec.traits.attn_output_kept else None  # held to the layer's end
    if spec.traits.residual_scaled:  # GraniteMoeHybridDecoderLayer: hidden_states * residual_multiplier
        hidden_states = o.mul(hidden_states, None)
    hidden_states = o.add(residual, hidden_states)
    residual = hidden_states
    s.tr.where = f"layer {i} MLP"
    if placement != "post":
        hidden_states = m.region_norm(hidden_states, f"layers.{i}.norm{n + 1}")
    hidden_states = sp_scatter(m, mlp.mlp(m, i, sp_gather(m, hidden_states, full)))
    if placement != "pre":
        hidden_states = m.region_norm(hidden_states, f"layers.{i}.norm{n + 2 if n else 1}")
    s.region = "hidden_states"
    if spec.traits.residual_scaled:
        hidden_states = o.mul(hidden_states, None)
    return o.add(residual, hidden_states), _weights
