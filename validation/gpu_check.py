"""Measure real GPU memory for reference models, to calibrate gpumem's overhead terms on actual hardware.

Runs on a machine with an NVIDIA GPU, torch and transformers (no gpumem needed there; no download: models are
built from config.json with random weights). For each (config, setup) it records, in a fresh state:

* ``allocated``: ``torch.cuda.max_memory_allocated()`` (compare with gpumem's ``peak_bytes``);
* ``reserved``: ``torch.cuda.max_memory_reserved()``;
* ``nvml_used``: NVML's used memory of the device at the end (compare with ``total_bytes``; it includes the
  CUDA context and library workspaces);
* ``context``: NVML used after CUDA initialisation and one tiny allocation, before the model exists.

Usage (device machine)::

    python3 validation/gpu_check.py --configs tests/reference/configs --out $OUT/gpu_check.json

then here: copy the JSON to ``validation/gpu_results/<gpu>.json`` and run ``make validate``, which adds the
comparison to ``docs/validation.md`` (section (e)); ``validation/gpu_compare.py FILE`` prints it alone.

``--device cpu`` runs the same code paths on the CPU with tiny shapes (memory figures are then zero); the
test suite does not run this script, it needs torch.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

# (config file stem, setup) pairs; setups mirror gpumem's CLI flags
SETUPS = [
    (
        "meta-llama__Llama-3.2-1B",
        {"mode": "infer", "batch": 1, "seq": 2048, "logits": "last", "new_tokens": 0},
    ),
    (
        "meta-llama__Llama-3.2-1B",
        {"mode": "infer", "batch": 4, "seq": 2048, "logits": "all", "new_tokens": 0},
    ),
    (
        "meta-llama__Llama-3.2-1B",
        {"mode": "generate", "batch": 2, "seq": 1024, "logits": "last", "new_tokens": 64},
    ),
    ("Qwen__Qwen2.5-0.5B", {"mode": "infer", "batch": 1, "seq": 4096, "logits": "last", "new_tokens": 0}),
    ("Qwen__Qwen3-0.6B", {"mode": "infer", "batch": 2, "seq": 2048, "logits": "all", "new_tokens": 0}),
    (
        "meta-llama__Llama-3.1-8B",
        {"mode": "infer", "batch": 1, "seq": 8192, "logits": "last", "new_tokens": 0},
    ),
    ("meta-llama__Llama-3.2-1B", {"mode": "train_amp_adamw", "batch": 2, "seq": 1024}),
    ("meta-llama__Llama-3.2-1B", {"mode": "train_bf16_adamw", "batch": 2, "seq": 1024}),
    ("Qwen__Qwen2.5-0.5B", {"mode": "train_amp_adamw_gc", "batch": 4, "seq": 2048}),
]


def nvml_used(index: int) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        return int(pynvml.nvmlDeviceGetMemoryInfo(h).used)
    except Exception:
        return None


def run_one(torch, transformers, cfg_path: Path, setup: dict, device: str) -> dict:
    cuda = device == "cuda"
    cfg = transformers.AutoConfig.for_model(**json.loads(cfg_path.read_text()))
    if not cuda:  # keep the CPU smoke run small
        for k in ("num_hidden_layers",):
            setattr(cfg, k, 1)
    train = setup["mode"].startswith("train")
    dtype = torch.float32 if setup["mode"].startswith("train_amp") else torch.bfloat16
    # transformers >= 4.56 calls it ``dtype`` (``torch_dtype`` is deprecated there, the only name before)
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    dtype_kw = {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", **dtype_kw)
    b, s = setup["batch"], setup["seq"] if cuda else 16
    ids = torch.randint(0, cfg.vocab_size if hasattr(cfg, "vocab_size") else 1000, (b, s), device=device)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    if not train:
        model.eval()
        with torch.no_grad():
            if setup["mode"] == "generate":
                model.generate(
                    ids,
                    max_new_tokens=setup["new_tokens"],
                    min_new_tokens=setup["new_tokens"],
                    do_sample=False,
                )
            else:
                keep = 1 if setup["logits"] == "last" else 0
                out = model(ids, use_cache=True, logits_to_keep=keep)
                del out
    else:
        model.train()
        if setup["mode"].endswith("_gc"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
        for _ in range(2):  # the second step is the steady state (optimizer states exist)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            amp = setup["mode"].startswith("train_amp")
            with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
                loss = model(ids, labels=ids, use_cache=False).loss
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    rec = {
        "config": cfg_path.stem,
        **setup,
        "seconds": round(time.perf_counter() - t0, 3),
        "allocated": int(torch.cuda.max_memory_allocated()) if cuda else 0,
        "reserved": int(torch.cuda.max_memory_reserved()) if cuda else 0,
        "nvml_used": nvml_used(0) if cuda else None,
    }
    del model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=Path, default=Path("tests/reference/configs"))
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--only", default="", help="substring of config names to run")
    args = ap.parse_args(argv)
    import torch
    import transformers

    cuda = args.device == "cuda"
    result: dict = {
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "points": [],
    }
    if cuda:
        before = nvml_used(0)
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        result["gpu"] = torch.cuda.get_device_name(0)
        # the generation gpumem sizes the CUDA context and cuBLAS workspaces by (gpu_compare.py: gpu_arch)
        result["compute_capability"] = "{}.{}".format(*torch.cuda.get_device_capability(0))
        result["total_bytes"] = torch.cuda.get_device_properties(0).total_memory
        result["nvml_used_before_cuda"] = before
        result["context_bytes"] = (nvml_used(0) or 0) - (before or 0)
    for name, setup in SETUPS:
        if args.only and args.only not in name:
            continue
        path = args.configs / f"{name}.json"
        try:
            rec = run_one(torch, transformers, path, setup, args.device)
        except Exception as e:  # record and go on: one failing point must not lose the others
            rec = {"config": name, **setup, "error": f"{type(e).__name__}: {e}"}
        result["points"].append(rec)
        print(json.dumps(rec), flush=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
