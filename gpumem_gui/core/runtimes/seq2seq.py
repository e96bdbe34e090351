"""What an inference run of an encoder-decoder (T5, mT5, UMT5, BART: :attr:`ModelSpec.seq2seq`) is, and its
phases under transformers' ``generate()`` (replayed by :mod:`gpumem_gui.core.replay.seq2seq_run`).

The run's ``seq`` is the source length (the encoder's input), ``new_tokens`` the target tokens generated.
``prefill``: the encoder and the first decoder step, which fills the cross-attention cache (``generate()``
always runs it); ``decode`` (``new_tokens`` > 1): the last step, one token after ``new_tokens - 1`` cached
target tokens, beside the encoder output, both caches and the previous step's fp32 scores.

Serving engines (vLLM, SGLang, llama.cpp, Ollama) have their own encoder-decoder paths, none modelled here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.seq2seq_run import StepResult, replay_decode, replay_prefill
from gpumem_gui.core.results.estimate import Component, Explanation, Phase
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.seq2seq import check_positions

if TYPE_CHECKING:
    from gpumem_gui.core.runtimes.base import Runtime

_REPLAY_DTYPES = {"bf16": "bf16", "fp32": "f32"}
_KIND_LABELS = {
    "kv_cache": "self- and cross-attention caches",
    "hidden_states": "hidden states (the encoder output included)",
    "attention": "attention temporaries",
    "mlp": "MLP temporaries",
    "norm": "norm temporaries",
    "logits": "logits (and generate()'s fp32 scores)",
    "mask": "relative position bias",
    "inputs": "input ids",
}


def check_seq2seq_inference(spec: ModelSpec, run: InferenceRun, rt: Runtime) -> None:
    """Refuse, in one line naming the field, what an encoder-decoder run cannot be (on engine ``rt``)."""
    s2s = spec.seq2seq
    assert s2s is not None
    if not rt.serves("encoder-decoder"):
        raise GpumemInputError(
            f"{run.engine} is not modelled for encoder-decoders (T5); use --engine transformers",
            field="engine",
        )
    for name in ("tp", "pp", "ep"):
        if getattr(run, name) > 1:
            raise GpumemInputError(f"{name} > 1 is not modelled for encoder-decoders (one GPU)", field=name)
    if run.compute_dtype not in _REPLAY_DTYPES:
        raise GpumemInputError(
            "fp16 is not modelled for encoder-decoders (T5Block and BartEncoderLayer clamp inf values in "
            "fp16); use bf16 or fp32",
            field="compute_dtype",
        )
    check_positions(spec, run.seq, run.new_tokens)
    if run.weights not in ("bf16", "fp32", "file") or run.kv_dtype_resolved not in (
        "auto",
        run.compute_dtype,
    ):
        raise GpumemInputError(
            "encoder-decoders are modelled with unquantized weights and cache only", field="weights"
        )


def _components(res: StepResult) -> list[Component]:
    return [
        Component(
            key=kind if kind in ("kv_cache", "logits") else f"act_{kind}",
            label=_KIND_LABELS.get(kind, kind),
            bytes=n,
            explain=Explanation(
                formula=f"{_KIND_LABELS.get(kind, kind)} live at the peak ({res.where}), from an op-by-op "
                "replay of the transformers encoder-decoder forward",
                inputs={"where": res.where},
                source="transformers 5.24 models/t5/modeling_t5.py and generation/utils.py replayed on "
                "symbolic tensors (gpumem_gui.core.replay.seq2seq); checked against PyTorch MemTracker "
                "traces (tests/reference/seq2seq)",
            ),
        )
        for kind, n in res.by_kind.items()
        if n
    ]


def seq2seq_phases(spec: ModelSpec, run: InferenceRun, weights: Component, load: Phase) -> tuple[dict, int]:
    """The load, prefill and decode phases of ``generate()`` and the cache (self + cross) at its end."""
    dt = _REPLAY_DTYPES[run.compute_dtype]
    cfg = ReplayConfig(batch=run.batch, q=1, param_dt=dt, attn=run.attn, weights_counted=False)
    pre = replay_prefill(spec, cfg, run.seq)
    phases = {
        "load": load,
        "prefill": Phase(
            name="prefill",
            peak_bytes=weights.bytes + pre.peak,
            components=(weights, *_components(pre)),
            note=f"encoder over {run.seq} tokens, first decoder step; peak at {pre.where}",
        ),
    }
    cache = pre.self_cache + pre.cross_cache
    if run.new_tokens > 1:
        past = run.new_tokens - 1
        dec = replay_decode(spec, cfg, run.seq, past)
        phases["decode"] = Phase(
            name="decode",
            peak_bytes=weights.bytes + dec.peak,
            components=(weights, *_components(dec)),
            note=f"last step: 1 target token after {past} cached; peak at {dec.where}",
        )
        cache = dec.self_cache + dec.cross_cache
    return phases, cache
