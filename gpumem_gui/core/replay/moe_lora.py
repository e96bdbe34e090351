"""LoRA on transformers 5's fused MoE expert stacks, as PEFT 0.21 resolves and runs it.

* Targets (``peft/utils/transformers_weight_conversion.py`` ``_convert_peft_config_moe``, called by
  ``BaseTuner.inject_adapter`` on transformers >= 5 for the model types of
  :attr:`~gpumem_gui.core.spec.arch_traits.ArchTraits.peft_expert_targets`): ``all-linear`` is resolved to
  the linear modules' names plus the v4 expert names and the router (``_resolve_string_target_modules``);
  every target named (or ending in ``.``) like a v4 expert projection leaves ``target_modules`` and its
  stack joins ``target_parameters`` -- so the dense and shared-expert MLPs' ``gate_proj`` / ``up_proj`` /
  ``down_proj`` linears, named the same, lose their adapters; the router (``gate``) becomes the parameter
  ``gate.weight``. A fused stack fed by two v4 names needs both (else PEFT raises) and gets rank and alpha
  times two (``rank_pattern`` / ``alpha_pattern``).
* Adapters (``peft/tuners/lora/layer.py`` ``ParamWrapper.update_layer``): a stack of E experts stored
  ``(E, out, in)`` gets ``lora_A`` ``[r * E, in]`` and ``lora_B`` ``[out, r * E]`` (nn.Linear weights).
* A 4-bit stack (run field ``qlora_experts``; Axolotl's ``quantize_moe_experts``: bitsandbytes
  ``nn/parametrize.py`` ``Bnb4bitParametrization.forward``) is dequantized whole, without gradients, each
  time the experts read it: the grouped matmul saves that copy for backward, or the merge below reads it.
* Forward (``ParamWrapper._activate_lora`` with one adapter on a 3-D bf16/fp16/fp32 stack:
  ``_LoraFactorsProxy``): the factors are reshaped (``lora_B`` permuted) and cast to the stack's dtype
  (``get_delta_factors``), and ``torch.baddbmm(W, lhs, rhs, alpha=scaling)`` with autocast off makes a
  full-size merged copy of the stack when the experts' forward first reads it (``parametrize.cached``);
  baddbmm saves both factors, the grouped matmul saves the merged stack, so each adapted MoE layer keeps a
  copy of its expert weights until its backward, which makes a full-size gradient of the stack before
  reducing it to the factors' gradients.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.replay.memory import DT_BYTES, T
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import Tensor

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM

# the router as a v4 target name (both patterns of _MOE_TARGET_MODULE_MAPPING map it to ``gate.weight``)
_ROUTER = "gate"


def _mapped(spec: ModelSpec, target: str) -> str | None:
    """The stack a target renames to (``target == old or target.endswith('.' + old)``), None otherwise."""
    for old, stack in spec.traits.peft_expert_targets:
        if target == old or target.endswith(f".{old}"):
            return stack
    return None


def _regex_leaves(
    spec: ModelSpec, tensors: Sequence[Tensor], pattern: str, paths: Sequence[str]
) -> list[str]:
    """``_resolve_string_target_modules`` for a regex: the last names of the module paths it fullmatches,
    and each v4 expert name whose reconstructed path (``<experts module>.<v4 name>``) it fullmatches."""
    regex = re.compile(pattern)
    leaves = {p.rsplit(".", 1)[-1] for p in paths if regex.fullmatch(p)}
    containers = {f"model.{t.name.rsplit('.', 1)[0]}" for t in tensors if _is_stack(t)}
    for old, _ in spec.traits.peft_expert_targets:
        if any(regex.fullmatch(f"{c}.{old}") for c in containers):
            leaves.add(old)
    return sorted(leaves)


def is_stack(name: str, shape: tuple[int, ...]) -> bool:
    """A routed expert stack of transformers 5 (``layers.3.mlp.experts.gate_up_proj``, experts x out x in)."""
    return len(shape) == 3 and ".experts." in name


def _is_stack(t: Tensor) -> bool:
    return is_stack(t.name, t.shape)


def convert_targets(
    spec: ModelSpec,
    tensors: Sequence[Tensor],
    targets: tuple[str, ...],
    linear_names: Sequence[str],
    paths: Sequence[str],
    regex: str | None,
    fused: bool = True,
) -> tuple[tuple[str, ...], frozenset[str]]:
    """(the module targets left, the expert stack tensors adapted) for ``targets`` as PEFT converts them
    (``linear_names``: what ``all-linear`` resolves to; ``paths``: the targetable modules' paths;
    ``regex``: the pattern when ``targets`` is one regex target). ``fused`` False: transformers 4's
    per-expert ``nn.Linear`` modules (replay/moe_per_expert.py), which PEFT adapts by their names without
    converting anything: a name keeps adapting the dense and shared-expert linears called so too."""
    if not spec.traits.peft_expert_targets:
        return targets, frozenset()
    names = list(targets)
    if targets == ("all-linear",):  # _resolve_string_target_modules: the linears + the mapping's keys
        names = [*linear_names, *(old for old, _ in spec.traits.peft_expert_targets), _ROUTER]
        if not any(t.component == "router" for t in tensors):
            names.remove(_ROUTER)
    elif regex is not None:  # a regex becomes the last names it matches
        names = _regex_leaves(spec, tensors, regex, paths) or names
    left: list[str] = []
    hit: dict[str, set[str]] = {}
    for name in names:
        stack = _mapped(spec, name)
        if stack is None or (not fused and name.rsplit(".", 1)[-1] in linear_names):
            left.append(name)
        if stack is not None:
            hit.setdefault(stack, set()).add(name.rsplit(".", 1)[-1])
    for stack, present in hit.items():
        needed = {old for old, s in spec.traits.peft_expert_targets if s == stack}
        if present != needed and not fused:  # per-expert adapters are built for every projection of a stack
            raise GpumemInputError(
                f"{', '.join(sorted(present))} without {', '.join(sorted(needed - present))} on transformers "
                "4's per-expert linears is not modelled (name both)",
                field="lora_targets",
            )
        if present != needed:  # _convert_peft_config_moe: "Cannot convert PEFT target(s) ..."
            raise GpumemInputError(
                f"{', '.join(sorted(present))} without {', '.join(sorted(needed - present))}: transformers 5 "
                f"fuses them into one {stack} expert stack and PEFT adapts both or neither (name both)",
                field="lora_targets",
            )
    stacks = frozenset(t.name for t in tensors if _is_stack(t) and t.name.rsplit(".", 1)[-1] in hit)
    return tuple(dict.fromkeys(left)), stacks


def stack_rank(spec: ModelSpec, name: str, r: int) -> int:
    """PEFT's rank for an adapted stack: ``r`` times the v4 projections fused into it (rank_pattern)."""
    stack = name.rsplit(".", 1)[-1]
    return r * max(1, sum(1 for _, s in spec.traits.peft_expert_targets if s == stack))


def add_stack_lora(m: CausalLM, t: Tensor) -> None:
    """``lora_A`` [r * E, in] and ``lora_B`` [out, r * E] for the (E, out, in) stack ``t``; they train
    (transformers 4's per-expert linears: :func:`add_expert_loras`)."""
    if m.cfg.expert_linears:
        add_expert_loras(m, t)
        return
    experts, n_out, n_in = t.shape
    r = stack_rank(m.spec, t.name, m.cfg.lora_rank) * experts
    dt = m.cfg.adapter_dt
    for nm, shp in ((f"{t.name}.lora_A", (r, n_in)), (f"{t.name}.lora_B", (n_out, r))):
        numel = shp[0] * shp[1]
        m.p[nm] = m.s.param(nm, numel, dt, True, round(numel * DT_BYTES[dt]), t.layer, sharded=False)
        m.shape[nm] = shp


def projections(m: CausalLM, stack: str) -> tuple[str, ...]:
    """The transformers-4 module names the fused stack ``stack`` (``...experts.gate_up_proj``) holds, in the
    order of its rows (gate before up: ``_MOE_TARGET_MODULE_MAPPING`` lists them so)."""
    last = stack.rsplit(".", 1)[-1]
    return tuple(old for old, s in m.spec.traits.peft_expert_targets if s == last)


def add_expert_loras(m: CausalLM, t: Tensor) -> None:
    """PEFT's ``lora_A`` [r, in] / ``lora_B`` [out, r] on each expert's projections of the (E, out, in)
    stack ``t`` (its rows split evenly among the projections fused into it); they train."""
    experts, n_out, n_in = t.shape
    names = projections(m, t.name)
    rows = n_out // len(names)
    base = t.name.rsplit(".", 1)[0]
    r, dt = m.cfg.lora_rank, m.cfg.adapter_dt
    for e in range(experts):
        for proj in names:
            for nm, shp in (
                (f"{base}.{e}.{proj}.lora_A", (r, n_in)),
                (f"{base}.{e}.{proj}.lora_B", (rows, r)),
            ):
                numel = shp[0] * shp[1]
                m.p[nm] = m.s.param(nm, numel, dt, True, round(numel * DT_BYTES[dt]), t.layer, sharded=False)
                m.shape[nm] = shp


def stack(m: CausalLM, name: str) -> T:
    """The expert stack ``name`` as the experts' forward reads it: the parameter, or PEFT's merged copy."""
    s, w = m.s, m.param(name)
    if name in m.quantized:  # Bnb4bitParametrization.forward: the whole stack dequantized, under no_grad
        w = s.new(w.n, w.dt, "dequantized weights")
    if f"{name}.lora_A" not in m.p:
        return w
    a, b = m.p[f"{name}.lora_A"].tensor, m.p[f"{name}.lora_B"].tensor
    rhs = s.cast(m.o.view(a), w.dt)  # weight_A.reshape(E, r, in).to(param.dtype)
    lhs = s.cast(m.o.view(b, copy_grad=True), w.dt)  # weight_B.reshape(out, r, E).permute(2, 0, 1).to(...)
    merged = s.new(w.n, w.dt)  # baddbmm(W, lhs, rhs), autocast off
    s.node("linear", (w, lhs, rhs), (merged,), (lhs, rhs))
    return merged
