"""One inference forward replayed with gradients off: the prefill of a prompt, or one decode step.

:func:`replay_forward` runs the one causal-LM forward (:mod:`.model`) under ``torch.no_grad()``: ``q`` new
tokens per sequence after ``past`` cached ones, the cache updated as ``DynamicCache`` does, the logits of the
kept positions. Weights are not counted here (the runtime's load phase holds them, in the run's format); the
result is the peak of everything else, what was live at it by region, and the cache afterwards.

Only the last layer of each kind is replayed op by op (:func:`~.model.last_of_each_kind`); the layers before
it add their output and their cache growth. A forward is recorded once per model and structure as a tape
(:mod:`.tape`) and evaluated for every batch size and sequence length it admits; :func:`replay_forward_direct`
runs the replay itself (the tests check that both agree).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpumem_gui.core.replay import encoder, vision
from gpumem_gui.core.replay.autograd import Sim
from gpumem_gui.core.replay.cache import KVCache
from gpumem_gui.core.replay.config import ReplayConfig, last_of_each_kind
from gpumem_gui.core.replay.model import CausalLM
from gpumem_gui.core.replay.static_cache import StaticKVCache
from gpumem_gui.core.replay.tape import TapeCache, record
from gpumem_gui.core.spec.kinds import CompressedAttention
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.kv import kv_elements_per_layer, tokens_kept_transformers
from gpumem_gui.core.spec.model import ModelSpec

# what the inference breakdown names: the cache, the forward's regions, the logits
KINDS = (
    "kv_cache",
    "hidden_states",
    "attention",
    "mlp",
    "norm",
    "logits",
    "rope",
    "mask",
    "inputs",
    "recurrent_state",  # linear-attention layers' conv and recurrent states (replay/linear_attention.py)
    "vision",  # a prompt's images: the vision tower's activations and outputs (replay/vision.py)
    "dequantized weights",  # bitsandbytes 4-bit linears' dequantized weight per matmul (replay/adapters.py)
)
_TAPE_KEYS = 512  # (model, structure) pairs whose tapes are kept
_POINT = ("batch", "q", "past")  # what a tape is evaluated for; every other field of the config is its key


@dataclass(frozen=True)
class ForwardResult:
    """Peak of one replayed forward and what was live at it (bytes by kind), weights excluded."""

    peak: int
    where: str
    by_kind: dict[str, int]
    kv_cache_storage: int  # cache storage held at the end of the forward
    kv_cache_logical: int  # bytes of the cache tensors as views (sliding layers: window - 1 tokens)
    logits: int


def _run(sim: Sim, spec: ModelSpec, cfg: ReplayConfig) -> dict[str, Any]:
    if model_kinds(spec).model == "encoder":  # no cache, every layer, the task head (replay/encoder.py)
        return encoder.run_forward(sim, spec, cfg)
    plan = last_of_each_kind(spec)
    cache = (
        StaticKVCache(
            sim, spec, cfg.batch, cfg.past, cfg.kv_bytes, cfg.param_dt, plan.replayed, cfg.static_len
        )
        if cfg.static_len
        else KVCache(sim, spec, cfg.batch, cfg.past, cfg.kv_bytes, cfg.param_dt, plan.replayed)
    )
    model = CausalLM(sim, spec, cfg, cache)
    sim.tr.start_phase("forward")
    sim.tr.where = "embedding"
    ids = sim.new(cfg.tokens, "i64", "inputs")
    # a prompt with images: what the vision tower leaves alive through the text forward (replay/vision.py)
    held = vision.hold(sim, spec, cfg, cfg.batch, cfg.q) if cfg.images else None
    logits = model.forward_logits(ids, plan)
    del held
    return {"kv": cache.stored_bytes(), "logits": logits.st.nbytes if logits is not None else 0}


_TAPES = TapeCache(_TAPE_KEYS, per_key=_TAPE_KEYS)


def replay_forward(spec: ModelSpec, cfg: ReplayConfig) -> ForwardResult:
    """The forward of ``spec`` under ``cfg`` from a tape (recorded when no tape of the structure admits this
    batch size and these token counts)."""
    key = (spec, *(v for k, v in vars(cfg).items() if k not in _POINT))
    point = (cfg.batch, cfg.q, cfg.past)
    found = _TAPES.find(key, point)
    if found is None:
        tape = record(lambda sim, b, q, p: _run(sim, spec, replace(cfg, batch=b, q=q, past=p)), point)
        _TAPES.add(key, tape)
        m = tape.monomials(point)
    else:
        tape, m = found
    res = tape.evaluate(m)
    if cfg.images:  # the vision tower's stretch of the prefill, when it is the higher (replay/vision.py)
        tw = vision.tower_peak(spec, cfg)
        res = replace(res, peak=tw.peak, where=tw.where, by_tag=tw.by_tag) if tw.peak > res.peak else res
    return ForwardResult(
        peak=res.peak,
        where=res.where,
        by_kind={k: res.by_tag.get(k, 0) for k in KINDS},
        kv_cache_storage=res.values["kv"],
        kv_cache_logical=logical_cache_bytes(spec, cfg.batch, cfg.kv_len, cfg.kv_bytes),
        logits=res.values["logits"],
    )


def replay_forward_direct(spec: ModelSpec, cfg: ReplayConfig) -> ForwardResult:
    """The same forward replayed op by op on the symbolic runtime, without a tape."""
    sim = Sim()
    sim.grad_enabled = False
    named = _run(sim, spec, cfg)
    at = sim.tr.peaks["forward"]
    if cfg.images and (tw := vision.tower_peak(spec, cfg)).peak > at[0]:  # replay/vision.py
        at = (tw.peak, {}, tw.by_tag, tw.where)
    return ForwardResult(
        peak=at[0],
        where=at[3],
        by_kind={k: at[2].get(k, 0) for k in KINDS},
        kv_cache_storage=named["kv"],
        kv_cache_logical=logical_cache_bytes(spec, cfg.batch, cfg.kv_len, cfg.kv_bytes),
        logits=named["logits"],
    )


def logical_cache_bytes(spec: ModelSpec, batch: int, tokens: int, kv_bytes: float) -> int:
    """The cache as transformers reports it after ``tokens`` tokens: every layer's keys and values as views
    (a sliding layer shows its last ``window - 1`` tokens; a layer without a per-token cache none)."""
    kept = tokens_kept_transformers(spec, tokens)
    per = kv_elements_per_layer(spec)
    out = sum(round(batch * (k + v) * kv_bytes * t) for (k, v), t in zip(per, kept, strict=True))
    # DeepSeek-V4's compressed layers: their cache's rule of the length (spec/compressed.py)
    for kind in model_kinds(spec).of(CompressedAttention):
        out += len(kind.layers) * batch * kind.cache_bytes(tokens, round(kv_bytes))
    return out
