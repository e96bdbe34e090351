"""What wraps or replaces a plain ``nn.Linear`` in the replay: PEFT's LoRA layers, bitsandbytes' 4-bit
linears, and the fused projections some architectures build.

* PEFT LoRA (``peft/tuners/lora/layer.py`` ``Linear.forward``): ``result = result + lora_B(lora_A(dropout(x)))
  * scaling`` with x cast to the adapter dtype first (``_cast_input_dtype``), then ``result.to(dtype)``.
* bitsandbytes ``Linear4bit.forward`` -> ``MatMul4Bit`` (``bitsandbytes/autograd/_functions.py``): the 4-bit
  weight is dequantized to the compute dtype for the matmul (a transient of out x in); only the packed weight
  is kept for backward, where it is dequantized again for grad_input.
* bitsandbytes ``Linear8bitLt`` (``load_in_8bit``, LLM.int8) -> ``MatMul8bitLt`` (same file): see
  :func:`linear8bit`.
* Fused projections: transformers builds one ``qkv_proj`` (:attr:`ArchTraits.fused_qkv`) or one
  ``gate_up_proj`` (:attr:`ArchTraits.fused_gate_up`) where the parameter accounting lists the parts.
* Which linears PEFT adapts (``peft/tuners/tuners_utils.py`` ``check_target_module_exists``: a target names
  the last part of a module's path, or a dotted end of it; one string is a regex over the whole path;
  ``_maybe_include_all_linear_layers``: ``all-linear`` is every
  ``nn.Linear`` and ``Conv1D`` but the output layer). Modules go by their real names
  (:attr:`ArchTraits.module_names`: GPT-2's ``c_attn``, Falcon's ``query_key_value``, OPT's ``fc1``), fused
  projections by their fused name; MoE routers (``*TopKRouter``) and 3-D expert tensors are not
  ``nn.Linear`` (``all-linear`` leaves them out), a shared expert's gate is. On the MoE types PEFT converts
  for transformers 5 (:mod:`.moe_lora`) the expert stacks and the router (``gate``) become parameter
  targets (``ParamWrapper``: :func:`merged_weight`, :func:`moe_lora.stack`); elsewhere PEFT refuses a
  router module as a target.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.replay import moe_lora
from gpumem_gui.core.replay.autograd import Node, Sim
from gpumem_gui.core.replay.memory import DT_BYTES, Storage, T
from gpumem_gui.core.spec.encoder_params import saved_module
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import Tensor

if TYPE_CHECKING:
    from gpumem_gui.core.replay.config import ReplayConfig
    from gpumem_gui.core.replay.context import CausalLM

# PEFT's shorthand for every linear but the output layer
ALL_LINEAR = "all-linear"
# parameter tensors of 2-D shape that are not nn.Linear weights in transformers 5.24
# + BertEmbeddings; T5Attention.relative_attention_bias (an nn.Embedding)
# embed_tokens_per_layer: Gemma 3n / Gemma 4's per-layer table, an nn.Embedding (ScaledWordEmbedding)
_NOT_LINEAR = (
    "embed_tokens",
    "embed_tokens_per_layer",
    "embed_positions",
    "gate",
    "token_type_embeddings",
    "relative_attention_bias",
)
_BNB_SKIP = ("lm_head", "embed_tokens", "embed_positions", ".gate.weight", "shared_expert_gate", "norm")


def bnb_quantizes(name: str, shape: tuple[int, ...], experts: bool = False) -> bool:
    """transformers' replace_with_bnb_linear: every nn.Linear but lm_head (and the MoE router, kept in
    llm_int8_skip_modules by the model classes); fused 3-D expert tensors are not nn.Linear (``experts``:
    they are 4-bit all the same, run field qlora_experts)."""
    if experts and moe_lora.is_stack(name, shape):
        return True
    if len(shape) != 2 or not name.endswith(".weight"):
        return False
    return not any(k in name for k in _BNB_SKIP)


def module_name(spec: ModelSpec, t: Tensor) -> str | None:
    """The real name of the ``nn.Linear`` (or Conv1D) module ``t`` is the weight of, None when ``t`` is no
    linear's weight (embeddings, norms, MoE routers, 3-D expert tensors)."""
    if not t.name.endswith(".weight") or len(t.shape) != 2:
        return None
    canonical = t.name.rsplit(".", 2)[-2] if t.name.count(".") >= 1 else t.name
    if canonical in _NOT_LINEAR:
        return None
    return dict(spec.traits.module_names).get(canonical, canonical)


TIED_HEAD = "lm_head.weight"


def linear_modules(spec: ModelSpec, tensors: Sequence[Tensor]) -> dict[str, list[Tensor]]:
    """Every linear module name of the model with the weights that carry it (a name repeats per layer); a
    tied head is still an ``nn.Linear`` module (its weight is the embedding's)."""
    out: dict[str, list[Tensor]] = {}
    for t in tensors:
        name = module_name(spec, t)
        if name is not None:
            out.setdefault(name, []).append(t)
    if "lm_head" not in out and spec.tie_word_embeddings:
        out["lm_head"] = [Tensor(TIED_HEAD, (spec.vocab_size, spec.token_embedding_dim), "lm_head", None)]
    return out


def lora_targets(
    spec: ModelSpec, tensors: Sequence[Tensor], targets: Sequence[str], fused: bool = True
) -> frozenset[str]:
    """The weight names PEFT wraps for ``targets`` (module names, or ``all-linear``); raises
    :class:`GpumemInputError` naming the modules that exist when a target matches none of them (``fused``
    False: the routed experts are transformers 4's per-expert linears, :func:`moe_lora.convert_targets`)."""
    modules = linear_modules(spec, tensors)
    if spec.encoder is not None:  # PEFT puts no adapters inside modules_to_save (an encoder's classifier)
        modules = {k: [t for t in ts if not saved_module(spec, t.name)] for k, ts in modules.items()}
        modules = {k: ts for k, ts in modules.items() if ts}
    linear_names = [name for name in modules if name != "lm_head"]
    routers = [t for t in tensors if is_router(t)]
    if routers and spec.traits.peft_expert_targets:  # the router as the parameter target gate.weight
        modules = {**modules, ROUTER: routers}  # (elsewhere PEFT refuses a *TopKRouter module as a target)
    # PEFT on transformers 5 renames v4 expert targets onto the fused expert stacks (replay/moe_lora.py)
    paths = [module_path(spec, t) for ts in modules.values() for t in ts]
    one = targets[0] if len(targets) == 1 else ""
    regex = one[len(REGEX) :] if one.startswith(REGEX) else None
    targets, stacks = moe_lora.convert_targets(
        spec, tensors, tuple(targets), linear_names, paths, regex, fused
    )
    if tuple(targets) == (ALL_LINEAR,):
        return frozenset(t.name for name in linear_names for t in modules[name])
    chosen: set[str] = set()
    for target in targets:
        if target.startswith(REGEX) or "." in target:
            chosen.update(_by_path(spec, modules, target))
            continue
        if target not in modules:
            raise GpumemInputError(
                f"no linear module of this model is named {target!r}; its linear modules are "
                f"{', '.join(sorted(modules))} (or all-linear)",
                field="lora_targets",
            )
        chosen.update(t.name for t in modules[target])
    return frozenset(chosen | stacks)


# the MoE router's module name; in transformers 5 a ``*TopKRouter`` holding ``weight`` (not an nn.Linear)
ROUTER = "gate"


def is_router(t: Tensor) -> bool:
    return t.component == "router" and t.name.endswith(f".{ROUTER}.weight") and len(t.shape) == 2


def merged_weight(m: CausalLM, w: T, name: str, n_out: int, n_in: int) -> T:
    """A router named as a LoRA target (``gate``): PEFT 0.21 wraps its weight in a ``ParamWrapper``
    (``peft/tuners/lora/layer.py``): ``_activate_lora`` registers the parametrization ``W + delta`` with
    ``delta = get_delta_weight()`` = ``(lora_B @ lora_A) * scaling`` (under the model's autocast) cast to the
    weight's dtype, and the router's ``F.linear`` runs on (and saves) that merged copy of the weight."""
    o, s = m.o, m.s
    a, b = m.p[f"{name}.lora_A"].tensor, m.p[f"{name}.lora_B"].tensor
    delta = o.bmm(b, a, n_out * n_in)
    scaled = s.cast(o.mul(delta, None), w.dt)
    del delta
    return o.add(w, scaled)


def router_weight(m: CausalLM, pre: str) -> T:
    """The router weight of MoE block ``pre`` as a router that reads ``self.weight`` itself sees it (the fp32
    routers' ``self.weight.float()``): the parameter, or PEFT's merged copy when it is a LoRA target."""
    name = f"{pre}.{ROUTER}"
    w = m.param(f"{name}.weight")
    if f"{name}.lora_A" not in m.p:
        return w
    n_out, n_in = m.shape[f"{name}.weight"]
    return merged_weight(m, w, name, n_out, n_in)


# a regex target: PEFT matches a target_modules string with re.fullmatch against each module's whole path
REGEX = "re:"  # a lora_targets value naming a regex (PEFT: target_modules given as one string)


def module_path(spec: ModelSpec, t: Tensor) -> str:
    """The module path PEFT sees for the linear ``t`` is the weight of, as transformers' decoder-only models
    name it (``model.layers.3.self_attn.q_proj``, ``lm_head``), the module by its real name."""
    parts = t.name[: -len(".weight")].split(".")
    parts[-1] = module_name(spec, t) or parts[-1]
    return ".".join(parts) if parts[0] == "lm_head" else "model." + ".".join(parts)


def _by_path(spec: ModelSpec, modules: dict[str, list[Tensor]], target: str) -> set[str]:
    """``peft/tuners/tuners_utils.py`` ``check_target_module_exists``: a regex (``target_modules`` given as
    one string) must match a module's whole path (``re.fullmatch``); a dotted name in the list matches the
    path itself or its end after a dot (``key.endswith(f".{target_key}")``)."""
    paths = {t.name: module_path(spec, t) for ts in modules.values() for t in ts}
    if target.startswith(REGEX):
        pattern = re.compile(target[len(REGEX) :])
        found = {name for name, path in paths.items() if pattern.fullmatch(path)}
    else:
        found = {name for name, path in paths.items() if path == target or path.endswith("." + target)}
    if not found:
        examples = ", ".join(list(dict.fromkeys(paths.values()))[:4])
        raise GpumemInputError(
            f"{target!r} matches no linear module of this model (PEFT fullmatches a regex against the whole "
            f"path and a dotted name against its end; paths look like {examples})",
            field="lora_targets",
        )
    return found


def add_lora(m: CausalLM, t: Tensor) -> None:
    """lora_A [r, in] and lora_B [out, r] beside the target, in the adapter dtype; they train (an expert
    stack: :func:`moe_lora.add_stack_lora`)."""
    if len(t.shape) == 3:
        moe_lora.add_stack_lora(m, t)
        return
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


def bnb4_inference(cfg: ReplayConfig, w_name: str, shape: tuple[int, int]) -> bool:
    """An inference replay of a bitsandbytes 4-bit model runs this linear as ``Linear4bit``."""
    return cfg.bnb4_compute is not None and bnb_quantizes(w_name, shape)


def linear4bit(m: CausalLM, x: T, bias: T | None, n_out: int, n_in: int) -> T:
    """``Linear4bit.forward``: the input cast to the compute dtype, the weight dequantized for the matmul.

    bitsandbytes ``matmul_4bit`` (``bitsandbytes/autograd/_functions.py``): a single token without
    gradients takes ``gemv_4bit`` on the packed weight (no dequantized copy); otherwise ``MatMul4Bit``
    dequantizes to the dtype the weight had (``quant_state.dtype``: the model's float dtype) and casts that
    to the input's (the compute dtype, ``bnb_4bit_compute_dtype``), both alive for the matmul when they
    differ. In training the two are the same dtype (the QLoRA recipes set the compute dtype to it)."""
    s, cfg = m.s, m.cfg
    cdt = cfg.bnb4_compute or cfg.autocast or cfg.param_dt
    inp_dtype = x.dt
    x = s.cast(x, cdt)
    rows = x.n // n_in
    numel = n_out * n_in
    if cfg.bnb4_compute is not None and rows == 1:  # gemv_4bit: one token, no gradients
        return s.cast(s.new(n_out, cdt), inp_dtype)
    stored = cfg.param_dt if cfg.bnb4_compute is not None else cdt
    deq = s.new(numel, stored, "dequantized weights")
    deq_c = s.new(numel, cdt, "dequantized weights") if stored != cdt else deq  # .to(A.dtype)
    out = s.new(rows * n_out, cdt)
    del deq, deq_c

    def bw(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
        res: list[Storage | None] = [None] * len(nd.edges)
        if nd.edges[0] is not None:
            d = sim.storage(round(numel * DT_BYTES[cdt]), "dequantized weights")
            res[0] = sim.storage(round(nd.in_meta[0][0] * DT_BYTES[cdt]), "temporaries")
            del d
        return res

    s.node("custom", (x,), (out,), (), bw)
    return s.cast(out, inp_dtype)


def linear8bit(m: CausalLM, x: T, bias: T | None, n_out: int, n_in: int) -> T:
    """bitsandbytes ``Linear8bitLt.forward`` -> ``MatMul8bitLt`` (``bitsandbytes/autograd/_functions.py``,
    CUDA kernels in ``backends/cuda/ops.py``, ``backends/default/ops.py``; bitsandbytes 95f9af3) on a frozen
    int8 weight (``has_fp16_weights=False``, ``llm_int8_threshold=6.0``: the mixed-precision path):

    * forward: ``A.to(torch.float16)`` (a copy unless fp16); ``int8_vectorwise_quant`` allocates the int8
      ``CA`` (rows x in) and fp32 row stats, and with a threshold ``A.abs() >= threshold`` (an fp16 and a bool
      rows x in temporary); the fp16 copy dies after the quantization; ``int8_mixed_scaled_mm`` ->
      ``int8_scaled_mm``: an int32 ``rows x out`` product, dequantized into fp16 (``int8_mm_dequant``) and
      cast to the input's dtype (``out.to(dtype)``); with outlier columns ``output.addmm(subA, subB)`` makes a
      new output (assumed: LLM activations have outliers above 6.0, the reason for the threshold);
    * saved (``ctx.tensors = (CAt, subA, A)``): the input ``A`` itself (no copy) and ``subA``, the outlier
      columns of the input (data-dependent, a few columns: not counted);
    * backward (grad_A only: the weight is frozen): ``CB.to(dtype_A, copy=True).mul_(SCB / 127)`` dequantizes
      the whole weight (out x in, the input's dtype), then ``grad_output @ CB``.
    """
    s = m.s
    dt = x.dt
    rows = x.n // n_in
    a16 = s.new(x.n, "f16", "temporaries") if dt != "f16" else None  # A.to(torch.float16)
    row_stats = s.new(rows, "f32", "temporaries")  # SCA
    ca = s.new(x.n, "u8", "temporaries")  # CA: int8, rows x in
    absa = s.new(x.n, "f16", "temporaries")  # A.abs()
    outliers = s.new(x.n, "bool", "temporaries")  # >= threshold
    del absa, outliers, a16
    i32 = s.new(rows * n_out, "i32", "temporaries")  # int8_linear_matmul
    h16 = s.new(rows * n_out, "f16", "temporaries")  # int8_mm_dequant's fp16 output
    out = s.new(rows * n_out, dt) if dt != "f16" else h16  # out.to(dtype)
    del h16, i32
    mixed = s.new(rows * n_out, dt)  # output.addmm(subA, subB): a new tensor
    del out, ca, row_stats
    numel = n_out * n_in

    def bw(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
        res: list[Storage | None] = [None] * len(nd.edges)
        if nd.edges[0] is not None:
            n, in_dt = nd.in_meta[0]
            cb = sim.storage(round(numel * DT_BYTES[in_dt]), "dequantized weights")  # CB.to(dtype_A)
            res[0] = sim.storage(round(n * DT_BYTES[in_dt]), "temporaries")  # grad_output @ CB
            del cb
        return res

    s.node("custom", (x,), (mixed,), (x,), bw)
    return mixed


QUANTIZED_LINEARS = {"int8": linear8bit}  # the qlora_base formats whose linear is not Linear4bit's


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
