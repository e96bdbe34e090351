"""The encoder-decoder forward (T5, mT5, UMT5) replayed on symbolic tensors.

It follows transformers 5.24 ``models/t5/modeling_t5.py`` statement by statement:

* ``T5Stack.forward``: the shared embedding, dropout, the blocks (the first block's relative position bias
  passed to every later one; in the decoder also the cross-attention's zero bias), ``final_layer_norm``.
* ``T5LayerNorm``: ``x.to(float32).pow(2).mean(-1)`` (the fp32 copy dies after the power), ``x * rsqrt(...)``
  (an fp32 product), cast to the 16-bit weight dtype, ``weight * x``.
* ``T5Block``: ``T5LayerSelfAttention`` (norm, attention, ``x + dropout(out)``), in the decoder
  ``T5LayerCrossAttention`` (the keys and values of the encoder output, cached once per generation by
  ``EncoderDecoderCache``), ``T5LayerFF`` (norm, ``T5DenseActDense``: ``wo(act(wi(x)))``, or
  ``T5DenseGatedActDense``: ``wo(act(wi_0(x)) * wi_1(x))`` with both factors alive until it returns).
* ``T5ForConditionalGeneration.forward``: the decoder output scaled by ``d_model ** -0.5``
  (``scale_decoder_outputs``), ``lm_head`` over every target position (no ``logits_to_keep``).

The attention and the bias are in :mod:`.seq2seq_attention`. Parameters and linears are
:class:`~gpumem_gui.core.replay.model.CausalLM`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.replay import mlp
from gpumem_gui.core.replay import seq2seq_attention as attn
from gpumem_gui.core.replay.autograd import Sim
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.model import CausalLM
from gpumem_gui.core.spec.model import ModelSpec


@dataclass
class Seq2SeqCache:
    """``EncoderDecoderCache``: per decoder block, the self-attention keys/values (``past`` target tokens,
    concatenated per step) and the cross-attention keys/values (``source`` tokens, filled by the first
    step)."""

    self_kv: dict[int, tuple[T, T]] = field(default_factory=dict)
    cross_kv: dict[int, tuple[T, T]] = field(default_factory=dict)

    def stored_bytes(self) -> int:
        return sum(k.st.nbytes + v.st.nbytes for k, v in [*self.self_kv.values(), *self.cross_kv.values()])


def check_seq2seq_run(cfg: ReplayConfig) -> None:
    """What the encoder-decoder replay models: one rank with the whole model, its own loss."""
    if not (cfg.lm_head and cfg.embedding) or cfg.sequence_shards > 1 or cfg.logits_gather > 1:
        raise GpumemInputError("parallelism is not modelled for encoder-decoders", field="tp")
    if cfg.float8 or cfg.activation_offload or cfg.offload_ckpt_inputs or cfg.ckpt_policy != "full":
        raise GpumemInputError("framework tricks are not modelled for encoder-decoders", field="framework")
    if cfg.loss != "standard":
        raise GpumemInputError("encoder-decoders are modelled with their own loss only", field="loss")
    if cfg.param_dt == "f16" or cfg.autocast == "f16":
        raise GpumemInputError(
            "fp16 is not modelled for T5 (T5Block clamps inf values in fp16, extra tensors per block)",
            field="compute_dtype",
        )


class Seq2SeqLM(CausalLM):
    """An encoder-decoder: ``encode`` over ``source`` tokens, ``decode`` over ``cfg.q`` target tokens after
    ``cfg.past`` cached ones."""

    def __init__(self, sim: Sim, spec: ModelSpec, cfg: ReplayConfig, source: int | None = None) -> None:
        check_seq2seq_run(cfg)
        assert spec.seq2seq is not None
        self.source = cfg.q if source is None else source  # training: labels = input ids, one length
        self.s2s = spec.seq2seq
        super().__init__(sim, spec, cfg, None)

    # ---- pieces ---------------------------------------------------------------------------------------
    def norm(self, x: T, name: str) -> T:
        """T5LayerNorm (see the module docstring)."""
        o, s = self.o, self.s
        w = self.param(f"{name}.weight")
        width = self.shape[f"{name}.weight"][0]
        x32 = s.cast(x, "f32")
        squared = o.pow2(x32)
        del x32
        variance = o.mean_last(squared, width)
        del squared
        shifted = o.add(variance, None)
        inv = o.rsqrt(shifted)
        del shifted
        hs = o.mul(x, inv, x.n)
        del inv
        if w.dt in ("bf16", "f16"):
            hs = s.cast(hs, w.dt)
        out = o.mul(w, hs, hs.n)
        del hs, variance
        return out

    def _feed_forward(self, i: int, x: T) -> T:
        """T5LayerFF: norm, DenseReluDense, ``x + dropout(...)``."""
        o, s, cfg = self.o, self.s, self.cfg
        pre = f"layers.{i}.mlp"
        forwarded = self.region_norm(x, f"layers.{i}.norm1")
        s.region = "mlp"
        if self.spec.mlp_gated:  # T5DenseGatedActDense
            hidden_gelu = mlp.act(self, self.linear(forwarded, f"{pre}.gate_proj"))
            hidden_linear = self.linear(forwarded, f"{pre}.up_proj")
            h = self._to_wo(o.dropout(o.mul(hidden_gelu, hidden_linear), cfg.dropout), pre)
            out = self.linear(h, f"{pre}.down_proj")
            del hidden_gelu, hidden_linear, h
        else:  # T5DenseActDense
            h = o.dropout(mlp.act(self, self.linear(forwarded, f"{pre}.up_proj")), cfg.dropout)
            h = self._to_wo(h, pre)
            out = self.linear(h, f"{pre}.down_proj")
            del h
        del forwarded
        s.region = "hidden_states"
        return o.add(x, o.dropout(out, cfg.dropout))

    def _to_wo(self, h: T, pre: str) -> T:
        """``hidden_states.to(self.wo.weight.dtype)`` when they differ (autocast: a bf16 activation, an fp32
        weight): a copy the ``wo`` linear casts back."""
        return self.s.cast(h, self.param(f"{pre}.down_proj.weight").dt)

    def _attention(
        self, i: int, x: T, src: T | None, bias: T | None, cache: Seq2SeqCache | None
    ) -> tuple[T, T | None, T | None]:
        """T5LayerSelfAttention / T5LayerCrossAttention (``src``: the encoder output): norm, attention,
        ``x + dropout(out)``; (output, the position bias, eager's probabilities)."""
        normed = self.region_norm(x, f"layers.{i}.{'norm_cross' if src is not None else 'norm0'}")
        out, bias, weights = self.attend(i, normed, src, bias, cache)
        del normed
        return self.o.add(x, self.o.dropout(out, self.cfg.dropout)), bias, weights

    def attend(
        self, i: int, normed: T, src: T | None, bias: T | None, cache: Seq2SeqCache | None
    ) -> tuple[T, T | None, T | None]:
        """T5Attention / BartAttention of block ``i`` over ``normed`` (keys and values from ``src`` for the
        cross-attention, or from the cache): (the output projection, the position bias, eager's
        probabilities). BART has no position bias (None throughout)."""
        o, s, cfg = self.o, self.s, self.cfg
        cross = src is not None
        pre = f"layers.{i}.{'cross_attn' if cross else 'self_attn'}"
        decoder = i >= self.s2s.encoder_layers
        q = cfg.q if decoder else self.source
        kv = self.source if cross else (cfg.past + q if decoder else q)
        s.region = "attention"
        qs = o.view(self.linear(normed, f"{pre}.q_proj"), copy_grad=True)
        if cross and cache is not None and i in cache.cross_kv:  # is_updated: the cached keys and values
            k, v = cache.cross_kv[i]
        else:
            kv_in = src if src is not None else normed
            k = o.view(self.linear(kv_in, f"{pre}.k_proj"), copy_grad=True)
            v = o.view(self.linear(kv_in, f"{pre}.v_proj"), copy_grad=True)
            if cache is not None:
                k, v = self._update(cache.cross_kv if cross else cache.self_kv, i, k, v)
        if bias is None and self.s2s.block == "t5":
            if self.has(f"{pre}.relative_attention_bias.weight"):
                bias = attn.compute_bias(self, i, q, kv, bidirectional=not decoder)
            else:
                bias = attn.zero_bias(self, q, kv, qs.dt)
        if cfg.attn == "eager":
            mask = self._eager_mask(q, kv, qs.dt) if decoder and not cross else None
            out, weights = attn.eager(self, qs, k, v, bias, mask, q, kv, cache is None)
            del mask
        else:  # the self-attention bias is a permuted lookup (copied by contiguous()), the cross one zeros
            out, weights = attn.sdpa(self, qs, k, v, bias, q, kv, not cross, decoder and not cross), None
        del qs, k, v
        out = self.linear(out, f"{pre}.o_proj")
        if self.s2s.bias_every_layer:  # UMT5Attention: its own bias, a local gone when it returns
            bias = None
        s.region = "hidden_states"
        return out, bias, weights

    def _eager_mask(self, q: int, kv: int, dt: str) -> T | None:
        """create_causal_mask for eager attention: a float [b, 1, q, kv] mask (none for a single query)."""
        if q == 1:
            return None
        s = self.s
        prev, s.region = s.region, "mask"
        out = s.new(self.cfg.batch * q * kv, dt)
        s.region = prev
        return out

    def _update(self, store: dict[int, tuple[T, T]], i: int, k: T, v: T) -> tuple[T, T]:
        """DynamicLayer.update: ``torch.cat`` onto the stored keys, then the values (each old one freed as
        its concatenation replaces it)."""
        s = self.s
        prev = store.pop(i, None)
        prev_k, prev_v = prev if prev is not None else (None, None)
        del prev
        k_full = s.new(k.n + (prev_k.n if prev_k is not None else 0), k.dt, "kv_cache")
        del prev_k
        v_full = s.new(v.n + (prev_v.n if prev_v is not None else 0), v.dt, "kv_cache")
        del prev_v
        store[i] = (k_full, v_full)
        return k_full, v_full

    # ---- stacks -----------------------------------------------------------------------------------------
    def _embed(self, ids: T, rows: int) -> T:
        """``embed_tokens(input_ids)`` (the shared table) and dropout."""
        s = self.s
        s.region = "hidden_states"
        w = self.param("embed_tokens.weight")
        out = s.new(rows * self.spec.hidden_size, w.dt)
        s.node("copy", (w,), (out,), (ids,))
        return self.o.dropout(out, self.cfg.dropout)

    def block(
        self, i: int, x: T, bias: T | None, src: T | None, cross_bias: T | None, cache: object
    ) -> tuple:
        """T5Block: self-attention, cross-attention (decoder), feed-forward; returns (output, the self bias,
        the cross bias)."""
        s = self.s
        c = cache if isinstance(cache, Seq2SeqCache) else None
        s.tr.where = f"block {i} attention"
        x, bias, _w = self._attention(i, x, None, bias, c)  # UMT5: bias None, computed per block
        if src is not None:
            s.tr.where = f"block {i} cross-attention"
            x, cross_bias, _w = self._attention(i, x, src, cross_bias, c)
        s.tr.where = f"block {i} MLP"
        x = self._feed_forward(i, x)
        del _w
        return x, bias, cross_bias

    def _stack(self, ids: T, rows: int, layers: range, src: T | None, cache: Seq2SeqCache | None) -> T:
        """T5Stack.forward (BartEncoder / BartDecoder) over ``layers``: the stack's output."""
        s, cfg = self.s, self.cfg
        s.tr.where = "embedding"
        hidden_states, kept = self._stack_input(ids, rows, src is not None)
        bias: T | None = None
        cross_bias: T | None = None
        for i in layers:
            s.hooks.enter_unit(s, i, (-1,))
            if cfg.grad_ckpt and s.grad_enabled:  # GradientCheckpointingLayer
                hidden_states, bias, cross_bias = s.checkpoint(
                    self.block, i, hidden_states, bias, src, cross_bias, cache
                )
            else:
                hidden_states, bias, cross_bias = self.block(i, hidden_states, bias, src, cross_bias, cache)
        s.hooks.enter_unit(s, -1)
        s.unit = None
        del bias, cross_bias
        out = self._stack_output(hidden_states, src is not None)
        del hidden_states, kept
        s.region = "hidden_states"
        if self.s2s.block == "t5":  # T5Stack: dropout after the final norm, once its locals are gone
            out = self.o.dropout(out, cfg.dropout)
        return out

    def _stack_input(self, ids: T, rows: int, decoder: bool) -> tuple[T, list[T]]:
        """The embedded input of a stack and the locals T5Stack.forward keeps until it returns
        (``inputs_embeds``)."""
        hidden_states = self._embed(ids, rows)
        return hidden_states, [hidden_states]

    def _stack_output(self, hidden_states: T, decoder: bool) -> T:
        """T5Stack.final_layer_norm."""
        s = self.s
        s.tr.where = "final norm"
        s.region = "norm"
        return self.norm(hidden_states, "norm" if decoder else "encoder_norm")

    def encode(self, ids: T) -> T:
        """``model.get_encoder()(input_ids)``: the encoder's last hidden state [b, source, d]."""
        return self._stack(ids, self.cfg.batch * self.source, range(self.s2s.encoder_layers), None, None)

    def decode(self, ids: T, encoder_out: T, cache: Seq2SeqCache | None) -> T:
        """The decoder over ``cfg.q`` target tokens, the output scaling and ``lm_head``: the logits."""
        s, spec, cfg = self.s, self.spec, self.cfg
        layers = range(self.s2s.encoder_layers, spec.num_layers)
        out = self._stack(ids, cfg.tokens, layers, encoder_out, cache)
        s.tr.where = "lm_head"
        s.region = "hidden_states"
        if self.s2s.scale_decoder_outputs:
            out = self.o.mul(out, None)
        if self.has("lm_head.weight"):  # an untied head (BartConfig.tie_word_embeddings false)
            logits = self.linear(out, "lm_head")
        else:
            w = self.param("embed_tokens.weight")
            logits = self.o.linear(out, w, None, spec.vocab_size, spec.hidden_size)
        del out
        logits = self._logits_bias(logits)
        s.tr.retag(logits.st, logits.st.kind, "logits")  # type: ignore[arg-type]
        s.region = "logits"
        return logits

    def _logits_bias(self, logits: T) -> T:
        """What follows ``lm_head`` (T5: nothing)."""
        return logits

    # ---- training ---------------------------------------------------------------------------------------
    def forward_loss(self, ids: T, layers: Sequence[int]) -> T:
        """``model(input_ids=ids, labels=ids, use_cache=False).loss`` (T5ForConditionalGeneration.forward;
        BartForConditionalGeneration.forward shifts first): the encoder, ``_shift_right(labels)``
        (``new_zeros``, a clone of ``labels[..., :-1]``, the ``== -100`` mask), the teacher-forced decoder and
        ``lm_head``, ``CrossEntropyLoss`` over the logits (``log_softmax``, in fp32 under autocast, then
        ``nll_loss``). ``layers``: every block (one rank)."""
        s, cfg = self.s, self.cfg
        encoder_out = self.encode(ids) if self.s2s.block == "t5" else None
        s.tr.where = "shift right"  # BART's shift_tokens_right runs before the encoder
        s.region = "inputs"
        decoder_ids = s.new(cfg.tokens, "i64")
        clone = s.new(cfg.batch * (cfg.q - 1), "i64")
        del clone
        pad = s.new(cfg.tokens, "bool")
        del pad
        encoder_out = self.encode(ids) if encoder_out is None else encoder_out
        logits = self.decode(decoder_ids, encoder_out, None)
        del decoder_ids
        s.tr.where = "loss"
        dt = "f32" if s.autocast is not None else logits.dt
        x = s.cast(logits, dt)
        ls = s.new(cfg.tokens * self.spec.vocab_size, dt)
        s.node("copy", (x,), (ls,), (ls,))
        del x
        s.region = "hidden_states"
        loss = s.new(1, dt)
        total_weight = s.new(1, dt)
        s.node("copy", (ls,), (loss,), (ids, total_weight))  # labels.view(-1): the input ids
        del ls, total_weight
        self._logits, self._last = logits, encoder_out  # Seq2SeqLMOutput: logits, encoder_last_hidden_state
        return loss
