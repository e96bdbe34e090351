"""Inference: load, prefill and the last decode step, as ``generate()`` runs them."""

from __future__ import annotations

import contextlib
import gc
from typing import Any

from .building import (
    DTYPES,
    WHOLE_MODEL,
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
from .vision import add_vision, constant_grids, image_inputs, image_request

# DeepseekV4HCACache / DeepseekV4CSACache (models/deepseek_v4/modeling_deepseek_v4.py): the compressors'
# state, dicts of tensors keyed by entry ("compressor", "indexer")
_COMPRESSOR_STATE = ("buffer_kv", "buffer_gate", "compressed_kv", "overlap_kv", "overlap_gate")


def cache_bytes(cache: Any) -> int:
    """Bytes of the tensors a transformers cache holds, as views (a sliding layer's window, not the storage
    of the concatenation it is a view of): what ``DynamicCache`` reports; DeepSeek-V4's layers add their
    compressors' state and hold ``values is keys`` (counted once)."""
    import torch

    tot = 0
    for lay in getattr(cache, "layers", None) or []:
        held = list(vars(lay).values())
        held += [t for name in _COMPRESSOR_STATE for t in (getattr(lay, name, None) or {}).values()]
        seen: set[int] = set()
        for t in held:
            if isinstance(t, torch.Tensor) and t.numel() > 1 and id(t) not in seen:
                seen.add(id(t))
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


def _static_decode(model: Any, mt: Any, cfg: Any, batch: int, length: int, out: dict[str, Any]) -> None:
    """generate(cache_implementation="static")'s last step: a StaticCache of ``length`` tokens filled to
    ``length - 1`` (a prefill, then a one-token step), then the step that writes its last slot, with
    generate()'s all-ones attention mask and the previous step's fp32 scores alive. The caches and masks are
    made before tracking (as generate() holds them outside the forward); the layers' static tensors are
    allocated inside it (StaticLayer.lazy_initialization at the first update)."""
    import torch

    mt.enter("warmup")
    gc.collect()
    cache = STATIC.pop("cache")
    if length > 2:
        ids = token_ids(cfg, batch, length - 2)
        res = model(
            input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1, attention_mask=STATIC["first"]
        )
        del res, ids
    mt.reset_mod_stats()
    res = model(
        input_ids=token_ids(cfg, batch, 1),
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
        attention_mask=STATIC["second"],
    )
    scores = res.logits[:, -1].to(copy=True, dtype=torch.float32)
    processed = scores.clone()
    del res
    mt.enter("decode")
    step = token_ids(cfg, batch, 1)
    res = model(input_ids=step, cache=cache, use_cache=True, logits_to_keep=1, attention_mask=STATIC["last"])
    out["kv_cache_bytes"] = cache_bytes(res.past_key_values)
    del res, step, scores, processed, cache


# a static trace's caches and generate()'s attention masks, made before tracking
STATIC: dict[str, Any] = {}


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
    req = image_request(cfg, run)  # images in the prompt (vision.py); None: text only
    grids = constant_grids() if req is not None else contextlib.nullcontext()
    with FakeTensorMode(), readable_failures():
        task = run.get("task")
        whole = WHOLE_MODEL.set(req is not None)  # images: the whole model, its vision tower run on them
        try:
            model = build(cfg, dtype, run.get("attn", "sdpa"), trust_remote_code, notes, task).eval()
        finally:
            WHOLE_MODEL.reset(whole)
        out["attn_implementation_used"] = attn_used(model)
        static = run.get("cache_implementation") == "static" and req is None and not is_seq2seq(cfg)
        length = seq + max(new - 1, 0)  # generate(): max_cache_len = max_length - 1
        if static:  # generate()'s all-ones attention masks (generation/utils.py), outside the tracked memory
            from transformers import StaticCache

            prefill_cache = StaticCache(config=cfg, max_cache_len=length)
            STATIC.update(
                cache=StaticCache(config=cfg, max_cache_len=length),
                prefill=torch.ones((batch, seq), dtype=torch.long),
                first=torch.ones((batch, length - 2), dtype=torch.long),
                second=torch.ones((batch, length - 1), dtype=torch.long),
                last=torch.ones((batch, length), dtype=torch.long),
            )
        mt = memory_tracker()
        mt.track_external(model)
        with mt, torch.no_grad(), grids:  # grids: after the build imported the modeling code
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
                extra: dict[str, Any] = {}
                if req is not None:  # the processor's outputs for the images, their tokens before the text
                    del ids
                    ids, extra = image_inputs(model, cfg, batch, seq, req)
                    out["image_tokens"] = int(ids.shape[1]) - seq
                    notes[:] = [n for n in notes if "run with text only" not in n]
                    notes.append(f"images: {req[0]} of {req[1]} x {req[1]} pixels per sequence (vision.py)")
                    seq = int(ids.shape[1])
                if static:  # generate(cache_implementation="static"): the prefill fills a StaticCache
                    extra = {"cache": prefill_cache, "attention_mask": STATIC["prefill"]}
                res = model(input_ids=ids, use_cache=True, logits_to_keep=keep, **extra)
                out["logits_bytes"] = int(res.logits.numel() * res.logits.element_size())
                cache = res.past_key_values
                out["kv_cache_bytes"] = cache_bytes(cache)
                del res, ids, cache, extra
            if static and new > 1:
                del prefill_cache
                _static_decode(model, mt, cfg, batch, length, out)
            elif new > 0 and not static:
                _decode(model, mt, cfg, batch, seq + new - 1, out)
        STATIC.clear()
        out["phases"] = {k: v for k, v in mt.phase_peaks.items() if k != "warmup"}
        out["phases"]["load"] = flat(mt.get_tracker_snapshot("current"))
        if req is None:  # with images the whole model was built: its vision tower is in every phase
            add_vision(out, cfg, dtype)
        del model
    return out
