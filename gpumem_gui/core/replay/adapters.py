"""What wraps or replaces a plain ``nn.Linear`` in the replay: PEFT's LoRA layers, bitsandbytes' 4-bit
linears, and the fused projections some architectures build.

* PEFT LoRA (``peft/tuners/lora/layer.py`` ``Linear.forward``): ``result = result + lora_B(lora_A(dropout(x)))
  * scaling`` with x cast to the adapter dtype first (``_cast_input_dtype``), then ``result.to(dtype)``.
* bitsandbytes ``Linear4bit.forward`` -> ``MatMul4Bit`` (``bitsandbytes/autograd/_functions.py``): the 4-bit
  weight is dequantized to the compute dtype for the matmul (a transient of out x in); only the packed weight
  is kept for backward, where it is dequantized again for grad_input.
* Fused projections: transformers builds one ``qkv_proj`` (:attr:`ArchTraits.fused_qkv`) or one
  ``gate_up_proj`` (:attr:`ArchTraits.fused_gate_up`) where the parameter accounting lists the parts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpumem_gui.core.replay.autograd import DT_BYTES, Node, Sim, Storage, T
from gpumem_gui.core.spec.params import Tensor

if TYPE_CHECKING:
    from gpumem_gui.core.replay.model import CausalLM, ReplayConfig

# what "all-linear" targets: every linear of a decoder layer
LORA_ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_BNB_SKIP = ("lm_head", "embed_tokens", "embed_positions", ".gate.weight", "shared_expert_gate", "norm")


def bnb_quantizes(name: str, shape: tuple[int, ...]) -> bool:
    """transformers' replace_with_bnb_linear: every nn.Linear but lm_head (and the MoE router, kept in
    llm_int8_skip_modules by the model classes); fused 3-D expert tensors are not nn.Linear."""
    if len(shape) != 2 or not name.endswith(".weight"):
        return False
    return not any(k in name for k in _BNB_SKIP)


def is_lora_target(cfg: ReplayConfig, t: Tensor) -> bool:
    if cfg.method == "full" or not t.name.endswith(".weight") or len(t.shape) != 2 or t.layer is None:
        return False
    return t.name.rsplit(".", 2)[-2] in cfg.lora_targets


def add_lora(m: CausalLM, t: Tensor) -> None:
    """lora_A [r, in] and lora_B [out, r] beside the target, in the adapter dtype; they train."""
    n_out, n_in = t.shape
    base = t.name[: -len(".weight")]
    r, dt = m.cfg.lora_rank, m.cfg.adapter_dt
    for nm, shp in ((f"{base}.lora_A", (r, n_in)), (f"{base}.lora_B", (n_out, r))):
        numel = shp[0] * shp[1]
        m.p[nm] = m.s.param(nm, numel, dt, True, round(numel * DT_BYTES[dt]), t.layer, sharded=False)
        m.shape[nm] = shp


def lora(m: CausalLM, x: T, result: T, name: str, n_out: int, n_in: int) -> T:
    o, s, cfg = m.o, m.s, m.cfg
    torch_result_dtype = result.dt
    r = cfg.lora_rank
    x = s.cast(x, cfg.adapter_dt)
    a = o.linear(o.dropout(x, cfg.lora_dropout), m.p[f"{name}.lora_A"].tensor, None, r, n_in)
    b = o.linear(a, m.p[f"{name}.lora_B"].tensor, None, n_out, r)
    del a
    scaled = o.mul(b, None)
    del b
    result = o.add(result, scaled)
    del scaled
    return s.cast(result, torch_result_dtype)


def linear4bit(m: CausalLM, x: T, bias: T | None, n_out: int, n_in: int) -> T:
    s = m.s
    cdt = m.cfg.autocast or m.cfg.param_dt
    inp_dtype = x.dt
    x = s.cast(x, cdt)
    deq = s.new(n_out * n_in, cdt, "dequantized weights")
    rows = x.n // n_in
    out = s.new(rows * n_out, cdt)
    del deq
    numel = n_out * n_in

    def bw(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
        res: list[Storage | None] = [None] * len(nd.edges)
        if nd.edges[0] is not None:
            d = sim.storage(round(numel * DT_BYTES[cdt]), "dequantized weights")
            res[0] = sim.storage(round(nd.in_meta[0][0] * DT_BYTES[cdt]), "temporaries")
            del d
        return res

    s.node("custom", (x,), (out,), (), bw)
    return s.cast(out, inp_dtype)


def _fuse(tensors: Sequence[Tensor], parts: tuple[str, ...], fused: str) -> tuple[Tensor, ...]:
    """Merge each layer's ``parts`` projection tensors (same suffix) into one ``fused`` (same element count),
    at the place of the last part."""
    out: list[Tensor] = []
    pending: dict[tuple[int | None, str, str], list[Tensor]] = {}
    for t in tensors:
        bits = t.name.rsplit(".", 2)
        if len(bits) == 3 and bits[1] in parts:
            key = (t.layer, bits[0], bits[2])
            group = pending.setdefault(key, [])
            group.append(t)
            if len(group) == len(parts):
                del pending[key]
                rows = sum(x.shape[0] for x in group)
                out.append(
                    Tensor(f"{bits[0]}.{fused}.{bits[2]}", (rows, *group[0].shape[1:]), t.component, t.layer)
                )
            continue
        out.append(t)
    return tuple(out)


def fuse_projections(tensors: Sequence[Tensor], qkv: bool, gate_up: bool) -> tuple[Tensor, ...]:
    """The parameter tensors as transformers builds them: q/k/v as one ``qkv_proj``, gate/up as one
    ``gate_up_proj``, where the architecture fuses them."""
    out = tuple(tensors)
    if qkv:
        out = _fuse(out, ("q_proj", "k_proj", "v_proj"), "qkv_proj")
    if gate_up:
        out = _fuse(out, ("gate_proj", "up_proj"), "gate_up_proj")
    return out
