"""Speed of the peers, timed in their own scratch environments during our benchmark run.

* **llm-analysis** (PyPI; ``$GPUMEM_PEERS_VENV``, default ``/tmp/peers-venv``): ``infer()`` for
  Llama-3.1-8B batch 1 / 4096 tokens, ``train()`` with ZeRO-3 on dp 8 x TP 2, and 256 ``infer()`` calls
  over the sequence lengths our sweep uses. The model is registered from our spec as
  ``validation/validate.py`` does (registration is not timed).
* **accelerate** (``$GPUMEM_GT_VENV``, default ``/tmp/gt-venv``: torch CPU + transformers + accelerate):
  what ``accelerate estimate-memory`` does for a config: ``AutoConfig`` from the file, the model built on
  the meta device under ``init_empty_weights``, ``calculate_maximum_sizes``. Timed warm (median of builds
  in one process, imports done) and cold (a fresh process: importing torch and transformers, then one
  build), since a user of its CLI pays the cold figure every time.

``make peers`` creates both environments (needs PyPI). Each peer prints one ``@@JSON@@`` line.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEERS_VENV = Path(os.environ.get("GPUMEM_PEERS_VENV", "/tmp/peers-venv"))
GT_VENV = Path(os.environ.get("GPUMEM_GT_VENV", "/tmp/gt-venv"))
LLAMA_CONFIG = REPO / "tests" / "reference" / "configs" / "meta-llama__Llama-3.1-8B.json"

_LLM_ANALYSIS = r"""
import dataclasses, gc, json, statistics, sys, time, importlib.metadata as md
from llm_analysis import config as C
from llm_analysis.analysis import infer, train
req = json.load(sys.stdin)
C.model_configs["bench"] = C.ModelConfig(**req["model"])
GPU = "h100-sxm-80gb"

def med(fn, min_time, min_runs=5):
    fn()
    ts = []
    gc.disable()
    end = time.perf_counter() + min_time
    while len(ts) < min_runs or time.perf_counter() < end:
        t = time.perf_counter_ns(); fn(); ts.append(time.perf_counter_ns() - t)
    gc.enable()
    return statistics.median(ts) / 1e9, len(ts)

def one(seq):
    return infer(model_name="bench", gpu_name=GPU, dtype_name="w16a16e16", log_level="ERROR",
                 batch_size_per_gpu=1, seq_len=seq, num_tokens_to_generate=1)

def tr():
    return train(model_name="bench", gpu_name=GPU, dtype_name="w16a16e16", log_level="ERROR",
                 batch_size_per_gpu=1, seq_len=4096, ds_zero=3, dp_size=8, tp_size=2, total_num_gpus=16,
                 total_num_tokens=4096 * 16)

def sweep():
    for s in req["sweep"]:
        one(s)

t = req["min_time"]
out = {"version": md.version("llm-analysis")}
out["infer_s"], out["infer_runs"] = med(lambda: one(4096), t)
out["train_s"], out["train_runs"] = med(tr, t)
out["sweep_s"], out["sweep_runs"] = med(sweep, t, min_runs=3)
print("@@JSON@@" + json.dumps(out))
"""

_ACCELERATE = r"""
import json, os, shutil, statistics, sys, tempfile, time, warnings
t_start = time.perf_counter()
warnings.filterwarnings("ignore")
import importlib.metadata as md
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from accelerate import init_empty_weights
from accelerate.utils import calculate_maximum_sizes
req = json.load(sys.stdin)
t_imported = time.perf_counter()

def build():
    d = tempfile.mkdtemp()
    try:
        shutil.copy(req["config"], os.path.join(d, "config.json"))
        cfg = AutoConfig.from_pretrained(d)
        with init_empty_weights():
            model = AutoModelForCausalLM.from_config(cfg)
        return calculate_maximum_sizes(model)[0]
    finally:
        shutil.rmtree(d, ignore_errors=True)

t0 = time.perf_counter()
total = build()
first = time.perf_counter() - t0
ts = []
for _ in range(req["builds"]):
    t0 = time.perf_counter(); build(); ts.append(time.perf_counter() - t0)
out = {"version": md.version("accelerate"), "transformers": md.version("transformers"),
       "torch": md.version("torch"), "imports_s": t_imported - t_start, "first_build_s": first,
       "warm_build_s": statistics.median(ts), "warm_builds": len(ts), "total_bytes_fp32": int(total)}
print("@@JSON@@" + json.dumps(out))
"""


@functools.cache
def _validate_module():  # type: ignore[no-untyped-def]
    """validation/validate.py: the llm-analysis model config made from our spec and the peer runner (one
    definition each)."""
    spec = importlib.util.spec_from_file_location("gpumem_validate", REPO / "validation" / "validate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def llm_analysis(sweep_seqs: list[int], min_time: float) -> dict:
    """llm-analysis timings, or ``{"missing": reason}``."""
    python = PEERS_VENV / "bin" / "python"
    if not python.is_file():
        return {"missing": f"no {python} (make peers)"}
    from gpumem_gui.core import load_model

    spec = load_model("meta-llama/Llama-3.1-8B").spec
    assert spec is not None
    model = _validate_module()._llm_analysis_config(spec, max(sweep_seqs) + 1)
    model["name"] = "bench"
    payload = {"model": model, "sweep": sweep_seqs, "min_time": min_time}
    try:
        return _validate_module()._run_peer(python, _LLM_ANALYSIS, payload)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return {"missing": str(e)[:300]}


def accelerate(builds: int) -> dict:
    """accelerate's meta-model estimate timings, or ``{"missing": reason}``."""
    python = GT_VENV / "bin" / "python"
    if not python.is_file():
        return {"missing": f"no {python} (make peers)"}
    try:
        out = _validate_module()._run_peer(
            python, _ACCELERATE, {"config": str(LLAMA_CONFIG), "builds": builds}
        )
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return {"missing": str(e)[:300]}
    # what its CLI pays on every call: imports, then one build (the interpreter's own start not counted)
    out["cold_s"] = out["imports_s"] + out["first_build_s"]
    return out
