"""BART's encoder-decoder forward replayed on symbolic tensors (transformers 5.24
``models/bart/modeling_bart.py``), on :class:`~gpumem_gui.core.replay.seq2seq.Seq2SeqLM`'s stacks, attention,
cache and loss:

* ``BartEncoder.forward`` / ``BartDecoder.forward``: ``embed_tokens`` (``BartScaledWordEmbedding``: the lookup
  times ``embed_scale``, a new tensor even at 1.0), the learned positions (``BartLearnedPositionalEmbedding``:
  ``position_ids + 2``; the encoder's expanded to [batch, source], the decoder's [1, target] after
  ``arange + cache_length``), their sum, ``layernorm_embedding``, dropout; ``inputs_embeds`` and the position
  embeddings are locals alive until the stack returns. The decoder also builds ``torch.ones(batch, past +
  target)`` (fp32) and its causal mask (eager: a [b, 1, q, kv] float mask for the whole stack). No final norm.
* ``BartEncoderLayer`` / ``BartDecoderLayer`` (post-norm): ``residual + dropout(attention)`` then
  ``self_attn_layer_norm``; the decoder's ``encoder_attn`` and ``encoder_attn_layer_norm`` likewise; ``fc1``,
  the activation, ``activation_dropout``, ``fc2``, dropout, ``residual + ...``, ``final_layer_norm``. Eager's
  probabilities are held as ``_`` until the next attention's replace them.
* ``BartAttention``: T5's projections and kernels without a position bias (``scaling`` = head_dim ** -0.5).
* ``BartForConditionalGeneration.forward``: ``lm_head`` then ``+ final_logits_bias`` (a buffer in the weights'
  dtype: a new tensor of the promoted dtype, fp32 under autocast), ``CrossEntropyLoss`` over it.

MBart (``models/mbart/modeling_mbart.py``, :attr:`Seq2SeqSpec.pre_norm`): ``MBartEncoderLayer`` /
``MBartDecoderLayer`` normalise before each sub-layer (``residual = hidden_states``, the norm, the attention
or MLP, dropout, ``residual + ...``), and ``MBartEncoder`` / ``MBartDecoder`` end with ``layer_norm`` while
their locals (and the decoder's mask) are alive. Its ``shift_tokens_right`` (a clone of the labels, the last
non-pad token gathered into position 0) leaves the same ``[batch, target]`` decoder ids as BART's; the small
index tensors it makes die before the encoder runs. fp16's unconditional clamp is not modelled (fp16 is
refused for every encoder-decoder: replay/seq2seq.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from gpumem_gui.core.replay import mlp
from gpumem_gui.core.replay.autograd import Sim
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.model import CausalLM
from gpumem_gui.core.replay.seq2seq import Seq2SeqCache, Seq2SeqLM
from gpumem_gui.core.spec.model import ModelSpec


class BartLM(Seq2SeqLM):
    """BartForConditionalGeneration (:attr:`Seq2SeqSpec.block` ``bart``)."""

    _self_mask: T | None = None

    def norm(self, x: T, name: str) -> T:
        """nn.LayerNorm (F.layer_norm: the output, mean and rstd)."""
        return CausalLM.norm(self, x, name)

    def _eager_mask(self, q: int, kv: int, dt: str) -> T | None:
        """The decoder's causal mask, built once per stack (:meth:`_stack_input`)."""
        return self._self_mask

    def _residual_norm(self, residual: T, out: T, name: str) -> T:
        """``hidden_states = residual + dropout(out)``, then the LayerNorm ``name``."""
        o = self.o
        summed = o.add(residual, o.dropout(out, self.cfg.dropout))
        del out
        return self.region_norm(summed, name)

    def _stack_input(self, ids: T, rows: int, decoder: bool) -> tuple[T, list[T]]:
        """The embeddings of a stack (see the module docstring): (hidden states, the locals kept)."""
        o, s, cfg = self.o, self.s, self.cfg
        h, b, q = self.spec.hidden_size, cfg.batch, rows // cfg.batch
        s.region = "hidden_states"
        w = self.param("embed_tokens.weight")
        looked = s.new(rows * h, w.dt)
        s.node("copy", (w,), (looked,), (ids,))
        inputs_embeds = o.mul(looked, None)  # * embed_scale
        del looked
        s.region = "inputs"
        arange = s.new(q, "i64")
        if decoder:
            position_ids = s.new(q, "i64")  # arange(seq_length) + cache_length
            ones = s.new(b * (cfg.past + q), "f32")  # torch.ones(batch_size, mask_seq_length)
            if cfg.attn == "eager" and q > 1:  # create_causal_mask: a float [b, 1, q, kv] mask
                s.region = "mask"
                self._self_mask = s.new(b * q * (cfg.past + q), inputs_embeds.dt)
            del ones
            offset = s.new(q, "i64")  # position_ids.unsqueeze(0) + self.offset: [1, q]
            kept = [inputs_embeds, position_ids]
        else:
            offset = s.new(rows, "i64")  # arange(...).expand(bsz, -1) + self.offset: [b, q]
            kept = [inputs_embeds]
        del arange
        table = self.param(f"{'decoder' if decoder else 'encoder'}.embed_positions.weight")
        s.region = "hidden_states"
        positions = s.new(offset.n * h, table.dt)
        s.node("copy", (table,), (positions,), (offset,))
        del offset
        kept.append(positions)
        summed = o.add(inputs_embeds, positions, rows * h)
        stack = "decoder" if decoder else "encoder"
        hidden_states = self.region_norm(summed, f"{stack}.layernorm_embedding")
        del summed
        return o.dropout(hidden_states, cfg.dropout), kept

    def _stack_output(self, hidden_states: T, decoder: bool) -> T:
        """No final norm (MBart: ``layer_norm``): the last block's output (and the decoder's mask goes with
        the stack)."""
        if self.s2s.pre_norm:  # MBartEncoder / MBartDecoder: hidden_states = self.layer_norm(hidden_states)
            s = self.s
            s.tr.where = "final norm"
            hidden_states = self.region_norm(
                hidden_states, f"{'decoder' if decoder else 'encoder'}.layer_norm"
            )
        self._self_mask = None
        return hidden_states

    def _attentions(self, i: int, src: T | None) -> Iterator[tuple[T | None, str]]:
        """The attention sub-layers of block ``i`` in order, as (the keys' source, its norm's name): the
        self-attention, then the decoder's cross-attention over the encoder's output ``src``; the trace's
        ``where`` is set as each begins. The blocks' loops over them keep eager's probabilities (``_w``) and
        the sub-layer's output as the modeling code's locals do (one replaces the other's)."""
        s = self.s
        s.tr.where = f"block {i} attention"
        yield None, f"layers.{i}.norm0"
        if src is not None:
            s.tr.where = f"block {i} cross-attention"
            yield src, f"layers.{i}.norm_cross"

    def block(
        self, i: int, x: T, bias: T | None, src: T | None, cross_bias: T | None, cache: object
    ) -> tuple:
        """BartEncoderLayer / BartDecoderLayer (see the module docstring); returns (output, None, None)."""
        o, s = self.o, self.s
        c = cache if isinstance(cache, Seq2SeqCache) else None
        if self.s2s.pre_norm:
            return self._pre_norm_block(i, x, src, c), None, None
        h = x
        for kv_src, norm in self._attentions(i, src):
            out, _, _w = self.attend(i, h, kv_src, None, c)
            h = self._residual_norm(h, out, norm)
            del out
        s.tr.where = f"block {i} MLP"
        s.region = "mlp"
        pre = f"layers.{i}.mlp"
        act = o.dropout(mlp.act(self, self.linear(h, f"{pre}.up_proj")), self.s2s.activation_dropout)
        out = self.linear(act, f"{pre}.down_proj")
        del act
        s.region = "hidden_states"
        h = self._residual_norm(h, out, f"layers.{i}.norm1")
        del out, _w
        return h, None, None

    def _pre_norm_block(self, i: int, x: T, src: T | None, c: Seq2SeqCache | None) -> T:
        """MBartEncoderLayer / MBartDecoderLayer: each sub-layer is ``residual + dropout(f(norm(residual)))``;
        the normed input lives until the sub-layer returns (the layer's ``hidden_states`` variable)."""
        o, s, p = self.o, self.s, self.cfg.dropout
        for kv_src, norm in self._attentions(i, src):
            h = self.region_norm(x, norm)
            out, _, _w = self.attend(i, h, kv_src, None, c)
            del h
            x = o.add(x, o.dropout(out, p))
            del out
        s.tr.where = f"block {i} MLP"
        s.region = "mlp"
        pre = f"layers.{i}.mlp"
        h = self.region_norm(x, f"layers.{i}.norm1")
        up = mlp.act(self, self.linear(h, f"{pre}.up_proj"))
        del h  # hidden_states = self.activation_fn(self.fc1(hidden_states)): the normed input goes here
        act = o.dropout(up, self.s2s.activation_dropout)
        del up
        out = self.linear(act, f"{pre}.down_proj")
        del act
        s.region = "hidden_states"
        x = o.add(x, o.dropout(out, p))
        del out, _w
        return x

    def _logits_bias(self, logits: T) -> T:
        """``lm_logits + self.final_logits_bias``: a new tensor in the promoted dtype."""
        s = self.s
        dt = "f32" if "f32" in (logits.dt, self.cfg.param_dt) else logits.dt
        out = s.new(logits.n, dt)
        s.node("pass", (logits,), (out,))
        return out


def seq2seq_lm(sim: Sim, spec: ModelSpec, cfg: ReplayConfig, source: int | None = None) -> Seq2SeqLM:
    """The encoder-decoder of ``spec``: BART's layers or T5's (:attr:`Seq2SeqSpec.block`)."""
    assert spec.seq2seq is not None
    return (BartLM if spec.seq2seq.block == "bart" else Seq2SeqLM)(sim, spec, cfg, source)
