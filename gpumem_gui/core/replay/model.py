"""The one transformers causal-LM forward, replayed on symbolic tensors for inference and training alike.

The code follows the modeling files of transformers 5.24 statement by statement (``LlamaModel.forward``,
``LlamaDecoderLayer``, ``LlamaRMSNorm``, ``LlamaRotaryEmbedding``, ``masking_utils``, ``LlamaForCausalLM``
with ``logits_to_keep`` and ``ForCausalLMLoss``), so that Python's reference counting frees every
intermediate exactly when the real code drops it, and autograd saves what the real ops save. What other
architectures do differently is read from :class:`~gpumem_gui.core.spec.model.ArchTraits`; the attention
variants are in :mod:`.attention`, the feed-forward ones in :mod:`.mlp`, PEFT's LoRA and bitsandbytes' 4-bit
linears in :mod:`.adapters`.

With gradients on (training) no cache is kept and autograd saves what backward needs; with gradients off
(inference) the forward takes ``q`` new tokens after ``past`` cached ones, updates a :class:`KVCache`, and may
replay only the last layer of each kind (:class:`LayerPlan`). Nothing here is fitted: sizes are element
counts times dtype widths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

from gpumem_gui.core.replay import adapters, block, inputs, registry, tricks, vision_train
from gpumem_gui.core.replay import loss as losses
from gpumem_gui.core.replay import variants as _variants  # noqa: F401  the blocks and mixers register
from gpumem_gui.core.replay.autograd import Node, Param, Sim
from gpumem_gui.core.replay.cache import KVCache
from gpumem_gui.core.replay.config import LayerPlan, ReplayConfig, attn_as_run, every_layer
from gpumem_gui.core.replay.logits import causal_lm_loss, project
from gpumem_gui.core.replay.memory import DT_BYTES, T
from gpumem_gui.core.replay.ops import Ops
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import Tensor, text_tensors


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@lru_cache(maxsize=256)
def model_tensors(spec: ModelSpec) -> tuple[Tensor, ...]:
    """The parameter tensors as transformers builds them (fused projections where the model fuses them)."""
    return adapters.fuse_projections(
        tuple(text_tensors(spec)), spec.traits.fused_qkv, spec.traits.fused_gate_up and spec.mlp_gated
    )


@lru_cache(maxsize=256)
def lora_tensors(spec: ModelSpec, tower: str) -> tuple[Tensor, ...]:
    """The tensors LoRA targets are resolved over: the text model's and, as far as ``tower`` (the run's
    lora_vision_tower) reaches, the vision tower's linears (:func:`vision_train.tower_linears`)."""
    return model_tensors(spec) + vision_train.tower_linears(spec, tower)


@lru_cache(maxsize=256)
def lora_weights(spec: ModelSpec, targets: tuple[str, ...], tower: str, fused: bool = True) -> frozenset[str]:
    """The weights PEFT wraps with adapters for ``targets`` (see :func:`adapters.lora_targets`)."""
    return adapters.lora_targets(spec, lora_tensors(spec, tower), targets, fused)


def received_leaf(sim: Sim, n: int, dt: str) -> T:
    """A tensor received from another rank that needs a gradient (its gradient is sent back)."""
    x = sim.new(n, dt)
    nd = Node(sim, "acc", (), ((n, dt),), ())
    nd.seq = 1 << 62
    x.fn, x.idx = nd, 0
    return x


class CausalLM:
    """The parameters of one (rank's) model and its forward: to the logits (inference) or the loss."""

    def __init__(self, sim: Sim, spec: ModelSpec, cfg: ReplayConfig, cache: KVCache | None = None) -> None:
        self.s = sim
        self.o = Ops(sim, cfg.cpu_dropout)
        self.spec = spec
        self.cfg = attn_as_run(spec, cfg)  # no SDPA path (gpt-oss): transformers runs eager
        self.cache = cache
        self.p: dict[str, Param] = {}
        self.shape: dict[str, tuple[int, ...]] = {}
        self.quantized: set[str] = set()
        self.unused: set[str] = set()  # trainable parameters the text forward never uses
        self.embed_images: Callable[..., tuple[T, list[T]]] | None = None  # set by replay/step.py
        self.after_layer: Callable[[int, T], T] | None = None  # after each text layer (vision_train_qwen3.py)
        self._by_name = {t.name: t for t in model_tensors(spec)}
        lora = (cfg.lora_targets, cfg.tower_targets, not cfg.expert_linears)  # per-expert linears: v4
        self._lora = frozenset() if cfg.method == "full" else lora_weights(spec, *lora)
        self._logits: T | None = None
        self.alibi_bias: T | None = None
        self._last: T | None = None
        if cfg.weights_counted:
            self._build_params()
        if (cfg.activation_offload or cfg.offload_ckpt_inputs) and sim.grad_enabled:
            sim.offload = tricks.Offloader(inputs_only=not cfg.activation_offload)

    # ---- parameters ----------------------------------------------------------------------------------------
    @property
    def lora_names(self) -> frozenset[str]:
        """The weights PEFT wraps with adapters in this run (the vision tower's included, vision_train.py)."""
        return self._lora

    def _trainable(self, layer: int | None) -> bool:
        if self.cfg.method != "full":
            return False
        return not (layer is not None and layer < self.cfg.frozen_layers)

    def _held(self, t: Tensor) -> bool:
        """Whether this rank holds ``t`` (pipeline stages hold the embedding or the head only at the ends)."""
        cfg, spec = self.cfg, self.spec
        if (
            not cfg.embedding
            and t.component in ("embedding", "position_embedding")
            and not (cfg.lm_head and spec.tie_word_embeddings and t.component == "embedding")
        ):
            return False
        return cfg.lm_head or not (t.component == "lm_head" or t.name == "norm.weight")

    def _add(self, t: Tensor) -> None:
        cfg, s = self.cfg, self.s
        numel = _numel(t.shape)
        self.shape[t.name] = t.shape
        dt = "f32" if t.fp32 else cfg.param_dt  # kept in fp32 whatever the model's dtype (DeepSeek-V4)
        if not cfg.weights_counted:
            self.p[t.name] = Param(s, t.name, numel, dt, False, 0, 0, t.layer)
            return
        if cfg.method == "qlora" and adapters.bnb_quantizes(t.name, t.shape, cfg.quant_experts):
            self.p[t.name] = s.param(t.name, numel, dt, False, 0, t.layer)
            self.quantized.add(t.name)
        else:
            full = round(numel * DT_BYTES[dt])
            self.p[t.name] = s.param(t.name, numel, dt, self._trainable(t.layer), full, t.layer)
        if t.name in self._lora:
            adapters.add_lora(self, t)

    def _build_params(self) -> None:
        cfg, spec, s = self.cfg, self.spec, self.s
        for t in self._by_name.values():
            if self._held(t):
                self._add(t)
        if adapters.TIED_HEAD in self._lora and adapters.TIED_HEAD not in self._by_name and cfg.lm_head:
            head = adapters.linear_modules(spec, ())["lm_head"][0]  # the tied head's adapters
            self.shape[head.name] = head.shape
            adapters.add_lora(self, head)
        if cfg.method == "qlora" and cfg.quant_bytes:
            label = "bnb 8-bit linears" if cfg.quant_base == "int8" else "bnb 4-bit linears"
            s.param(label, 0, "u8", False, cfg.quant_bytes, None, sharded=False)
        vision_train.add_params(self)  # the vision tower and projector (trainable or one unused block)

    def has(self, name: str) -> bool:
        """Whether this rank holds parameter ``name`` (``layers.3.self_attn.q_proj.weight``)."""
        if self.cfg.weights_counted:
            return name in self.p
        t = self._by_name.get(name)
        return t is not None and self._held(t)

    def param(self, name: str) -> T:
        p = self.p.get(name)
        if p is None:  # inference builds the (weightless) parameters it touches on first use
            self._add(self._by_name[name])
            p = self.p[name]
        return p.tensor

    def w(self, name: str) -> T | None:
        return self.param(name) if self.has(name) else None

    def linear(self, x: T, name: str) -> T:
        """nn.Linear ``name`` (``...q_proj``), or PEFT's LoRA Linear around it, or a bnb Linear4bit base."""
        w_name = f"{name}.weight"
        w = self.param(w_name)
        n_out, n_in = self.shape[w_name]
        bias = self.w(f"{name}.bias")
        if f"{name}.lora_A" in self.p and name.endswith(f".{adapters.ROUTER}"):
            return self.o.linear(x, adapters.merged_weight(self, w, name, n_out, n_in), bias, n_out, n_in)
        if w_name in self.quantized or adapters.bnb4_inference(self.cfg, w_name, (n_out, n_in)):
            quantized = adapters.QUANTIZED_LINEARS.get(self.cfg.quant_base, adapters.linear4bit)
            result = quantized(self, x, bias, n_out, n_in)
        elif self.cfg.float8 and name.startswith("layers."):  # torchao converts the decoder's linears
            result = tricks.float8_linear(self, x, w, bias, n_out, n_in)
        else:
            result = self.o.linear(x, w, bias, n_out, n_in)
        if f"{name}.lora_A" not in self.p:
            return result
        return adapters.lora(self, x, result, name, n_out, n_in)

    # ---- norms -----------------------------------------------------------------------------------------
    def norm(self, x: T, name: str) -> T:
        """LlamaRMSNorm (Gemma's ``(1 + w)`` variant), or F.layer_norm for LayerNorm models."""
        o, s, spec = self.o, self.s, self.spec
        if spec.traits.layernorm_ops:  # Cohere2LayerNorm: op by op in fp32 (replay/cohere.py)
            return registry.norm("layernorm_ops")(self, x, name)
        w = self.param(f"{name}.weight")
        width = self.shape[f"{name}.weight"][0]
        if spec.norm == "layernorm":
            b = self.w(f"{name}.bias")
            rows = x.n // width
            out = s.new(x.n, x.dt)
            mean = s.new(rows, "f32")
            rstd = s.new(rows, "f32")
            s.node("multi", (x, w, b), (out,), (x, w, b, mean, rstd))
            return out
        input_dtype = x.dt
        if self.cfg.compile and s.grad_enabled:  # torch.compile: one fused kernel (replay/tricks.py)
            return tricks.compiled_rms_norm(self, x, w)
        if spec.traits.norm_product_fp32:  # GptOssRMSNorm
            return registry.norm("norm_product_fp32")(self, x, w, width)
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

    def region_norm(self, x: T, name: str) -> T:
        """A decoder layer's own norm, its tensors tagged ``norm``."""
        s = self.s
        prev, s.region = s.region, "norm"
        out = self.norm(x, name)
        s.region = prev
        return out

    def layer(
        self, i: int, hidden_states: T, cos: T | None, sin: T | None, mask: T | None, *_: object
    ) -> tuple[T, T | None]:
        """One decoder layer (:func:`.block.decoder_layer`); a method so checkpointing can recompute it."""
        return block.decoder_layer(self, i, hidden_states, cos, sin, mask)

    def _first_hidden_states(self, ids: T) -> tuple[T, list[T]]:
        """The first layer's input (the embedding's output, or the previous pipeline stage's; with a trainable
        vision tower, the images scattered in) and what the model's forward still holds of it."""
        s, cfg = self.s, self.cfg
        if cfg.embedding:
            hidden_states, keep = block.sp_embedding(self, *inputs.embed(self, ids))
            partial = cfg.ckpt_every > 1 or cfg.ckpt_policy != "full" or s.offload is not None
            if cfg.grad_ckpt and partial and hidden_states.fn is None and s.grad_enabled:
                # PEFT + gradient checkpointing: enable_input_require_grads() makes the embedding output a
                # leaf that requires a gradient (peft tuners_utils _prepare_model_for_gradient_checkpointing);
                # it matters where the first layer is not (fully) checkpointed or its input is offloaded
                # (with plain checkpointing the checkpoint keeps it anyway, and the replay leaves it out). Its
                # AccumulateGrad node holds it for as long as the graph lives
                leaf = Node(s, "acc", (), ((hidden_states.n, hidden_states.dt),), (hidden_states.st,))
                leaf.seq = 1 << 62
                hidden_states.fn, hidden_states.idx = leaf, 0
        else:  # activations received from the previous pipeline stage: a leaf that needs a gradient
            hidden_states = received_leaf(s, block.sp_residual(self), cfg.param_dt)
            keep = [hidden_states]
        if self.embed_images is not None:  # a trainable vision tower on the prompt's images (vision_train.py)
            hidden_states, keep = self.embed_images(self, hidden_states, keep)
        return hidden_states, keep

    # ---- whole model --------------------------------------------------------------------------------------
    def model(self, ids: T, plan: LayerPlan) -> T:
        """LlamaModel.forward over the plan's layers; returns the final norm's output (a pipeline stage
        without the head: the last layer's output)."""
        s, spec, cfg = self.s, self.spec, self.cfg
        own = registry.model_forward(self)  # Gemma3nTextModel (replay/altup.py), Gemma4TextModel (gemma4.py)
        if own is not None:
            return own(self, ids, plan)
        s.tr.where = "embedding"
        s.region = "hidden_states"
        if s.offload is not None:  # torchtune: `with activations_handling_ctx: outputs = model(**batch)`
            s.offload.active = True
        hidden_states, keep = self._first_hidden_states(ids)
        s.region = "mask"
        alibi = self.alibi_bias = inputs.alibi(self, hidden_states.dt)
        masks = inputs.masks(self, hidden_states.dt)
        if alibi is not None and spec.traits.block == "falcon":  # FalconModel folds ALiBi into one float mask
            masks = {
                k: s.new(cfg.batch * spec.num_attention_heads * cfg.q * cfg.kv_len, hidden_states.dt)
                for k in masks
            }
        s.region = "inputs"
        position_ids = s.new(cfg.q, "i64")  # arange(q) + past_seen_tokens
        s.region = "rope"
        rotary = {
            kind: inputs.rotary(self, hidden_states)
            for kind in inputs.rotary_kinds(self, [i for _, i in plan.segments])
        }
        s.region = "hidden_states"
        per_type = spec.traits.rotary_per_layer_type
        # FalconModel / BloomModel keep the previous layer's (hidden, attn_weights) until the next one returns
        keeps_outputs = spec.traits.block in ("falcon", "bloom")
        _previous: T | None = None  # held, not read: what the model's loop keeps alive
        for first, i in plan.segments:
            if i > first:  # layers first..i-1 run unreplayed: their output and their caches
                if any(hidden_states is k for k in keep):  # still a local of the model's forward
                    hidden_states = s.new(cfg.tokens * spec.hidden_size, hidden_states.dt)
                if self.cache is not None:
                    self.cache.skip(first, i, cfg.q)
                if keeps_outputs and cfg.attn == "eager":
                    s.region = "attention"
                    _previous = s.new(
                        cfg.batch * spec.num_attention_heads * cfg.q * cfg.kv_len, hidden_states.dt
                    )
                    s.region = "hidden_states"
            kind = spec.resolved_layer_types[i]
            cos, sin = rotary.get(kind if per_type else "full_attention", (None, None))
            s.hooks.enter_unit(s, i, (-1,))  # FSDP: the root unit (embeddings, head) stays gathered
            if cfg.grad_ckpt and (i + 1) % cfg.ckpt_every == 0:  # torchtitan layer SAC: every N-th layer
                # the checkpoint keeps every argument of the layer call (position_ids included)
                hidden_states, weights = s.checkpoint(
                    self.layer,
                    i,
                    hidden_states,
                    cos,
                    sin,
                    masks.get(kind),
                    position_ids,
                    policy=tricks.OpSelectiveAC() if cfg.ckpt_policy == "selective-op" else None,
                )
            else:
                hidden_states, weights = self.layer(i, hidden_states, cos, sin, masks.get(kind))
            _previous = weights if keeps_outputs else None
            del weights
            if self.after_layer is not None:  # Qwen3VLTextModel._deepstack_process (vision_train_qwen3.py)
                hidden_states = self.after_layer(i, hidden_states)
        self.alibi_bias = None
        for hook in registry.AFTER_LAYERS:  # GlmMoeDsaModel's last top-k dies here (replay/dsa.py)
            hook(self)
        s.tr.where = "final norm"
        s.hooks.enter_unit(s, -1)
        s.unit = None
        if not cfg.lm_head:
            return hidden_states
        s.region = "norm"
        if self.has("norm.weight"):
            hidden_states = self.norm(hidden_states, "norm")
        if self.has("project_out.weight"):
            s.region = "hidden_states"
            hidden_states = self.linear(hidden_states, "project_out")
        return hidden_states

    def head(self, last_hidden_state: T) -> T:
        """The LM head over the kept positions (``logits_to_keep``), with Gemma-2's final soft-capping."""
        s, spec, cfg = self.s, self.spec, self.cfg
        s.tr.where = "lm_head"
        s.region = "hidden_states"  # an autocast copy of the input belongs to the activations
        keep = cfg.logits_to_keep or cfg.q
        rows = cfg.batch * keep
        x = last_hidden_state if keep == cfg.q else last_hidden_state.view(rows * spec.token_embedding_dim)
        x = block.sp_gather(self, x, rows * spec.token_embedding_dim)  # sequence parallelism: all tokens
        logits = project(self, x)
        del x
        logits = block.gather_logits(self, logits)  # a tensor-parallel head gathering the full vocabulary
        s.tr.retag(logits.st, logits.st.kind, "logits")  # type: ignore[arg-type]
        s.region = "logits"
        logits = self.o.mul(logits, None) if spec.traits.logits_scaled else logits  # Cohere2 logit_scale
        logits = s.cast(logits, "f32") if spec.traits.logits_float else logits  # NemotronH .float()
        if spec.final_logit_softcapping:  # logits / cap; tanh; * cap (each replaces the previous)
            logits = self.o.mul(logits, None)
            logits = self.o.tanh(logits)
            logits = self.o.mul(logits, None)
        return logits

    def forward_logits(self, ids: T, plan: LayerPlan) -> T | None:
        """``model(input_ids, use_cache=True, logits_to_keep=...)``: the logits (None on a pipeline stage
        without the head); the model's locals are gone when it returns, the outputs hold the logits."""
        last_hidden_state = self.model(ids, plan)
        if not self.cfg.lm_head:
            return None
        return self.head(last_hidden_state)

    def forward_loss(self, ids: T, layers: Sequence[int]) -> T:
        """LlamaForCausalLM.forward(input_ids, labels=input_ids) -> loss (ForCausalLMLoss, mean reduction)."""
        s, cfg = self.s, self.cfg
        for narrow in registry.TEXT_LAYERS:  # Llama 3.2 Vision: no cross-attention without images
            layers = narrow(self, layers)
        last_hidden_state = self.model(ids, every_layer(layers))
        self.after_layer = None  # the inner model returned: its locals (Qwen3-VL's deepstack embeds) die
        if s.offload is not None:  # the head and the loss run outside the offloading hooks
            s.offload.active = False
        if not cfg.lm_head:
            return last_hidden_state
        if cfg.loss != "standard":  # the framework's own loss (replay/loss.py)
            return losses.LOSSES[cfg.loss](self, last_hidden_state)
        logits = self.head(last_hidden_state)
        loss = causal_lm_loss(self, logits)
        self._logits = logits  # `outputs` keeps logits alive until the caller drops them
        self._last = last_hidden_state
        return loss

    def drop_outputs(self) -> None:
        """``del out``: the CausalLMOutputWithPast (logits, last hidden state) goes away before backward."""
        self._logits = None
        self._last = None
