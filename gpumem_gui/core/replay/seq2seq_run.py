"""``generate()`` of an encoder-decoder replayed with gradients off (transformers 5.24
``generation/utils.py``): the two moments of a generation whose peaks matter.

* ``prefill``: ``_prepare_encoder_decoder_kwargs_for_generation`` runs the encoder over the ``source`` tokens
  (its output kept in ``model_kwargs`` for the whole generation), then the first decoder step over the
  ``decoder_start_token_id`` ([batch, 1]) with a new ``EncoderDecoderCache``: each decoder block projects the
  encoder output into its cross-attention keys and values and caches them.
* ``decode``: the last step, one target token after ``past`` cached ones; alive before it: the prompt ids,
  the encoder output, both caches, and ``_sample``'s fp32 next-token logits and processed scores of the
  previous step.

Weights are not counted here (the runtime's load phase holds them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpumem_gui.core.replay.autograd import Sim
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.forward import KINDS
from gpumem_gui.core.replay.seq2seq import Seq2SeqCache
from gpumem_gui.core.replay.seq2seq_bart import seq2seq_lm
from gpumem_gui.core.spec.model import ModelSpec


@dataclass(frozen=True)
class StepResult:
    """Peak of one replayed moment and what was live at it (bytes by kind), weights excluded."""

    peak: int
    where: str
    by_kind: dict[str, int]
    self_cache: int  # decoder self-attention cache at the end
    cross_cache: int  # cross-attention cache at the end
    logits: int


def _result(sim: Sim, cache: Seq2SeqCache, logits: int) -> StepResult:
    at = sim.tr.peaks["forward"]
    self_b = sum(k.st.nbytes + v.st.nbytes for k, v in cache.self_kv.values())
    cross_b = sum(k.st.nbytes + v.st.nbytes for k, v in cache.cross_kv.values())
    return StepResult(
        peak=at[0],
        where=at[3],
        by_kind={k: at[2].get(k, 0) for k in KINDS},
        self_cache=self_b,
        cross_cache=cross_b,
        logits=logits,
    )


def replay_prefill(spec: ModelSpec, cfg: ReplayConfig, source: int) -> StepResult:
    """The encoder over ``source`` tokens and the first decoder step (see the module docstring)."""
    sim = Sim()
    sim.grad_enabled = False
    model = seq2seq_lm(sim, spec, replace(cfg, q=1, past=0), source)
    sim.tr.start_phase("forward")
    inputs = sim.new(cfg.batch * source, "i64", "inputs")
    encoder_out = model.encode(inputs)
    start = sim.new(cfg.batch, "i64", "inputs")
    cache = Seq2SeqCache()
    logits = model.decode(start, encoder_out, cache)
    del inputs, start, encoder_out
    return _result(sim, cache, logits.st.nbytes)


def replay_decode(spec: ModelSpec, cfg: ReplayConfig, source: int, past: int) -> StepResult:
    """The last decoder step, one token after ``past`` cached target tokens (see the module docstring)."""
    assert spec.seq2seq is not None
    sim = Sim()
    sim.grad_enabled = False
    model = seq2seq_lm(sim, spec, replace(cfg, q=1, past=past), source)
    b, dt = cfg.batch, cfg.param_dt
    width = spec.num_attention_heads * spec.head_dim
    inputs = sim.new(b * source, "i64", "inputs")
    encoder_out = sim.new(b * source * spec.hidden_size, dt, "hidden_states")
    cache = Seq2SeqCache()
    for i in range(spec.seq2seq.encoder_layers, spec.num_layers):
        cache.self_kv[i] = (
            sim.new(b * past * width, dt, "kv_cache"),
            sim.new(b * past * width, dt, "kv_cache"),
        )
        cache.cross_kv[i] = (
            sim.new(b * source * width, dt, "kv_cache"),
            sim.new(b * source * width, dt, "kv_cache"),
        )
    scores = sim.new(b * spec.vocab_size, "f32", "logits")  # next_token_logits (fp32 copy)
    processed = sim.new(b * spec.vocab_size, "f32", "logits")  # next_token_scores
    sim.tr.start_phase("forward")
    step = sim.new(b, "i64", "inputs")
    logits = model.decode(step, encoder_out, cache)
    del inputs, encoder_out, scores, processed, step
    return _result(sim, cache, logits.st.nbytes)
