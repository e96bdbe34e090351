"""The encoder forward (BERT, RoBERTa) replayed on symbolic tensors, for inference and fine-tuning alike.

It follows transformers 5.24 ``models/bert/modeling_bert.py`` statement by statement (RoBERTa's
``modeling_roberta.py`` differs in its position ids and its classification head, read from
:class:`~gpumem_gui.core.spec.encoder.EncoderSpec`):

* ``BertEmbeddings.forward``: word, token-type and position lookups summed into new tensors, ``LayerNorm``,
  dropout; RoBERTa first computes its position ids from the input ids
  (``create_position_ids_from_input_ids``).
* ``create_bidirectional_mask`` returns no mask without padding (``_ignore_bidirectional_mask_sdpa``; eager:
  ``allow_is_bidirectional_skip``), so attention runs unmasked and not causal.
* ``BertLayer``: ``BertSelfAttention`` (query/key/value views, the shared attention kernel of
  :mod:`.attention`; eager's probabilities held by ``BertLayer.forward`` as ``_`` until it returns),
  ``BertSelfOutput`` (dense, dropout, ``LayerNorm(x + input)``), ``BertIntermediate`` (dense, GELU),
  ``BertOutput`` (dense, dropout, ``LayerNorm(x + attention_output)``); post-norm, no final norm, no KV cache.
* The heads (``BertPooler`` + classifier, ``RobertaClassificationHead``, token classifier,
  ``BertOnlyMLMHead``) and ``CrossEntropyLoss`` over their logits (``log_softmax`` + ``nll_loss``; under
  autocast ``log_softmax`` runs in fp32).

Parameters, linears (LoRA included) and norms are :class:`~gpumem_gui.core.replay.model.CausalLM`'s; PEFT's
task types add what they add for a head (``modules_to_save``: a trainable copy of the classifier, no LoRA in
it; :meth:`EncoderModel._build_params`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.replay import attention, encoder_deberta, encoder_modern, mlp
from gpumem_gui.core.replay.adapters import ALL_LINEAR
from gpumem_gui.core.replay.autograd import Sim
from gpumem_gui.core.replay.config import LayerPlan, ReplayConfig, every_layer
from gpumem_gui.core.replay.memory import DT_BYTES, T
from gpumem_gui.core.replay.model import CausalLM
from gpumem_gui.core.spec.encoder import check_positions
from gpumem_gui.core.spec.encoder_params import saved_module
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import Tensor


def check_encoder_run(cfg: ReplayConfig) -> None:
    """What the encoder replay models: one rank with the whole model, the model's own loss."""
    if not (cfg.lm_head and cfg.embedding) or cfg.sequence_shards > 1 or cfg.logits_gather > 1:
        raise GpumemInputError("tensor and pipeline parallelism are not modelled for encoders", field="tp")
    if cfg.loss != "standard":
        raise GpumemInputError(
            "encoders are modelled with their own loss (CrossEntropyLoss) only", field="loss"
        )
    if cfg.float8 or cfg.activation_offload or cfg.offload_ckpt_inputs or cfg.ckpt_policy != "full":
        raise GpumemInputError(
            "framework tricks (float8, activation offload, selective checkpointing) are not modelled for "
            "encoders",
            field="framework",
        )


class EncoderModel(CausalLM):
    """An encoder with its task head: the forward to the logits (inference) or the loss (training)."""

    def __init__(self, sim: Sim, spec: ModelSpec, cfg: ReplayConfig) -> None:
        check_encoder_run(cfg)
        check_positions(spec, cfg.q)
        self._pooled_keep: list[T] = []
        self._modern = spec.encoder is not None and spec.encoder.block == "modernbert"
        self._deberta = spec.encoder is not None and spec.encoder.block == "deberta"
        super().__init__(sim, spec, cfg, None)

    # ---- parameters ------------------------------------------------------------------------------------
    def _head_saved(self, name: str) -> bool:
        return saved_module(self.spec, name)

    def _build_params(self) -> None:
        if self.cfg.method != "full":
            enc = self.spec.encoder
            assert enc is not None
            if enc.head == "token_classification" and tuple(self.cfg.lora_targets) == (ALL_LINEAR,):
                raise GpumemInputError(
                    "PEFT cannot put all-linear LoRA on a token-classification model (it wraps the "
                    "classifier, which modules_to_save then refuses); name the target modules",
                    field="lora_targets",
                )
        super()._build_params()

    def _add(self, t: Tensor) -> None:
        cfg, s = self.cfg, self.s
        if cfg.method == "full" or not cfg.weights_counted or not self._head_saved(t.name):
            super()._add(t)
            return
        # ModulesToSaveWrapper: the original module stays (frozen) and a trainable copy runs
        numel = 1
        for d in t.shape:
            numel *= d
        full = round(numel * DT_BYTES[cfg.param_dt])
        s.param(f"{t.name} (original)", numel, cfg.param_dt, False, full, t.layer)
        self.p[t.name] = s.param(t.name, numel, cfg.param_dt, True, full, t.layer)
        self.shape[t.name] = t.shape

    # ---- forward ---------------------------------------------------------------------------------------
    def _embeddings(self, ids: T) -> T:
        """BertEmbeddings.forward (RobertaEmbeddings: position ids from the input ids)."""
        o, s, spec, cfg = self.o, self.s, self.spec, self.cfg
        enc = spec.encoder
        assert enc is not None
        b, q, h = cfg.batch, cfg.q, spec.hidden_size
        s.region = "inputs"
        if enc.position_ids_from_input:
            mask = s.new(b * q, "i32")  # input_ids.ne(padding_idx).int()
            cum = s.new(b * q, "i64")  # torch.cumsum promotes to int64
            inc = s.new(b * q, "i32")  # .type_as(mask)
            del cum
            inc2 = s.new(b * q, "i32")  # (+ cache_length) * mask
            del inc
            inc3 = s.new(b * q, "i32")
            del inc2, mask
            long = s.new(b * q, "i64")  # .long()
            del inc3
            position_ids = s.new(b * q, "i64")  # + padding_idx
            del long
            pos_rows = b * q
        else:
            position_ids = None  # a view of the position_ids buffer
            pos_rows = q
        # torch.gather of the token_type_ids buffer at the position ids, expanded to [b, q]
        token_type_ids = s.new(pos_rows, "i64") if enc.type_vocab_size else None
        s.region = "hidden_states"
        w = self.param("embed_tokens.weight")
        inputs_embeds = s.new(b * q * h, w.dt)
        s.node("copy", (w,), (inputs_embeds,), (ids,))
        embeddings = inputs_embeds
        if token_type_ids is not None:
            tw = self.param("token_type_embeddings.weight")
            tte = s.new(b * q * h, tw.dt)
            s.node("copy", (tw,), (tte,), (token_type_ids,))
            embeddings = o.add(inputs_embeds, tte)
            del tte
        pw = self.param("embed_positions.weight")
        pe = s.new(pos_rows * h, pw.dt)
        s.node("copy", (pw,), (pe,), (position_ids,) if position_ids is not None else ())
        embeddings = o.add(embeddings, pe, b * q * h)
        del pe
        embeddings = self.norm(embeddings, "embedding_norm")
        embeddings = o.dropout(embeddings, cfg.dropout)
        del inputs_embeds, token_type_ids, position_ids
        return embeddings

    def layer(self, i: int, hidden_states: T, *_: object) -> tuple[T, T | None]:
        """BertLayer.forward (see the module docstring); returns (output, None)."""
        o, s, spec, cfg = self.o, self.s, self.spec, self.cfg
        a, d = spec.num_attention_heads, spec.head_dim
        pre = f"layers.{i}"
        s.tr.where = f"layer {i} attention"
        s.region = "attention"
        q = o.view(self.linear(hidden_states, f"{pre}.self_attn.q_proj"), copy_grad=True)
        k = o.view(self.linear(hidden_states, f"{pre}.self_attn.k_proj"), copy_grad=True)
        v = o.view(self.linear(hidden_states, f"{pre}.self_attn.v_proj"), copy_grad=True)
        out, _weights = attention.kernel(self, q, k, v, None, a, a, d, d)  # held until the layer returns
        del q, k, v
        x = o.dropout(self.linear(out, f"{pre}.self_attn.o_proj"), cfg.dropout)
        del out
        s.region = "hidden_states"
        x = o.add(x, hidden_states)
        attention_output = self.region_norm(x, f"{pre}.norm0")
        del x
        s.tr.where = f"layer {i} MLP"
        s.region = "mlp"
        inter = mlp.act(self, self.linear(attention_output, f"{pre}.mlp.up_proj"))
        y = o.dropout(self.linear(inter, f"{pre}.mlp.down_proj"), cfg.dropout)
        del inter
        s.region = "hidden_states"
        y = o.add(y, attention_output)
        del attention_output
        out = self.region_norm(y, f"{pre}.norm1")
        del y, _weights
        return out, None

    def encode(self, ids: T, layers: Sequence[int]) -> T:
        """BertModel.forward up to the last hidden state (the pooler is the head's); ModernBertModel.forward
        (:mod:`.encoder_modern`)."""
        s, cfg = self.s, self.cfg
        if self._modern:
            return encoder_modern.encode(self, ids, layers)
        if self._deberta:
            return encoder_deberta.encode(self, ids, layers)
        s.tr.where = "embedding"
        hidden_states = self._embeddings(ids)
        embedding_output = hidden_states  # BertModel.forward's local, alive until the encoder returns
        for i in layers:
            s.hooks.enter_unit(s, i, (-1,))
            if cfg.grad_ckpt and (i + 1) % cfg.ckpt_every == 0:  # GradientCheckpointingLayer
                hidden_states, _ = s.checkpoint(self.layer, i, hidden_states)
            else:
                hidden_states, _ = self.layer(i, hidden_states)
        s.hooks.enter_unit(s, -1)
        s.unit = None
        del embedding_output
        return hidden_states

    def _first_token(self, last: T) -> T:
        """``hidden_states[:, 0]``: a [batch, hidden] view of the last hidden state."""
        out = T(last.st, self.cfg.batch * self.spec.hidden_size, last.dt)
        self.s.node("pass", (last,), (out,))
        return out

    def _classifier_dropout(self) -> float:
        enc = self.spec.encoder
        assert enc is not None
        if not self.s.grad_enabled:
            return 0.0
        return enc.classifier_dropout if enc.classifier_dropout is not None else self.cfg.dropout

    def head(self, last_hidden_state: T) -> T:
        """The task head over the last hidden state: the logits."""
        o, s, spec = self.o, self.s, self.spec
        enc = spec.encoder
        assert enc is not None
        s.tr.where = "head"
        s.region = "hidden_states"
        p = self._classifier_dropout()
        if self._modern:
            logits = encoder_modern.head(self, last_hidden_state)
        elif self._deberta:
            logits = encoder_deberta.head(self, last_hidden_state)
        elif enc.head == "sequence_classification":
            x = self._first_token(last_hidden_state)
            if enc.classifier == "pooler":  # BertPooler: dense, tanh; then dropout, classifier
                x = o.tanh(self.linear(x, "pooler.dense"))
                self._pooled_keep = [x]  # BaseModelOutputWithPooling.pooler_output
                logits = self.linear(o.dropout(x, p), "classifier")
            else:  # RobertaClassificationHead: dropout, dense, tanh, dropout, out_proj
                x = o.tanh(self.linear(o.dropout(x, p), "classifier.dense"))
                logits = self.linear(o.dropout(x, p), "classifier.out_proj")
            del x
        elif enc.head == "token_classification":
            logits = self.linear(o.dropout(last_hidden_state, p), "classifier")
        else:  # BertLMPredictionHead: transform (dense, act, LayerNorm), decoder
            x = mlp.act(self, self.linear(last_hidden_state, "head.dense"))
            x = self.norm(x, "head.norm")
            if self.has("lm_head.weight"):
                logits = self.linear(x, "lm_head")
            else:
                w = self.param("embed_tokens.weight")
                logits = o.linear(x, w, self.param("lm_head.bias"), spec.vocab_size, spec.hidden_size)
            del x
        s.tr.retag(logits.st, logits.st.kind, "logits")  # type: ignore[arg-type]
        s.region = "logits"
        return logits

    def forward_logits(self, ids: T, plan: LayerPlan) -> T | None:
        """``model(input_ids)`` under ``torch.no_grad()``: every layer, then the head's logits."""
        last = self.encode(ids, [i for _, i in plan.segments])
        logits = self.head(last)
        del last
        self._pooled_keep = []
        return logits

    def forward_loss(self, ids: T, layers: Sequence[int]) -> T:
        """``model(input_ids, labels=labels).loss``: CrossEntropyLoss over the head's logits (log_softmax, in
        fp32 under autocast, then nll_loss), labels [batch] or [batch, seq] (int64)."""
        s, spec, cfg = self.s, self.spec, self.cfg
        enc = spec.encoder
        assert enc is not None
        last = self.encode(ids, layers)
        logits = self.head(last)
        s.tr.where = "loss"
        s.region = "logits"
        rows = cfg.batch if enc.head == "sequence_classification" else cfg.tokens
        classes = spec.vocab_size if enc.head == "masked_lm" else enc.num_labels
        # autocast's fp32 log_softmax converts its input first; ModernBERT's ForMaskedLMLoss calls
        # logits.float() itself
        upcast = self._modern and enc.head == "masked_lm"
        dt = "f32" if s.autocast is not None or upcast else logits.dt
        x = s.cast(logits, dt)
        ls = s.new(rows * classes, dt)
        s.node("copy", (x,), (ls,), (ls,))
        del x
        s.region = "hidden_states"
        labels = ids  # labels=input_ids (per token), or a view of its first column (per sequence)
        loss = s.new(1, dt)
        total_weight = s.new(1, dt)
        s.node("copy", (ls,), (loss,), (labels, total_weight))
        del ls, total_weight
        self._logits, self._last = logits, last
        return loss


def run_forward(sim: Sim, spec: ModelSpec, cfg: ReplayConfig) -> dict[str, Any]:
    """One inference forward of an encoder (replay/forward.py ``_run`` for encoders): no cache."""
    model = EncoderModel(sim, spec, cfg)
    sim.tr.start_phase("forward")
    sim.tr.where = "embedding"
    ids = sim.new(cfg.tokens, "i64", "inputs")
    logits = model.forward_logits(ids, every_layer(range(spec.num_layers)))
    return {"kv": 0, "logits": logits.st.nbytes if logits is not None else 0}
