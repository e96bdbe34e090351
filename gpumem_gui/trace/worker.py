"""The trace worker: builds the real transformers model under FakeTensorMode and lets PyTorch count.

This file runs inside the user's own ML environment (any Python with ``torch`` and ``transformers``; ``peft``
for LoRA), so it imports nothing from gpumem: gpumem starts it as ``python worker.py`` and speaks JSON over
stdin/stdout (one request in, one result out), or imports it when torch is importable in-process.

What it measures (``torch.distributed._tools.mem_tracker.MemTracker``, which counts the storage bytes of every
live tensor: parameters, buffers, gradients, optimizer states, activations, temporaries, inputs):

* ``inference``: ``model.eval()``, ``torch.no_grad()``, weights in the compute dtype. Phase ``load`` holds
  the weights and buffers; ``prefill`` one forward over the prompt with ``use_cache=True`` and
  ``logits_to_keep=1`` (what ``generate()`` does) or all logits; ``decode`` the last generation step: a cache
  of ``seq + new_tokens - 1`` tokens built as ``generate()`` builds it (a prefill, then one-token steps), and
  one more one-token forward while the previous step's fp32 scores are alive
  (``transformers/generation/utils.py`` ``_sample``: ``next_token_logits`` and the processed scores).
* ``train``: one optimizer step in steady state (optimizer states exist before it, unless ``first_step``):
  forward + loss (``labels=input_ids``), backward, ``optimizer.step()``, ``zero_grad(set_to_none=True)``;
  mixed precision as HF Trainer does it (fp32 weights, ``torch.autocast`` over forward + loss); LoRA through
  ``peft``; non-reentrant gradient checkpointing; gradient accumulation (two micro-batches are replayed, the
  second with every ``.grad`` live).

Two transformers code paths read tensor values and are patched to take the path a real run takes (the
reference measurements do the same): packed-sequence detection (a real unpacked batch returns None), and
grouped_mm for non-bf16 expert weights (routed to transformers' own fallback, same shapes and dtypes).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import tempfile
import time
from typing import Any

SCHEMA = "gpumem.trace-worker/1"
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


class TraceError(Exception):
    """A request the worker cannot run; its message is one line naming the cause."""


def versions() -> dict[str, str]:
    import torch
    import transformers

    out = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
    }
    try:
        import peft

        out["peft"] = peft.__version__
    except ImportError:
        pass
    return out


def _patch_transformers_for_fake() -> None:
    import torch
    import transformers.masking_utils as mu

    mu.find_packed_sequence_indices = lambda position_ids: None
    try:
        import transformers.integrations.moe as moe

        orig = moe._can_use_grouped_mm
        if getattr(orig, "_gpumem", False):
            return

        def can(input: Any, weight: Any, offs: Any) -> bool:
            return weight.dtype == torch.bfloat16 and orig(input, weight, offs)

        can._gpumem = True  # type: ignore[attr-defined]
        moe._can_use_grouped_mm = can
    except (ImportError, AttributeError):
        pass


def _config(raw: dict[str, Any], trust_remote_code: bool) -> Any:
    from transformers import AutoConfig

    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
            json.dump(raw, f)
        try:
            return AutoConfig.from_pretrained(d, trust_remote_code=trust_remote_code)
        except (ValueError, KeyError, TypeError, OSError) as e:
            raise TraceError(f"transformers rejects the config: {str(e).splitlines()[0][:200]}") from None


def _is_moe(cfg: Any) -> bool:
    tc = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return any(
        isinstance(getattr(tc, k, None), int) and getattr(tc, k) > 1
        for k in ("num_local_experts", "num_experts", "n_routed_experts")
    )


def _build(cfg: Any, dtype: Any, attn: str, trust_remote_code: bool) -> Any:
    from transformers import AutoModelForCausalLM

    kw: dict[str, Any] = {"dtype": dtype, "attn_implementation": attn, "trust_remote_code": trust_remote_code}
    if _is_moe(cfg):
        kw["experts_implementation"] = "grouped_mm"
    for _ in range(3):
        try:
            return AutoModelForCausalLM.from_config(cfg, **kw)
        except (TypeError, ValueError) as e:
            msg = str(e)
            if "experts" in msg and "experts_implementation" in kw:
                kw.pop("experts_implementation")
            elif kw.get("attn_implementation") == "sdpa" and "scaled_dot_product_attention" in msg:
                kw["attn_implementation"] = "eager"  # what transformers itself falls back to (BLOOM, Gemma-2)
            else:
                raise TraceError(
                    f"transformers cannot build the model: {msg.splitlines()[0][:200]}"
                ) from None
    raise TraceError("transformers cannot build the model")


def _attn_used(model: Any) -> str | None:
    c = getattr(model, "config", None)
    for obj in (c, c.get_text_config() if c is not None and hasattr(c, "get_text_config") else None):
        if obj is not None and getattr(obj, "_attn_implementation", None):
            return str(obj._attn_implementation)
    return None


def _tracker() -> Any:
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker

    class PhaseTracker(MemTracker):  # type: ignore[misc]
        """MemTracker with a peak per phase; skips MemTracker's per-module snapshots (unused, slow)."""

        def __init__(self) -> None:
            super().__init__()
            self.phase = "load"
            self.phase_peaks: dict[str, dict[str, int]] = {}

        def _update_peak_stats(self, peak_state: Any) -> None:
            for dev, snap in self._curr_mem_snap.items():
                tot = snap[_TOTAL_KEY]
                if self._peak_mem.get(dev, 0) < tot:
                    self._peak_mem[dev] = tot
                    self._peak_mem_snap[dev] = dict(snap)
                rec = self.phase_peaks.get(self.phase)
                if rec is None or tot > rec["Total"]:
                    self.phase_peaks[self.phase] = _names(snap)

        def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> Any:
            # MemTracker hooks every parameter's gradient, which a frozen one (a LoRA base) refuses: mark
            # those as hooked already, with handles that remove nothing
            for p in module.parameters():
                if not p.requires_grad and self._param_to_grad_hook_handles.get(p, None) is None:
                    self._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

        def current(self) -> dict[str, int]:
            return _flat(self.get_tracker_snapshot("current"))

        def enter(self, phase: str, forward: bool = True) -> None:
            """Start ``phase`` (a phase met again keeps its higher peak); before a forward, module stats are
            reset, as MemTracker refuses a module called twice otherwise (decode steps, micro-batches)."""
            if forward:
                self.reset_mod_stats()
            self.phase = phase
            cur = self.current()
            rec = self.phase_peaks.get(phase)
            if rec is None or cur.get("Total", 0) > rec.get("Total", 0):
                self.phase_peaks[phase] = cur

    return PhaseTracker()


class _NoHook:
    def remove(self) -> None:
        return None


def _names(snap: dict[Any, int]) -> dict[str, int]:
    return {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}


def _flat(snap: dict[Any, dict[Any, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in snap.values():
        for k, v in _names(d).items():
            out[k] = out.get(k, 0) + v
    return out


def _cache_bytes(cache: Any) -> int:
    """Bytes of the tensors a transformers cache holds, as views (a sliding layer's window, not the storage
    of the concatenation it is a view of): what ``DynamicCache`` reports."""
    import torch

    tot = 0
    for lay in getattr(cache, "layers", None) or []:
        for t in vars(lay).values():
            if isinstance(t, torch.Tensor) and t.numel() > 1:
                tot += t.numel() * t.element_size()
    return tot


def _vocab(cfg: Any) -> int:
    tc = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return int(tc.vocab_size)


def trace_inference(
    raw: dict[str, Any], run: dict[str, Any], trust_remote_code: bool = False
) -> dict[str, Any]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    _patch_transformers_for_fake()
    cfg = _config(raw, trust_remote_code)
    batch, seq, new = int(run.get("batch", 1)), int(run.get("seq", 2048)), int(run.get("new_tokens", 0))
    dtype = getattr(torch, DTYPES[run.get("compute_dtype", "bf16")])
    keep = 0 if run.get("logits", "last") == "all" else 1
    out: dict[str, Any] = {}
    with FakeTensorMode():
        model = _build(cfg, dtype, run.get("attn", "sdpa"), trust_remote_code).eval()
        out["attn_implementation_used"] = _attn_used(model)
        vocab = _vocab(cfg)
        mt = _tracker()
        mt.track_external(model)
        with mt, torch.no_grad():
            mt.enter("prefill")
            ids = torch.randint(0, min(vocab, 1000), (batch, seq))
            res = model(input_ids=ids, use_cache=True, logits_to_keep=keep)
            out["logits_bytes"] = int(res.logits.numel() * res.logits.element_size())
            cache = res.past_key_values
            out["kv_cache_bytes_prefill"] = _cache_bytes(cache)
            del res, ids
            if new > 0:
                past = seq + new - 1
                mt.enter("warmup")
                del cache
                gc.collect()
                cache = None
                if past > 1:
                    ids = torch.randint(0, min(vocab, 1000), (batch, past - 1))
                    res = model(input_ids=ids, use_cache=True, logits_to_keep=1)
                    cache = res.past_key_values
                    del res, ids
                step = torch.randint(0, min(vocab, 1000), (batch, 1))
                mt.reset_mod_stats()
                res = model(input_ids=step, cache=cache, use_cache=True, logits_to_keep=1)
                cache = res.past_key_values
                # generate(): the previous step's fp32 next-token logits and processed scores stay alive
                scores = res.logits[:, -1].to(copy=True, dtype=torch.float32)
                processed = scores.clone()
                del res, step
                mt.enter("decode")
                step = torch.randint(0, min(vocab, 1000), (batch, 1))
                res = model(input_ids=step, cache=cache, use_cache=True, logits_to_keep=1)
                out["kv_cache_bytes"] = _cache_bytes(res.past_key_values)
                del res, step, scores, processed
            else:
                out["kv_cache_bytes"] = out["kv_cache_bytes_prefill"]
            del cache
        out["phases"] = {k: v for k, v in mt.phase_peaks.items() if k != "warmup"}
        out["phases"]["load"] = _flat(mt.get_tracker_snapshot("current"))
        del model
    gc.collect()
    return out


def _lora(model: Any, run: dict[str, Any]) -> Any:
    try:
        from peft import LoraConfig, get_peft_model
        from peft.tuners.lora.layer import LoraLayer
    except ImportError:
        raise TraceError("LoRA needs peft in the tracing environment (pip install peft)") from None
    import torch

    # peft moves each new adapter to its base layer's device with Module.to(), which cannot swap fake
    # parameters; everything here is on the CPU device already, so skipping a move to it changes nothing
    LoraLayer._move_adapter_to_device_of_base_layer = lambda self, *a, **k: None
    to = torch.nn.Module.to

    def same_device_to(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not kwargs and len(args) == 1 and str(args[0]) == "cpu":
            return self
        return to(self, *args, **kwargs)

    targets = run.get("lora_targets", "all-linear")
    if isinstance(targets, str) and targets != "all-linear":
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    conf = LoraConfig(
        r=int(run.get("lora_rank", 16)),
        lora_alpha=float(run.get("lora_alpha", 32)),
        lora_dropout=float(run.get("lora_dropout", 0.0)),
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    torch.nn.Module.to = same_device_to  # type: ignore[method-assign]
    try:
        return get_peft_model(model, conf)
    except ValueError as e:
        raise TraceError(f"peft: {str(e).splitlines()[0][:200]}") from None
    finally:
        torch.nn.Module.to = to  # type: ignore[method-assign]


_OPTIM = {
    "adamw": {"foreach": True},
    "adamw-foreach": {"foreach": True},
    "adamw-fused": {"fused": True},
    "adamw-for-loop": {"foreach": False},
}


def _optimizer(params: list[Any], name: str) -> Any:
    import torch

    if name in _OPTIM:
        return torch.optim.AdamW(params, lr=1e-5, **_OPTIM[name])
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=True)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    raise TraceError(f"optimizer {name!r} is not traced (torch's own optimizers only)")


def trace_training(
    raw: dict[str, Any], run: dict[str, Any], trust_remote_code: bool = False
) -> dict[str, Any]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    _patch_transformers_for_fake()
    cfg = _config(raw, trust_remote_code)
    for k in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout"):
        if run.get("dropout") is not None and hasattr(cfg, k):
            setattr(cfg, k, float(run["dropout"]))
    batch, seq = int(run.get("batch", 1)), int(run.get("seq", 2048))
    precision, method = run.get("precision", "amp-bf16"), run.get("method", "full")
    if method == "qlora":
        raise TraceError("QLoRA is not traced: bitsandbytes 4-bit layers need a CUDA device")
    autocast = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(precision)
    if method == "full":
        wdtype = torch.float32 if autocast is not None or precision == "fp32" else torch.bfloat16
    else:
        wdtype = {"fp32": torch.float32, "amp-fp16": torch.float16}.get(precision, torch.bfloat16)
    accum = max(1, min(2, int(run.get("grad_accum", 1))))
    out: dict[str, Any] = {}
    with FakeTensorMode():
        model = _build(cfg, wdtype, run.get("attn", "sdpa"), trust_remote_code)
        out["attn_implementation_used"] = _attn_used(model)
        if run.get("grad_ckpt"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if method == "lora":
            model = _lora(model, run)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        out["trainable_params"] = int(sum(p.numel() for p in params))
        opt = _optimizer(params, run.get("optimizer", "adamw"))
        if not run.get("first_step"):
            for p in params:
                p.grad = torch.zeros_like(p)
            opt.step()
            opt.zero_grad(set_to_none=True)
        ids = torch.randint(0, min(_vocab(cfg), 1000), (batch, seq))
        mt = _tracker()
        mt.track_external(model, ids, opt)
        with mt:
            for _ in range(accum):
                mt.enter("forward")
                ac = (
                    torch.autocast("cpu", dtype=autocast)
                    if autocast is not None
                    else contextlib.nullcontext()
                )
                with ac:
                    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
                mt.enter("backward", forward=False)
                loss.backward()
                del loss
            mt.enter("optimizer", forward=False)
            opt.step()
            opt.zero_grad(set_to_none=True)
        out["phases"] = dict(mt.phase_peaks)
        del model, opt, ids
    gc.collect()
    return out


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """Run one request: ``{"config": {...}, "mode": "inference"|"train", "run": {...}}``."""
    if not isinstance(request, dict) or not isinstance(request.get("config"), dict):
        raise TraceError("the request needs a 'config' object")
    mode = request.get("mode", "inference")
    t0 = time.perf_counter()
    fn = {"inference": trace_inference, "train": trace_training}.get(mode)
    if fn is None:
        raise TraceError(f"mode must be 'inference' or 'train', got {mode!r}")
    res = fn(request["config"], request.get("run") or {}, bool(request.get("trust_remote_code")))
    phases = res["phases"]
    peak_phase = max(phases, key=lambda k: phases[k].get("Total", 0))
    return {
        "schema": SCHEMA,
        "versions": versions(),
        "seconds": round(time.perf_counter() - t0, 3),
        "mode": mode,
        "peak_bytes": phases[peak_phase].get("Total", 0),
        "peak_phase": peak_phase,
        **res,
    }


def main() -> int:
    try:
        request = json.load(sys.stdin)
        result = handle(request)
    except TraceError as e:
        json.dump({"schema": SCHEMA, "error": str(e)}, sys.stdout)
        return 2
    except ImportError as e:
        json.dump(
            {"schema": SCHEMA, "error": f"cannot import {e.name or e}: torch and transformers are needed"},
            sys.stdout,
        )
        return 3
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
