"""Inference: load, prefill and the last decode step, as ``generate()`` runs them."""

from __future__ import annotations

import gc
from typing import Any

from .building import (
    DTYPES,
    add_vision,
    attn_used,
    build,
    check_torch,
    load_config,
    patch_transformers_for_fake,
    quantization_notes,
    readable_failures,
    token_ids,
)
from .seq2seq import is_seq2seq, trace_generate
from .tracking import flat, memory_tracker


def cache_bytes(cache: Any) -> int:
    """Bytes of the tensors a transformers cache holds, as views (a sliding layer's window, not the storage
    of the concatenation it is a view of): what ``DynamicCache`` reports."""
    import torch

    tot = 0
    for lay in getattr(cache, "layers", None) or []:
        for t in vars(lay).values():
            if isinstance(t, torch.Tensor) and t.numel() > 1:
                tot += t.numel() * t.element_size()
    return tot


def _decode(model: Any, mt: Any, cfg: Any, batch: int, past: int, out: dict[str, Any]) -> None:
    """A cache of ``past`` tokens built as ``generate()`` builds it (a prefill, then a one-token step), then
    one more one-token forward while the previous step's fp32 scores are alive."""
    import torch

    mt.enter("warmup")
    cache = None
    gc.collect()
    if past > 1:
        res = model(input_ids=token_ids(cfg, batch, past - 1), use_cache=True, logits_to_keep=1)
        cache = res.past_key_values
        del res
    mt.reset_mod_stats()
    res = model(input_ids=token_ids(cfg, batch, 1), cache=cache, use_cache=True, logits_to_keep=1)
    cache = res.past_key_values
    # generate(): the previous step's fp32 next-token logits and processed scores stay alive
    scores = res.logits[:, -1].to(copy=True, dtype=torch.float32)
    processed = scores.clone()
    del res
    mt.enter("decode")
    step = token_ids(cfg, batch, 1)
    res = model(input_ids=step, cache=cache, use_cache=True, logits_to_keep=1)
    out["kv_cache_bytes"] = cache_bytes(res.past_key_values)
    del res, step, scores, processed, cache


def trace_inference(
    raw: dict[str, Any], run: dict[str, Any], trust_remote_code: bool = False
) -> dict[str, Any]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    check_torch()
    patch_transformers_for_fake()
    notes: list[str] = []
    cfg = load_config(raw, trust_remote_code, notes)
    batch, seq, new = int(run.get("batch", 1)), int(run.get("seq", 2048)), int(run.get("new_tokens", 0))
    dtype = getattr(torch, DTYPES[run.get("compute_dtype", "bf16")])
    keep = 0 if run.get("logits", "last") == "all" else 1
    out: dict[str, Any] = {"notes": notes, "quantization": quantization_notes(raw, notes)}
    with FakeTensorMode(), readable_failures():
        task = run.get("task")
        model = build(cfg, dtype, run.get("attn", "sdpa"), trust_remote_code, notes, task).eval()
        out["attn_implementation_used"] = attn_used(model)
        mt = memory_tracker()
        mt.track_external(model)
        with mt, torch.no_grad():
            mt.enter("prefill")
            ids = token_ids(cfg, batch, seq)
            if is_seq2seq(cfg):  # an encoder-decoder: generate()'s encoder pass and steps (seq2seq.py)
                del ids
                trace_generate(model, mt, cfg, batch, seq, new, out)
                new = 0
            elif task is not None:  # an encoder: one forward, its head's logits, no cache
                res = model(input_ids=ids)
                out["logits_bytes"] = int(res.logits.numel() * res.logits.element_size())
                out["kv_cache_bytes"] = 0
                del res, ids
                new = 0
            else:
                res = model(input_ids=ids, use_cache=True, logits_to_keep=keep)
                out["logits_bytes"] = int(res.logits.numel() * res.logits.element_size())
                cache = res.past_key_values
                out["kv_cache_bytes"] = cache_bytes(cache)
                del res, ids, cache
            if new > 0:
                _decode(model, mt, cfg, batch, seq + new - 1, out)
        out["phases"] = {k: v for k, v in mt.phase_peaks.items() if k != "warmup"}
        out["phases"]["load"] = flat(mt.get_tracker_snapshot("current"))
        add_vision(out, cfg, dtype)
        del model
    return out
