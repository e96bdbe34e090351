"""Section (c) and the training peers of (d): llm-analysis and accelerate on the grid points.

Their figures are read from ``validation/peers.json``, which :func:`refresh_peers` rebuilds by running each
peer in its scratch virtual environment (never the project's); llm-analysis's training knobs are in
``validation/data/peer_settings.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from gpumem_gui.core.readers.hf_config import load_config_file
from gpumem_gui.core.spec.model import ModelSpec

from . import data
from .common import GT_VENV, PEERS_FILE, PEERS_VENV, Row, config_path
from .grid import grid_points, point_key, train_grid_points

# llm-analysis's train() knobs for the full fine-tune modes of the grid (it has no LoRA)
LLM_ANALYSIS_TRAIN: dict[str, dict[str, int]] = {
    mode: knobs.model_dump() for mode, knobs in data.peer_settings().llm_analysis_train.items()
}

_LLM_ANALYSIS_CODE = r"""
import dataclasses, json, sys, importlib.metadata as md
from llm_analysis import config as C
from llm_analysis.analysis import infer, train
C.gpu_configs["unbounded"] = dataclasses.replace(
    C.get_gpu_config_by_name("h100-sxm-80gb"), name="unbounded", mem_per_GPU_in_GB=1e6)
req = json.load(sys.stdin)
for name, cfg in req["models"].items():
    C.model_configs[name] = C.ModelConfig(**cfg)
out = {"version": md.version("llm-analysis"), "points": {}}
for p in req["points"]:
    try:
        r = infer(model_name=p["model"], gpu_name="unbounded", dtype_name="w16a16e16", log_level="ERROR",
                  batch_size_per_gpu=p["batch"], seq_len=p["seq"], num_tokens_to_generate=1)
        w, kv = r["weight_memory_per_gpu"], r["kv_cache_memory_per_gpu"]
        pre, dec = r["prefill_activation_memory_per_gpu"], r["decode_activation_memory_per_gpu"]
        out["points"][p["key"]] = {"weights": w, "kv": kv, "prefill_act": pre, "peak": w + max(pre, kv + dec)}
    except Exception as e:
        out["points"][p["key"]] = {"error": (type(e).__name__ + ": " + str(e))[:160]}
out["train_points"] = {}
for p in req.get("train_points", []):
    try:
        r = train(model_name=p["model"], gpu_name="unbounded", dtype_name="w16a16e16", log_level="ERROR",
                  batch_size_per_gpu=p["batch"], seq_len=p["seq"], total_num_tokens=p["batch"] * p["seq"],
                  dp_size=1, total_num_gpus=1, activation_recomputation=p["recompute"],
                  master_weights_dtype_bytes=p["master_bytes"], other_op_bytes=p["other_op_bytes"])
        out["train_points"][p["key"]] = {
            "states": r["(weight+op_state+grad)_memory_per_gpu"], "act": r["activation_memory_per_gpu"],
            "peak": r["(weight+op_state+grad+act)_memory_per_gpu"]}
    except Exception as e:
        out["train_points"][p["key"]] = {"error": (type(e).__name__ + ": " + str(e))[:160]}
print("@@JSON@@" + json.dumps(out))
"""

_ACCELERATE_CODE = r"""
import json, os, shutil, sys, tempfile, warnings, importlib.metadata as md
warnings.filterwarnings("ignore")
import torch
from transformers import AutoConfig, AutoModel
from accelerate import init_empty_weights
from accelerate.utils import calculate_maximum_sizes
out = {"version": md.version("accelerate"), "transformers": md.version("transformers"), "models": {}}
for name, path in json.load(sys.stdin).items():
    d = tempfile.mkdtemp()
    try:
        shutil.copy(path, os.path.join(d, "config.json"))
        cfg = AutoConfig.from_pretrained(d)
        with init_empty_weights():
            model = AutoModel.from_config(cfg, dtype=torch.float32)
        total, largest = calculate_maximum_sizes(model)
        out["models"][name] = {"total_fp32": int(total), "largest_layer_fp32": int(largest[0])}
    except Exception as e:
        out["models"][name] = {"error": (type(e).__name__ + ": " + str(e))[:160]}
    finally:
        shutil.rmtree(d, ignore_errors=True)
print("@@JSON@@" + json.dumps(out))
"""


def llm_analysis_config(spec: ModelSpec, max_seq: int) -> dict:
    """The most llm-analysis's ModelConfig can take of our spec (it knows no gating, sliding or MLA)."""
    ffn = spec.moe.expert_intermediate_size if spec.moe else spec.intermediate_size
    return {
        "name": spec.name,
        "num_layers": spec.num_layers,
        "n_head": spec.num_attention_heads,
        "hidden_dim": spec.hidden_size,
        "vocab_size": spec.vocab_size,
        "max_seq_len": max(spec.max_position_embeddings, max_seq),
        "num_key_value_heads": spec.num_kv_heads,
        "ffn_embed_dim": ffn,
        "expansion_ratio": ffn / spec.hidden_size,
        "model_type": spec.model_type,
        "moe_num_experts": spec.moe.num_experts if spec.moe else 1,
        "moe_top_k": spec.moe.experts_per_token if spec.moe else 1,
    }


def run_peer(python: Path, code: str, payload: object) -> dict:
    """Run ``code`` under ``python`` (offline, in the temp dir) with ``payload`` on stdin; its JSON line."""
    proc = subprocess.run(
        [str(python), "-c", code],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=tempfile.gettempdir(),
        env={
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error",
        },
    )
    for line in proc.stdout.splitlines():
        if line.startswith("@@JSON@@"):
            return json.loads(line.removeprefix("@@JSON@@"))
    raise RuntimeError(f"{python} failed (rc {proc.returncode}): {proc.stderr.strip()[-400:]}")


def grid_key(p: dict) -> str:
    return f"{p['model']}|{p['mode']}|b{p['batch']}|s{p['seq']}|{p['attn_implementation']}"


def accelerate_training_bytes(total_fp32: int, dtype: str) -> int:
    """``accelerate estimate-memory``'s "Training using Adam" in its ``dtype`` row (``float32`` or
    ``float16``, the mixed-precision one) for a model whose fp32 size is ``total_fp32``: the largest of its
    model, gradients, optimizer and step sizes (accelerate/commands/estimate.py, estimate_training_usage):
    fp32 → step = 4 x the fp32 size; float16 → optimizer = step = 2 x the fp32 size."""
    if dtype == "float32":
        sizes = [total_fp32, total_fp32, 2 * total_fp32, 4 * total_fp32]
    else:
        sizes = [total_fp32, total_fp32 + total_fp32 // 2, 2 * total_fp32, 2 * total_fp32]
    return max(sizes)


def _llm_analysis_payload(models: list[str], points: list[dict], train_points: list[dict]) -> dict:
    specs = {m: load_config_file(config_path(m)) for m in models}
    max_seq = {m: max(p["seq"] + 1 for p in [*points, *train_points] if p["model"] == m) for m in models}
    return {
        "models": {m: llm_analysis_config(specs[m], max_seq[m]) for m in models},
        "points": [
            {"key": grid_key(p), "model": p["model"], "batch": p["batch"], "seq": p["seq"]} for p in points
        ],
        "train_points": [
            {
                "key": grid_key(p),
                "model": p["model"],
                "batch": p["batch"],
                "seq": p["seq"],
                **LLM_ANALYSIS_TRAIN[p["mode"]],
            }
            for p in train_points
        ],
    }


def refresh_peers() -> dict:
    """Run the peers in their scratch environments; returns what :data:`PEERS_FILE` holds."""
    points = [p for _, p in grid_points()]
    train_points = [p for _, p in train_grid_points() if p["mode"] in LLM_ANALYSIS_TRAIN]
    models = sorted({p["model"] for p in [*points, *train_points]})
    doc: dict = {
        "about": "Peer estimates for the grid points, made by validation/validate.py --refresh-peers in "
        "scratch virtual environments (llm-analysis from PyPI; accelerate + transformers + torch CPU).",
        "llm_analysis": None,
        "accelerate": None,
    }
    la_python = PEERS_VENV / "bin" / "python"
    if la_python.is_file():
        payload = _llm_analysis_payload(models, points, train_points)
        doc["llm_analysis"] = run_peer(la_python, _LLM_ANALYSIS_CODE, payload)
    acc_python = GT_VENV / "bin" / "python"
    if acc_python.is_file():
        doc["accelerate"] = run_peer(acc_python, _ACCELERATE_CODE, {m: str(config_path(m)) for m in models})
    return doc


def peer_rows(report_grid: list[Row], peers: dict | None) -> tuple[list[dict], str]:
    """Peers on the inference grid points (each tool's peak beside ours), or why there are none."""
    if not peers:
        return [], (
            f"no peer data ({PEERS_FILE.name} missing): run with --refresh-peers where {PEERS_VENV} has "
            f"llm-analysis and {GT_VENV} has torch + transformers + accelerate"
        )
    la = (peers.get("llm_analysis") or {}).get("points", {})
    acc = (peers.get("accelerate") or {}).get("models", {})
    out = []
    for _, p in grid_points():
        row = next((r for r in report_grid if r.sort_key == point_key(p)), None)
        if row is None:
            continue
        key, a = grid_key(p), acc.get(p["model"], {})
        out.append(
            {
                "setup": row.setup,
                "sort_key": row.sort_key,
                "measured": row.measured,
                "ours": row.ours,
                "llm_analysis": la.get(key, {}).get("peak"),
                "llm_analysis_error": la.get(key, {}).get("error"),
                "accelerate": a["total_fp32"] / 2 if "total_fp32" in a else None,
                "accelerate_error": a.get("error"),
            }
        )
    return sorted(out, key=lambda d: d["sort_key"]), ""


def train_peer_rows(report_train: list[Row], peers: dict | None) -> list[dict]:
    """Peers on the full fine-tune training points (neither peer models LoRA)."""
    if not peers:
        return []
    la = (peers.get("llm_analysis") or {}).get("train_points", {})
    acc = (peers.get("accelerate") or {}).get("models", {})
    out = []
    for _, p in train_grid_points():
        if p["mode"] not in LLM_ANALYSIS_TRAIN or p.get("config_override"):
            continue
        row = next((r for r in report_train if r.sort_key[:5] == point_key(p)), None)
        if row is None:
            continue
        key, a = grid_key(p), acc.get(p["model"], {})
        fp32 = "total_fp32" in a
        out.append(
            {
                "setup": row.setup,
                "sort_key": row.sort_key,
                "measured": row.measured,
                "ours": row.ours,
                "llm_analysis": la.get(key, {}).get("peak"),
                "llm_analysis_error": la.get(key, {}).get("error") if la else "not run (--refresh-peers)",
                "accelerate": accelerate_training_bytes(a["total_fp32"], "float16") if fp32 else None,
                "accelerate_fp32": accelerate_training_bytes(a["total_fp32"], "float32") if fp32 else None,
                "accelerate_error": a.get("error"),
            }
        )
    return sorted(out, key=lambda d: d["sort_key"])
