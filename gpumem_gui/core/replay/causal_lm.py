"""One training step of a ``transformers`` causal LM, replayed on symbolic tensors (:mod:`train_autograd`).

The code below follows the modeling files of transformers 5.24 statement by statement (``LlamaModel.forward``,
``LlamaDecoderLayer``, ``LlamaAttention``, ``LlamaMLP``, ``LlamaRMSNorm``, ``apply_rotary_pos_emb``,
``integrations/sdpa_attention.py``, ``eager_attention_forward``, ``loss/loss_utils.py`` ``ForCausalLMLoss``;
the
Gemma, Qwen3, GPT-2 and MoE variants where they differ), so that Python's reference counting frees every
intermediate exactly when the real code drops it, and autograd saves what the real ops save. PEFT's LoRA layer
(``peft/tuners/lora/layer.py`` ``Linear.forward``) and bitsandbytes' 4-bit matmul
(``bitsandbytes/autograd/_functions.py`` ``MatMul4Bit``) are replayed the same way.

Nothing here is fitted: sizes are element counts times dtype widths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpumem_gui.core.replay.autograd import DT_BYTES, Node, Param, Sim, Storage, T, promote
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import text_tensors


def received_leaf(sim: Sim, n: int, dt: str) -> T:
    """A tensor received from another rank that needs a gradient (its gradient is sent back)."""
    x = sim.new(n, dt)
    nd = Node(sim, "acc", (), ((n, dt),), ())
    nd.seq = 1 << 62
    x.fn, x.idx = nd, 0
    return x


LORA_ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class StepConfig:
    """What one simulated micro-batch looks like (already resolved from a TrainingRun)."""

    batch: int
    seq: int
    param_dt: str  # dtype of the model's (trainable or frozen) float weights
    autocast: str | None  # lower-precision dtype of torch.autocast, None without autocast
    attn: str = "sdpa"
    grad_ckpt: bool = False
    method: str = "full"  # full | lora | qlora
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = LORA_ALL_LINEAR
    lora_dropout: float = 0.0
    adapter_dt: str = "f32"
    quant_bytes: int = 0  # qlora: bytes of the 4-bit linears (packed weights + quantization state)
    frozen_layers: int = 0
    lm_head: bool = True  # this rank holds the head and the loss
    embedding: bool = True  # this rank holds the token embedding
    param_shard: int = 1  # ZeRO-3 / FSDP: each rank stores 1/param_shard of every parameter
    gather: str = "none"  # none | unit (ZeRO-3 / FULL_SHARD: one layer at a time) | all (SHARD_GRAD_OP)
    params_offloaded: bool = False  # ZeRO-3 offload_param / FSDP CPUOffload: only gathered units on the GPU
    dropout: float = 0.0  # hidden/attention dropout of the architecture (GPT-2 style residual dropouts)
    cpu_dropout: bool = False  # replay the CPU dropout kernel (a full-dtype noise tensor) instead of CUDA's


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class Ops:
    """torch ops over symbolic tensors: output sizes/dtypes, autocast casts, what autograd saves."""

    def __init__(self, sim: Sim, cpu_dropout: bool = False) -> None:
        self.s = sim
        self.cpu_dropout = cpu_dropout

    # -- elementwise ---------------------------------------------------------------------------------------
    def mul(self, a: T, b: T | None, n: int | None = None) -> T:
        """a * b (b None: a python scalar). Saves each operand the other's gradient needs."""
        s = self.s
        if b is None:
            out = s.new(a.n, a.dt)
            s.node("copy", (a,), (out,))
            return out
        dt = _promote(a, b)
        out = s.new(n if n is not None else max(a.n, b.n), dt)
        saved = []
        if a.fn is not None:
            saved.append(b)
        if b.fn is not None:
            saved.append(a)
        s.node("mul", (a, b), (out,), tuple(saved))
        return out

    def add(self, a: T, b: T | None, n: int | None = None) -> T:
        s = self.s
        if b is None:
            out = s.new(a.n, a.dt)
            s.node("pass", (a,), (out,))
            return out
        out = s.new(n if n is not None else max(a.n, b.n), _promote(a, b))
        s.node("pass", (a, b), (out,))
        return out

    def neg(self, a: T) -> T:
        out = self.s.new(a.n, a.dt)
        self.s.node("copy", (a,), (out,))
        return out

    def cat(self, a: T, b: T) -> T:
        out = self.s.new(a.n + b.n, _promote(a, b))
        self.s.node("pass", (a, b), (out,))
        return out

    def slice_half(self, x: T) -> T:
        """``x[..., :d/2]``: a view; its backward is slice_backward (a zero-filled full-size gradient)."""
        out = T(x.st, x.n // 2, x.dt)
        self.s.node("copy", (x,), (out,))
        return out

    def view(self, x: T, copy_grad: bool = False) -> T:
        """A view (view/transpose/reshape of contiguous data). ``copy_grad``: its backward has to make the
        incoming gradient contiguous (``.view(...).transpose(1, 2)`` of q/k/v: ViewBackward clones)."""
        out = T(x.st, x.n, x.dt)
        self.s.node("copy" if copy_grad else "pass", (x,), (out,))
        return out

    def clone(self, x: T) -> T:
        out = self.s.new(x.n, x.dt)
        self.s.node("pass", (x,), (out,))
        return out

    def silu(self, x: T) -> T:
        out = self.s.new(x.n, x.dt)
        self.s.node("copy", (x,), (out,), (x,))
        return out

    def gelu_tanh(self, x: T) -> T:
        out = self.s.new(x.n, x.dt)
        self.s.node("copy", (x,), (out,), (x,))
        return out

    def tanh(self, x: T) -> T:
        out = self.s.new(x.n, x.dt)
        self.s.node("copy", (x,), (out,), (out,))
        return out

    def pow2(self, x: T) -> T:
        out = self.s.new(x.n, x.dt)
        self.s.node("pow", (x,), (out,), (x,))
        return out

    def pow3(self, x: T) -> T:
        out = self.s.new(x.n, x.dt)
        self.s.node("pow", (x,), (out,), (x,))
        return out

    def mean_last(self, x: T, width: int) -> T:
        out = self.s.new(x.n // width, x.dt)
        self.s.node("copy", (x,), (out,))
        return out

    def rsqrt(self, x: T) -> T:
        out = self.s.new(x.n, x.dt)
        self.s.node("rsqrt", (x,), (out,), (out,))
        return out

    def dropout(self, x: T, p: float) -> T:
        """nn.Dropout in training: ``p == 0`` returns the input; otherwise CUDA's native_dropout returns the
        output and a bool mask and saves the mask. (The CPU kernel, ``_dropout``, instead multiplies by a
        noise
        tensor of the input's dtype and saves that: ``cpu_dropout``, used to check against CPU
        measurements.)"""
        if p <= 0:
            return x
        out = self.s.new(x.n, x.dt)
        mask = self.s.new(x.n, x.dt if self.cpu_dropout else "bool")
        self.s.node("mul", (x,), (out,), (mask,))
        return out

    # -- matmuls -------------------------------------------------------------------------------------------
    def linear(self, x: T, w: T, b: T | None, n_out: int, n_in: int) -> T:
        """F.linear -> mm/addmm: saves the weight for grad_input and the input for grad_weight."""
        s = self.s
        x = s.ac_cast(x)  # type: ignore[assignment]
        w = s.ac_cast(w)  # type: ignore[assignment]
        b = s.ac_cast(b)
        rows = x.n // n_in
        out = s.new(rows * n_out, _promote(x, w))
        saved = []
        if x.fn is not None:
            saved.append(w)
        if w.fn is not None:
            saved.append(x)
        s.node("linear", (x, w, b), (out,), tuple(saved))
        return out

    def bmm(self, a: T, b: T, n_out: int) -> T:
        s = self.s
        a = s.ac_cast(a)  # type: ignore[assignment]
        b = s.ac_cast(b)  # type: ignore[assignment]
        out = s.new(n_out, _promote(a, b))
        saved = []
        if a.fn is not None:
            saved.append(b)
        if b.fn is not None:
            saved.append(a)
        s.node("linear", (a, b), (out,), tuple(saved))
        return out


def _promote(a: T, b: T) -> str:
    da, db = a.dt, b.dt
    return da if da == db else promote(da, db)


class CausalLM:
    """The parameters of one (rank's) model and the forward + loss of one micro-batch."""

    def __init__(self, sim: Sim, spec: ModelSpec, cfg: StepConfig) -> None:
        self.s = sim
        self.o = Ops(sim, cfg.cpu_dropout)
        self.spec = spec
        self.cfg = cfg
        self.p: dict[str, Param] = {}
        self.shape: dict[str, tuple[int, ...]] = {}
        self.quantized: set[str] = set()
        self.unit_full: dict[int, int] = {}  # full bytes of each FSDP unit (-1: embeddings, final norm, head)
        self._build_params()
        if cfg.gather != "none" and (cfg.param_shard > 1 or cfg.params_offloaded):
            total = sum(self.unit_full.values())
            sim.unit_bytes = dict(self.unit_full)
            kept = (
                0 if cfg.params_offloaded else sum(-(-b // cfg.param_shard) for b in self.unit_full.values())
            )
            sim.gather_cap = total - kept

    # ---- parameters ----------------------------------------------------------------------------------------
    def _trainable(self, name: str, layer: int | None) -> bool:
        if self.cfg.method != "full":
            return False
        return not (layer is not None and layer < self.cfg.frozen_layers)

    def _is_lora_target(self, name: str) -> bool:
        if self.cfg.method == "full" or not name.endswith(".weight"):
            return False
        mod = name.rsplit(".", 2)[-2]
        return mod in self.cfg.lora_targets

    def _build_params(self) -> None:
        cfg, spec, s = self.cfg, self.spec, self.s
        fused = spec.traits.fused_qkv
        tensors = list(text_tensors(spec))
        if fused:
            tensors = _fuse_qkv(tensors)
        for t in tensors:
            if (
                not cfg.embedding
                and t.component in ("embedding", "position_embedding")
                and not (cfg.lm_head and spec.tie_word_embeddings and t.component == "embedding")
            ):
                continue
            if not cfg.lm_head and (t.component == "lm_head" or t.name == "norm.weight"):
                continue
            numel = _numel(t.shape)
            rg = self._trainable(t.name, t.layer)
            quant = cfg.method == "qlora" and _bnb_quantizes(t.name, t.shape)
            full = round(numel * DT_BYTES[cfg.param_dt])
            if quant:
                p = s.param(t.name, numel, cfg.param_dt, False, nbytes=0)
                self.quantized.add(t.name)
                full = 0
            else:
                kept = 0 if cfg.params_offloaded else -(-full // cfg.param_shard)
                p = s.param(t.name, numel, cfg.param_dt, rg, nbytes=kept)
            unit = t.layer if t.layer is not None else -1
            self.unit_full[unit] = self.unit_full.get(unit, 0) + full
            self.p[t.name] = p
            self.shape[t.name] = t.shape
            if self._is_lora_target(t.name) and len(t.shape) == 2 and t.layer is not None:
                n_out, n_in = t.shape
                base = t.name[: -len(".weight")]
                r = cfg.lora_rank
                for nm, shp in ((f"{base}.lora_A", (r, n_in)), (f"{base}.lora_B", (n_out, r))):
                    self.p[nm] = s.param(nm, _numel(shp), cfg.adapter_dt, True)
                    self.shape[nm] = shp
        if cfg.method == "qlora" and cfg.quant_bytes:
            s.param("bnb 4-bit linears", 0, "u8", False, nbytes=cfg.quant_bytes)
        if spec.vision is not None and cfg.embedding:
            # the vision tower and projector: counted (and trained in a full fine-tune), not run on text
            # batches
            n = spec.vision.params
            full = round(n * DT_BYTES[cfg.param_dt])
            kept = 0 if cfg.params_offloaded else -(-full // cfg.param_shard)
            self.p["vision"] = s.param(
                "vision", n, cfg.param_dt, self._trainable("vision", None), nbytes=kept
            )
            self.unit_full[-1] = self.unit_full.get(-1, 0) + full

    def buffers_bytes(self) -> int:
        spec = self.spec
        if spec.position_embedding != "rope":
            return 0
        d = spec.mla.qk_rope_head_dim if spec.mla else spec.head_dim
        modules = 2 if spec.traits.rotary_per_layer_type else 1
        return modules * 2 * (d // 2) * 4

    # ---- building blocks
    # -------------------------------------------------------------------------------------
    def w(self, name: str) -> T | None:
        p = self.p.get(name)
        return p.tensor if p is not None else None

    def linear(self, x: T, name: str, layer: int | None = None) -> T:
        """nn.Linear ``name`` (``...q_proj``), or PEFT's LoRA Linear around it, or a bnb Linear4bit base."""
        w_name = f"{name}.weight"
        n_out, n_in = self.shape[w_name]
        bias = self.w(f"{name}.bias")
        if w_name in self.quantized:
            result = self._linear4bit(x, w_name, bias, n_out, n_in)
        else:
            result = self.o.linear(x, self.p[w_name].tensor, bias, n_out, n_in)
        if f"{name}.lora_A" not in self.p:
            return result
        return self._lora(x, result, name, n_out, n_in)

    def _lora(self, x: T, result: T, name: str, n_out: int, n_in: int) -> T:
        """peft LoraLayer Linear.forward: ``result = result + lora_B(lora_A(dropout(x))) * scaling`` with x
        cast
        to the adapter dtype first (``_cast_input_dtype``), then ``result.to(torch_result_dtype)``."""
        o, s, cfg = self.o, self.s, self.cfg
        torch_result_dtype = result.dt
        r = cfg.lora_rank
        x = s.cast(x, cfg.adapter_dt)
        a = o.linear(o.dropout(x, cfg.lora_dropout), self.p[f"{name}.lora_A"].tensor, None, r, n_in)
        b = o.linear(a, self.p[f"{name}.lora_B"].tensor, None, n_out, r)
        del a
        scaled = o.mul(b, None)
        del b
        result = o.add(result, scaled)
        del scaled
        return s.cast(result, torch_result_dtype)

    def _linear4bit(self, x: T, w_name: str, bias: T | None, n_out: int, n_in: int) -> T:
        """bitsandbytes Linear4bit.forward -> MatMul4Bit: the 4-bit weight is dequantized to the compute dtype
        for the matmul (a transient of out x in), only the packed weight is kept for backward, where it is
        dequantized again for grad_input."""
        s = self.s
        cdt = self.cfg.autocast or self.cfg.param_dt
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

    def rmsnorm(self, x: T, name: str) -> T:
        """LlamaRMSNorm (and Gemma's ``(1 + w)`` variant, and LayerNorm for GPT-2-style models)."""
        o, s, spec = self.o, self.s, self.spec
        w = self.p[f"{name}.weight"].tensor
        width = self.shape[f"{name}.weight"][0]
        if spec.norm == "layernorm":
            return self.layer_norm(x, name, width)
        input_dtype = x.dt
        if spec.traits.norm_weight_offset:
            xf = s.cast(x, "f32")
            hs = o.mul(xf, o.rsqrt(o.add(o.mean_last(o.pow2(xf), width), None)))
            del xf
            w1 = o.add(s.cast(w, "f32"), None)
            out = o.mul(hs, w1, hs.n)
            del hs, w1
            return s.cast(out, input_dtype)
        hs = s.cast(x, "f32")
        variance = o.mean_last(o.pow2(hs), width)
        hs = o.mul(hs, o.rsqrt(o.add(variance, None)))
        del variance
        return o.mul(w, s.cast(hs, input_dtype), hs.n)

    def layer_norm(self, x: T, name: str, width: int) -> T:
        """F.layer_norm: output plus fp32 mean and rstd per row; saves input, weight, bias, mean, rstd."""
        s = self.s
        w = self.p[f"{name}.weight"].tensor
        b = self.w(f"{name}.bias")
        rows = x.n // width
        out = s.new(x.n, x.dt)
        mean = s.new(rows, "f32")
        rstd = s.new(rows, "f32")
        s.node("multi", (x, w, b), (out,), (x, w, b, mean, rstd))
        return out

    # ---- attention
    # -------------------------------------------------------------------------------------------
    def rope(self, q: T, k: T, cos: T, sin: T) -> tuple[T, T]:
        """apply_rotary_pos_emb: ``(q * cos) + (rotate_half(q) * sin)``, rotate_half = cat(-x2, x1)."""
        o = self.o

        def rot(x: T) -> T:
            x1 = o.slice_half(x)
            x2 = o.slice_half(x)
            return o.cat(o.neg(x2), x1)

        q_embed = o.add(o.mul(q, cos, q.n), o.mul(rot(q), sin, q.n))
        k_embed = o.add(o.mul(k, cos, k.n), o.mul(rot(k), sin, k.n))
        return q_embed, k_embed

    def mla_attention(self, i: int, hidden_states: T, cos: T | None, sin: T | None, mask: T | None) -> T:
        """DeepseekV3Attention (multi-head latent attention): low-rank q (q_a_proj, q_a_layernorm,
        q_b_proj), compressed KV (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj), split into no-rope/rope
        parts, the rope key broadcast to every head, q and k concatenated, attention with value head dim,
        o_proj."""
        o, spec, cfg = self.o, self.spec, self.cfg
        m = spec.mla
        assert m is not None
        pre = f"layers.{i}.self_attn"
        t = cfg.batch * cfg.seq
        a = spec.num_attention_heads
        if f"{pre}.q_a_proj.weight" in self.p:
            q = self.linear(hidden_states, f"{pre}.q_a_proj")
            q = self.linear(self.rmsnorm(q, f"{pre}.q_a_layernorm"), f"{pre}.q_b_proj")
        else:
            q = self.linear(hidden_states, f"{pre}.q_proj")
        q = o.view(q, copy_grad=True)
        q_pass, q_rot = self._split(q, (t * a * m.qk_nope_head_dim, t * a * m.qk_rope_head_dim))
        del q
        compressed_kv = self.linear(hidden_states, f"{pre}.kv_a_proj_with_mqa")
        k_pass, k_rot = self._split(compressed_kv, (t * m.kv_lora_rank, t * m.qk_rope_head_dim))
        del compressed_kv
        kv = self.linear(self.rmsnorm(k_pass, f"{pre}.kv_a_layernorm"), f"{pre}.kv_b_proj")
        kv = o.view(kv, copy_grad=True)
        k_pass, value_states = self._split(kv, (t * a * m.qk_nope_head_dim, t * a * m.v_head_dim))
        del kv
        if cos is not None and sin is not None:
            q_rot, k_rot = self.rope(q_rot, k_rot, cos, sin)
        k_rot = T(k_rot.st, k_rot.n * a, k_rot.dt, k_rot.rg, k_rot.fn, k_rot.idx)  # expand to every head
        query_states = o.cat(q_pass, q_rot)
        key_states = o.cat(k_pass, k_rot)
        del q_pass, q_rot, k_pass, k_rot
        attn_output = self.core_attention(query_states, key_states, value_states, mask, t, a, a, m.v_head_dim)
        del query_states, key_states, value_states
        return self.linear(attn_output, f"{pre}.o_proj")

    def _split(self, x: T, sizes: tuple[int, ...]) -> tuple[T, ...]:
        """torch.split into views; the backward concatenates the parts' gradients (one new tensor)."""
        outs = tuple(T(x.st, n, x.dt) for n in sizes)
        self.s.node("split", (x,), outs)
        return outs

    def attention(self, i: int, hidden_states: T, cos: T | None, sin: T | None, mask: T | None) -> T:
        o, s, spec, cfg = self.o, self.s, self.spec, self.cfg
        if spec.mla is not None:
            return self.mla_attention(i, hidden_states, cos, sin, mask)
        pre = f"layers.{i}.self_attn"
        b, q_len = cfg.batch, cfg.seq
        t = b * q_len
        a, kvh, d = spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
        if f"{pre}.qkv_proj.weight" in self.p:
            # one fused projection split into views (GPT-2 c_attn, Phi-3 qkv_proj, Falcon query_key_value)
            qkv = self.linear(hidden_states, f"{pre}.qkv_proj")
            query_states = T(qkv.st, t * a * d, qkv.dt)
            key_states = T(qkv.st, t * kvh * d, qkv.dt)
            value_states = T(qkv.st, t * kvh * d, qkv.dt)
            s.node("split", (qkv,), (query_states, key_states, value_states))
            del qkv
            if cos is not None and sin is not None:
                query_states, key_states = self.rope(query_states, key_states, cos, sin)
            attn_output = self.core_attention(query_states, key_states, value_states, mask, t, a, kvh, d)
            del query_states, key_states, value_states
            out = self.linear(attn_output, f"{pre}.o_proj")
            del attn_output
            return self.o.dropout(out, cfg.dropout) if spec.traits.residual_dropout else out
        query_states = o.view(self.linear(hidden_states, f"{pre}.q_proj"), copy_grad=True)
        if spec.qk_norm != "none":
            query_states = self.rmsnorm(query_states, f"{pre}.q_norm")
        key_states = o.view(self.linear(hidden_states, f"{pre}.k_proj"), copy_grad=True)
        if spec.qk_norm != "none":
            key_states = self.rmsnorm(key_states, f"{pre}.k_norm")
        value_states = o.view(self.linear(hidden_states, f"{pre}.v_proj"), copy_grad=True)
        if cos is not None and sin is not None:
            query_states, key_states = self.rope(query_states, key_states, cos, sin)
        attn_output = self.core_attention(query_states, key_states, value_states, mask, t, a, kvh, d)
        del query_states, key_states, value_states
        return self.linear(attn_output, f"{pre}.o_proj")

    def core_attention(self, q: T, k: T, v: T, mask: T | None, t: int, a: int, kvh: int, d: int) -> T:
        s, cfg = self.s, self.cfg
        b, sq = cfg.batch, cfg.seq
        if cfg.attn == "eager":
            return self.eager_attention(q, k, v, mask, t, a, kvh, d)
        if mask is not None and kvh < a:
            # no enable_gqa with a mask (use_gqa_in_sdpa): K/V repeated to every head
            k = self.repeat_kv(k, a // kvh)
            v = self.repeat_kv(v, a // kvh)
        q, k, v = s.ac_cast(q), s.ac_cast(k), s.ac_cast(v)  # type: ignore[assignment]
        bias = None
        if mask is not None:
            # the boolean mask becomes an additive float mask in the query dtype (sdp
            # convert_boolean_attn_mask),
            # which the kernel saves for backward
            bias = s.new(mask.n, q.dt)
        out = s.new(t * a * d, q.dt)
        lse = s.new(b * a * sq, "f32")
        s.node("multi", (q, k, v), (out, lse), (q, k, v, out, lse, bias))
        del lse, bias
        return out  # (b, s, a, d): transpose(1, 2).contiguous() of the kernel's output is a no-op

    def repeat_kv(self, x: T, n_rep: int) -> T:
        """``x[:, :, None].expand(...).reshape(b, kvh * n_rep, s, d)``: a view when there is one KV head (the
        merged dimension has size 1), a copy otherwise."""
        if n_rep == 1:
            return x
        if self.spec.num_kv_heads == 1 or x.n * n_rep == x.n:
            return T(x.st, x.n * n_rep, x.dt, x.rg, x.fn, x.idx)
        out = self.s.new(x.n * n_rep, x.dt)
        self.s.node("copy", (x,), (out,))
        return out

    def eager_attention(self, q: T, k: T, v: T, mask: T | None, t: int, a: int, kvh: int, d: int) -> T:
        """eager_attention_forward: matmul, * scaling, + mask, softmax in fp32, .to(query dtype), matmul with
        V,
        transpose(1, 2).contiguous()."""
        o, s, cfg = self.o, self.s, self.cfg
        b, sq = cfg.batch, cfg.seq
        scores_n = b * a * sq * sq
        key_states = self.repeat_kv(k, a // kvh)
        value_states = self.repeat_kv(v, a // kvh)
        attn_weights = o.mul(o.bmm(q, key_states, scores_n), None)
        if self.spec.traits.attn_logit_softcapping:
            # attn_logit_softcapping (Gemma-2 default 50): / cap, tanh (saves its output), * cap
            attn_weights = o.mul(o.tanh(o.mul(attn_weights, None)), None)
        if mask is not None:
            attn_weights = o.add(attn_weights, mask, scores_n)
        # softmax(..., dtype=float32): the input is converted first, the output saved
        f32 = s.cast(attn_weights, "f32")
        sm = s.new(scores_n, "f32")
        s.node("copy", (f32,), (sm,), (sm,))
        del f32, attn_weights
        attn_weights = s.cast(sm, q.dt)
        del sm
        attn_weights = o.dropout(attn_weights, cfg.dropout)
        attn_output = o.bmm(attn_weights, value_states, t * a * d)
        del attn_weights, key_states, value_states
        return o.clone(attn_output)

    # ---- MLP ---------------------------------------------------------------------------------------------
    def act(self, x: T) -> T:
        act = self.spec.activation
        o = self.o
        if act in ("silu", "swish"):
            return o.silu(x)
        if act == "gelu_new":
            # NewGELUActivation: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
            half = o.mul(x, None)
            inner = o.mul(o.add(x, o.mul(o.pow3(x), None)), None)
            th = o.tanh(inner)
            del inner
            one_plus = o.add(th, None)
            del th
            return o.mul(half, one_plus)
        return o.gelu_tanh(x)

    def mlp(self, i: int, x: T) -> T:
        pre = f"layers.{i}.mlp"
        o = self.o
        if self.spec.is_moe_layer(i):
            return self.moe(i, x)
        if not self.spec.mlp_gated:
            h = self.act(self.linear(x, f"{pre}.up_proj"))
            out = self.linear(h, f"{pre}.down_proj")
            del h
            return o.dropout(out, self.cfg.dropout) if self.spec.traits.residual_dropout else out
        prod = o.mul(self.act(self.linear(x, f"{pre}.gate_proj")), self.linear(x, f"{pre}.up_proj"))
        return self.linear(prod, f"{pre}.down_proj")

    def moe(self, i: int, x: T) -> T:
        """A sparse MoE block with transformers' grouped_mm experts (integrations/moe.py
        ``grouped_mm_experts_forward``): router linear, fp32 softmax, top-k (renormalised in place), tokens
        sorted by expert and gathered (t x k rows), gate_up and down grouped matmuls in the experts' dtype
        (grouped_mm is not autocast-enabled: the input is cast to the weight dtype), routing weights applied,
        rows un-permuted and summed over k; a shared expert (Qwen2-MoE, DeepSeek) runs beside them."""
        o, s, spec, cfg = self.o, self.s, self.spec, self.cfg
        moe = spec.moe
        assert moe is not None
        pre = f"layers.{i}.mlp"
        t = cfg.batch * cfg.seq
        h, e, k, fe = spec.hidden_size, moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size
        n_s = t * k
        # router (TopKRouter.forward)
        router_logits = self.linear(x, f"{pre}.gate")
        f32 = s.cast(router_logits, "f32")
        probs = s.new(t * e, "f32")
        s.node("copy", (f32,), (probs,), (probs,))
        del f32
        top = s.new(t * k, "f32")
        top_idx = s.new(t * k, "i64")
        s.node("copy", (probs,), (top,), (top_idx,))
        del probs
        if spec.traits.router_renormalize:
            # router_top_value /= router_top_value.sum(-1, keepdim=True): the in-place div saves a clone of
            # the
            # original values and the sum
            total = s.new(t, "f32")
            s.node("copy", (top,), (total,))
            original = s.new(t * k, "f32")
            s.node("pass", (top,), (original,))
            top2 = T(top.st, top.n, top.dt)
            s.node("mul", (original, total), (top2,), (original, total))
            top = top2
            del original, total, top2
        routing_weights = s.cast(top, router_logits.dt)
        del top
        # experts (grouped_mm_experts_forward)
        gu_w = self.p[f"{pre}.experts.gate_up_proj"].tensor
        dn_w = self.p[f"{pre}.experts.down_proj"].tensor
        expert_ids_g = s.new(n_s, "i64")
        perm = s.new(n_s, "i64")
        token_idx = s.new(n_s, "i64")  # perm // num_top_k
        selected = s.new(n_s * h, x.dt)
        s.node("copy", (x,), (selected,), (token_idx,))
        sample_weights_g = s.new(n_s, routing_weights.dt)
        s.node("copy", (routing_weights,), (sample_weights_g,), (perm,))
        histc_input = s.new(n_s, "f32")
        tokens_per_expert = s.new(e, "f32")
        offsets = s.new(e, "i32")
        del histc_input, tokens_per_expert
        up_rows = 2 * fe if spec.mlp_gated else fe
        proj_out = self._grouped(selected, gu_w, n_s * up_rows)
        del selected
        if spec.mlp_gated:
            gate = T(proj_out.st, n_s * fe, proj_out.dt)
            s.node("pass", (proj_out,), (gate,))
            up = T(proj_out.st, n_s * fe, proj_out.dt)
            s.node("pass", (proj_out,), (up,))
            del proj_out
            proj_out = o.mul(self.act(gate), up)
            del gate, up
        else:
            proj_out = self.act(proj_out)
        proj_out = self._grouped(proj_out, dn_w, n_s * h)
        weighted_out = o.mul(proj_out, sample_weights_g, n_s * h)
        del proj_out, sample_weights_g
        inv_perm = s.new(n_s, "i64")
        arange = s.new(n_s, "i64")
        del arange
        unperm = s.new(n_s * h, weighted_out.dt)
        s.node("copy", (weighted_out,), (unperm,), (inv_perm,))
        del weighted_out, inv_perm
        final = s.new(t * h, unperm.dt)
        s.node("pass", (unperm,), (final,))
        del unperm, expert_ids_g, perm, token_idx, offsets, routing_weights, router_logits
        final = s.cast(final, x.dt)
        if moe.shared_expert_intermediate_size:
            sh = f"{pre}.shared_experts"
            prod = o.mul(self.act(self.linear(x, f"{sh}.gate_proj")), self.linear(x, f"{sh}.up_proj"))
            sh_out = self.linear(prod, f"{sh}.down_proj")
            del prod
            if moe.shared_expert_gate:
                g = self.linear(x, f"{pre}.shared_expert_gate")
                sig = s.new(g.n, g.dt)
                s.node("copy", (g,), (sig,), (sig,))
                del g
                sh_out = o.mul(sig, sh_out, sh_out.n)
                del sig
            final = o.add(final, sh_out)
        return final

    def _grouped(self, x: T, w: T, n_out: int) -> T:
        """_grouped_mm(input.to(weight.dtype), weight, offs): saves the input and the (3-D) weight; backward
        gives the input's gradient and one for the whole expert tensor."""
        s = self.s
        x = s.cast(x, w.dt)
        out = s.new(n_out, w.dt)
        saved = []
        if x.fn is not None:
            saved.append(w)
        if w.fn is not None:
            saved.append(x)
        s.node("linear", (x, w), (out,), tuple(saved))
        return out

    # ---- decoder layer -------------------------------------------------------------------------------------
    def layer(
        self,
        i: int,
        hidden_states: T,
        cos: T | None,
        sin: T | None,
        mask: T | None,
        position_ids: T | None = None,
    ) -> T:
        """LlamaDecoderLayer.forward (pre-norm; Gemma-2/3 add post-norms; parallel attention+MLP)."""
        o, spec = self.o, self.spec
        self.s.tr.where = f"layer {i}"
        four = spec.norms_per_layer == 4
        residual = hidden_states
        hidden_states = self.rmsnorm(hidden_states, f"layers.{i}.norm0")
        if spec.parallel_attn_mlp:
            attn = self.attention(i, hidden_states, cos, sin, mask)
            mlp_out = self.mlp(i, hidden_states)
            del hidden_states
            return o.add(o.add(residual, attn), mlp_out)
        hidden_states = self.attention(i, hidden_states, cos, sin, mask)
        if four:
            hidden_states = self.rmsnorm(hidden_states, f"layers.{i}.norm1")
        hidden_states = o.add(residual, hidden_states)
        residual = hidden_states
        hidden_states = self.rmsnorm(hidden_states, f"layers.{i}.norm2" if four else f"layers.{i}.norm1")
        hidden_states = self.mlp(i, hidden_states)
        if four:
            hidden_states = self.rmsnorm(hidden_states, f"layers.{i}.norm3")
        return o.add(residual, hidden_states)

    # ---- whole model ---------------------------------------------------------------------------------------
    def rotary(self, x: T) -> tuple[T | None, T | None]:
        """LlamaRotaryEmbedding.forward: fp32 cos/sin [1, s, d], cast to the hidden states' dtype."""
        spec, s = self.spec, self.s
        if spec.position_embedding != "rope":
            return None, None
        d = spec.mla.qk_rope_head_dim if spec.mla is not None else spec.head_dim
        n = self.cfg.seq * d
        cos = s.cast(s.new(n, "f32"), x.dt)
        sin = s.cast(s.new(n, "f32"), x.dt)
        return cos, sin

    def rotary_kinds(self, layers: Sequence[int]) -> tuple[str, ...]:
        """Gemma-3 has a global and a local rotary embedding, computed when a layer of its kind exists."""
        if self.spec.position_embedding != "rope":
            return ()
        if not self.spec.traits.rotary_per_layer_type:
            return ("full_attention",)
        types = self.spec.resolved_layer_types
        return tuple(sorted({types[i] for i in layers}))

    def masks(self, dt: str) -> dict[str, T]:
        """create_causal_mask / create_sliding_window_causal_mask (masking_utils): eager gets a float
        [b, 1, s, s] mask per layer kind; sdpa needs none for causal layers (is_causal) and a boolean
        [1, 1, s, s] one for sliding layers only when the sequence is longer than the window."""
        spec, s, cfg = self.spec, self.s, self.cfg
        kinds = set(spec.resolved_layer_types)
        sq = cfg.seq
        out: dict[str, T] = {}
        for kind in sorted(kinds):
            sliding = kind == "sliding_attention" and spec.sliding_window is not None
            if cfg.attn == "eager":
                out[kind] = s.new(cfg.batch * sq * sq, dt)
            elif sliding and sq > (spec.sliding_window or sq):
                out[kind] = s.new(sq * sq, "bool")
        return out

    def model(self, ids: T, layers: Sequence[int]) -> T:
        """LlamaModel.forward; returns the final norm's output."""
        o, s, spec, cfg = self.o, self.s, self.spec, self.cfg
        t = cfg.batch * cfg.seq
        h = spec.hidden_size
        s.tr.where = "embedding"
        keep: list[T] = []  # locals of the model's forward that live until it returns
        if cfg.embedding:
            w = self.p["embed_tokens.weight"].tensor
            inputs_embeds = s.new(t * h, w.dt)
            s.node("copy", (w,), (inputs_embeds,), (ids,))
            if spec.traits.embedding_scale:
                inputs_embeds = o.mul(inputs_embeds, None)
            if spec.position_embedding == "learned":
                pw = self.p["embed_positions.weight"].tensor
                pos = s.new(cfg.seq * h, pw.dt)
                s.node("copy", (pw,), (pos,))
                keep += [inputs_embeds, pos]
                inputs_embeds = o.add(inputs_embeds, pos)
                del pos
            if spec.traits.residual_dropout:
                inputs_embeds = o.dropout(inputs_embeds, cfg.dropout)
            if "embedding_norm.weight" in self.p:  # BLOOM word_embeddings_layernorm
                inputs_embeds = self.rmsnorm(inputs_embeds, "embedding_norm")
            if "project_in.weight" in self.p:  # OPT-350m: 512-wide embeddings projected to the hidden size
                inputs_embeds = self.linear(inputs_embeds, "project_in")
        else:
            # activations received from the previous pipeline stage: a leaf that needs a gradient
            inputs_embeds = received_leaf(s, t * h, cfg.param_dt)
        masks = self.masks(inputs_embeds.dt)
        position_ids = s.new(cfg.seq, "i64", "activations")  # arange(s) + past_seen_tokens
        hidden_states = inputs_embeds
        keep.append(inputs_embeds)
        del inputs_embeds
        rotary = {kind: self.rotary(hidden_states) for kind in self.rotary_kinds(layers)}
        for i in layers:
            kind = spec.resolved_layer_types[i]
            cos, sin = rotary.get(
                kind if spec.traits.rotary_per_layer_type else "full_attention", (None, None)
            )
            mask = masks.get(kind)
            if cfg.gather == "unit":
                s.gather(i, (-1,))  # FSDP: the root unit (embeddings, head) stays gathered
            if cfg.grad_ckpt:
                # the checkpoint keeps every argument of the layer call (position_ids included)
                hidden_states = s.checkpoint(self.layer, i, hidden_states, cos, sin, mask, position_ids)
            else:
                hidden_states = self.layer(i, hidden_states, cos, sin, mask)
        s.tr.where = "final norm"
        if cfg.gather == "unit":
            s.gather(-1)
        s.unit = None
        if not cfg.lm_head:
            return hidden_states
        if "norm.weight" in self.p:
            hidden_states = self.rmsnorm(hidden_states, "norm")
        if "project_out.weight" in self.p:
            hidden_states = self.linear(hidden_states, "project_out")
        return hidden_states

    def forward_loss(self, ids: T, layers: Sequence[int]) -> T:
        """LlamaForCausalLM.forward(input_ids, labels=input_ids) -> loss (ForCausalLMLoss, mean reduction)."""
        s, spec, cfg = self.s, self.spec, self.cfg
        o = self.o
        last_hidden_state = self.model(ids, layers)
        if not cfg.lm_head:
            return last_hidden_state
        s.tr.where = "lm_head"
        t = cfg.batch * cfg.seq
        v = spec.vocab_size
        head = "lm_head" if "lm_head.weight" in self.p else None
        if head is None:
            w = self.p["embed_tokens.weight"].tensor
            logits = o.linear(last_hidden_state, w, self.w("lm_head.bias"), v, spec.token_embedding_dim)
        else:
            logits = self.linear(last_hidden_state, "lm_head")
        if spec.final_logit_softcapping:
            logits = o.mul(o.tanh(o.mul(logits, None)), None)
        if logits.st is not None:
            s.tr.retag(logits.st, logits.st.kind, "logits")
        s.tr.where = "loss"
        # ForCausalLMLoss: logits.float(), labels padded and shifted, cross_entropy = log_softmax + nll_loss
        lf = s.cast(logits, "f32", "logits")
        padded = s.new(cfg.batch * (cfg.seq + 1), "i64", "activations")
        # labels[..., 1:].contiguous(): a view for one sequence, a copy otherwise
        labels = s.new(t, "i64", "activations") if cfg.batch > 1 else padded
        ls = s.new(t * v, "f32", "logits")
        s.node("copy", (lf,), (ls,), (ls,))
        del lf
        loss = s.new(1, "f32")
        total_weight = s.new(1, "f32")
        s.node("copy", (ls,), (loss,), (labels, total_weight))
        del ls, labels, total_weight, padded
        self._logits = logits  # `outputs` keeps logits alive until the caller drops them
        self._last = last_hidden_state
        return loss

    def drop_outputs(self) -> None:
        """``del out``: the CausalLMOutputWithPast (logits, last hidden state) goes away before backward."""
        self._logits = None
        self._last = None


_BNB_SKIP = ("lm_head", "embed_tokens", "embed_positions", ".gate.weight", "shared_expert_gate", "norm")


def _bnb_quantizes(name: str, shape: tuple[int, ...]) -> bool:
    """transformers' replace_with_bnb_linear: every nn.Linear but lm_head (and the MoE router, kept in
    llm_int8_skip_modules by the model classes); fused 3-D expert tensors are not nn.Linear."""
    if len(shape) != 2 or not name.endswith(".weight"):
        return False
    return not any(k in name for k in _BNB_SKIP)


def _fuse_qkv(tensors: list) -> list:
    """Merge each layer's q/k/v projection tensors into one ``qkv_proj`` (same element count)."""
    from gpumem_gui.core.spec.params import Tensor

    out = []
    pending: dict[tuple[int | None, str], list] = {}
    for t in tensors:
        parts = t.name.rsplit(".", 2)
        if len(parts) == 3 and parts[1] in ("q_proj", "k_proj", "v_proj"):
            key = (t.layer, parts[2])
            pending.setdefault(key, []).append(t)
            if len(pending[key]) == 3:
                ts = pending.pop(key)
                rows = sum(x.shape[0] for x in ts)
                shape = (rows, *ts[0].shape[1:])
                out.append(Tensor(f"{parts[0]}.qkv_proj.{parts[2]}", shape, ts[0].component, t.layer))
            continue
        out.append(t)
    return out
