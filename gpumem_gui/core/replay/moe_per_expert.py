"""The routed experts as transformers 4.x runs them: one MLP module per expert, looped over in Python, each
projection an ``nn.Linear`` (a bitsandbytes ``Linear4bit`` under a 4-bit ``BitsAndBytesConfig``, with PEFT's
LoRA around it where the targets name it). Run field ``qlora_experts`` ``4bit-linear``.

* Block (transformers v4.57 ``models/mixtral/modeling_mixtral.py`` ``MixtralSparseMoeBlock.forward``; the
  same loop in ``qwen2_moe`` / ``qwen3_moe`` ``*SparseMoeBlock`` and ``deepseek_v2`` ``DeepseekV2Moe.moe``):
  ``final_hidden_states = torch.zeros(t, h)`` in the hidden dtype; ``expert_mask = F.one_hot(
  selected_experts, num_classes=E).permute(2, 1, 0)`` (int64, t x k x E, alive through the loop); for each
  expert hit: ``idx, top_x = torch.where(expert_mask[expert_idx].squeeze(0))`` (two int64 index tensors),
  ``current_state = hidden_states[None, top_x].reshape(-1, h)`` (a gathered copy; IndexBackward keeps the
  index), ``expert_layer(current_state) * routing_weights[top_x, idx, None]`` (a gathered copy of the
  weights; the product saves both factors) and ``final_hidden_states.index_add_(0, top_x, ...)`` (in place;
  its backward gathers the gradient by the kept index).
* Each expert's projections (``w1`` / ``w3`` / ``w2``, or ``gate_proj`` / ``up_proj`` / ``down_proj``:
  :attr:`ArchTraits.peft_expert_targets`) are ``Linear4bit`` on a 4-bit base (transformers v4.57
  ``integrations/bitsandbytes.py`` ``_replace_with_bnb_linear`` replaces every ``nn.Linear`` not skipped):
  :func:`.adapters.linear4bit` (``MatMul4Bit``): one expert's weight dequantized per call, freed after the
  matmul, dequantized again in backward -- no layer-sized copy is kept, unlike the fused 4-bit stacks of
  :mod:`.moe_lora`.
* LoRA (PEFT on transformers 4: the experts are plain ``nn.Linear`` modules, so ``all-linear`` or a target
  naming ``w1`` / ``gate_proj`` adapts that projection of every expert, ``peft/tuners/lora/layer.py``
  ``Linear``): ``lora_A`` [r, in] and ``lora_B`` [out, r] per expert projection, run as
  :func:`.adapters.lora`.
* Tokens are spread evenly over the experts (``t * k`` rows; every expert is hit when there are at least as
  many rows as experts): the routing is data-dependent, an even spread is the neutral assumption.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import adapters
from gpumem_gui.core.replay.ffn import act, gated
from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.moe_lora import projections

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def _linear(m: CausalLM, x: T, stack: str, e: int, proj: str, n_out: int, n_in: int) -> T:
    """Expert ``e``'s projection ``proj``: ``Linear4bit`` where the stack is 4-bit, else ``nn.Linear`` on
    its slice of the (frozen) stack; PEFT's LoRA around it where it is adapted."""
    if stack in m.quantized:
        result = adapters.linear4bit(m, x, None, n_out, n_in)
    else:
        result = m.o.linear(x, m.param(stack), None, n_out, n_in)
    name = f"{stack.rsplit('.', 1)[0]}.{e}.{proj}"
    if f"{name}.lora_A" not in m.p:
        return result
    return adapters.lora(m, x, result, name, n_out, n_in)


def _expert(m: CausalLM, pre: str, e: int, x: T) -> T:
    """``MixtralBlockSparseTop2MLP.forward``: ``w2(act_fn(w1(x)) * w3(x))`` (Qwen / DeepSeek: ``down_proj(
    act_fn(gate_proj(x)) * up_proj(x))``); a plain MLP: ``down(act(up(x)))``."""
    spec = m.spec
    moe_spec = spec.moe
    assert moe_spec is not None
    h, fe = spec.hidden_size, moe_spec.expert_intermediate_size
    up_stack, down_stack = f"{pre}.experts.gate_up_proj", f"{pre}.experts.down_proj"
    ups = projections(m, up_stack)
    if len(ups) == 2 and m.cfg.compile:  # a compiled layer fuses act(gate) * up (ffn.gated)
        g = _linear(m, x, up_stack, e, ups[0], fe, h)
        prod = gated(m, g, _linear(m, x, up_stack, e, ups[1], fe, h))
    elif len(ups) == 2:  # eager: the gate's activation runs before the up projection
        prod = m.o.mul(
            act(m, _linear(m, x, up_stack, e, ups[0], fe, h)), _linear(m, x, up_stack, e, ups[1], fe, h)
        )
    else:
        prod = act(m, _linear(m, x, up_stack, e, ups[0], fe, h))
    out = _linear(m, prod, down_stack, e, projections(m, down_stack)[0], h, fe)
    del prod
    return out


def experts(m: CausalLM, pre: str, x: T, routing_weights: T) -> T:
    """The loop of ``MixtralSparseMoeBlock.forward`` over the experts hit (see the module docstring)."""
    o, s, spec = m.o, m.s, m.spec
    moe_spec = spec.moe
    assert moe_spec is not None
    t, h, e_n = m.cfg.tokens, spec.hidden_size, moe_spec.num_experts
    n_s = t * moe_spec.experts_per_token
    final = s.new(t * h, x.dt)  # torch.zeros((batch * seq, hidden_dim), dtype=hidden_states.dtype)
    expert_mask = s.new(n_s * e_n, "i64")  # F.one_hot(selected_experts, num_classes).permute(2, 1, 0)
    # the loop's locals live until the next iteration rebinds them (the last ones until the block returns)
    held: dict[str, T] = {}
    for e in range(min(e_n, n_s)):
        rows = n_s // e_n + (1 if e < n_s % e_n else 0) if n_s >= e_n else 1
        idx, top_x = s.new(rows, "i64"), s.new(rows, "i64")  # torch.where(expert_mask[expert_idx])
        held.pop("idx", None), held.pop("top_x", None)
        current = s.new(rows * h, x.dt)  # hidden_states[None, top_x].reshape(-1, hidden_dim)
        s.node("copy", (x,), (current,), (top_x,))
        held.pop("current", None)
        y = _expert(m, pre, e, current)
        w_e = s.new(rows, routing_weights.dt)  # routing_weights[top_x, idx, None]
        s.node("copy", (routing_weights,), (w_e,), (top_x, idx))
        weighted = s.cast(o.mul(y, w_e, rows * h), x.dt)  # current_hidden_states (.to(hidden dtype))
        del y, w_e
        held.pop("weighted", None)
        added = T(final.st, final.n, final.dt)  # final_hidden_states.index_add_(0, top_x, ...): in place
        s.node("pass", (final, weighted), (added,), (top_x,))  # (the source's gathered gradient: not counted)
        final = added
        held.update(idx=idx, top_x=top_x, current=current, weighted=weighted)
        del idx, top_x, current, weighted, added
    del expert_mask, held
    return final
