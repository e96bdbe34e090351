"""Regenerate the traced reference measurements under ``tests/reference/trace/`` (``make references``).

Each point is one request to the trace worker (:mod:`gpumem_gui.trace.gpumem_trace_worker`, the engine of
``gpumem trace``): the real transformers model
built from a reference config under ``FakeTensorMode``, counted by PyTorch's ``MemTracker``. The worker runs
in the Python named by ``--python`` (default ``$GPUMEM_GT_VENV/bin/python``, the environment ``make peers``
creates: torch 2.13.0 CPU, transformers 5.24.0, peft), one process per point, two at a time.

The points cover what the accuracy tests check beyond ``groundtruth.json``: prefill with all or the last
logits, decode steps after a cache (sliding windows wrapped), eager and sdpa attention, for every reference
config; training steps (mixed precision, pure bf16, checkpointing, LoRA) for the architectures the published
grid does not cover.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from validation.validate_report.common import GT_VENV, config_path  # noqa: E402

OUT = REPO / "tests" / "reference" / "trace"
CONFIG_DIRS = (REPO / "tests" / "reference" / "configs", REPO / "tests" / "reference" / "extra" / "configs")

# training is traced for these (architectures and option branches the published training grid lacks)
TRAIN_MODELS = (
    "tiiuae__falcon-7b",
    "tiiuae__falcon-rw-1b",
    "bigscience__bloom-560m",
    "facebook__opt-125m",
    "facebook__opt-350m",
    "EleutherAI__pythia-160m",
    "bigcode__starcoder2-3b",
    "allenai__OLMo-2-1124-7B",
    "microsoft__Phi-3-mini-4k-instruct",
    "deepseek-ai__DeepSeek-V2-Lite",
    "synthetic__deepseek_v3-small",
    "synthetic__qwen2_moe-sparse-step2",
    "google__gemma-2b",
    "google__gemma-2-2b",
    "ibm-granite__granite-3.0-2b-base",
    "mistralai__Mistral-7B-v0.1",
    # issue 14, group dense_a
    "synthetic__smollm3-tiny",
    "synthetic__arcee-tiny",
    "synthetic__apertus-tiny",
    "synthetic__cohere2-tiny",
    "synthetic__gptj-tiny",
    # issue 14, group dense_b
    "THUDM__GLM-4-9B-0414",
    "baidu__ERNIE-4.5-0.3B-PT",
    "bigcode__starcoderbase-1b",
    "tencent__Hunyuan-7B-Instruct",
    "ByteDance-Seed__Seed-OSS-36B-Instruct",
    "synthetic__mistral3-tiny",
    # issue 14, group moe
    "allenai__OLMoE-1B-7B-0924",
    "synthetic__phimoe-tiny",
    "synthetic__glm4_moe-tiny",
    "synthetic__minimax_m2-tiny",
    "synthetic__ernie4_5_moe-tiny",
    # issue 14, group gpt_oss
    "synthetic__gpt_oss-tiny",
    "openai__gpt-oss-20b",
    # issue 14, group llama4
    "synthetic__llama4-tiny",
    # issue 14, group hybrid
    "synthetic__qwen3_next-tiny",
    "synthetic__qwen3_5-tiny",
    "synthetic__lfm2-tiny",
    # issue 14, group vlm
    "synthetic__qwen2_5_vl-tiny",
    "synthetic__qwen3_vl-tiny",
    "synthetic__qwen3_vl_moe-tiny",
    # issue 14, group linear
    "synthetic__lfm2_moe-tiny",
    "synthetic__kimi_linear-tiny",
    "synthetic__bailing_hybrid-tiny",
    # issue 14, group mla
    "synthetic__deepseek_v32-tiny",
    "synthetic__mistral4-tiny",
    "synthetic__glm_moe_dsa-tiny",
    # issue 14, group ssm
    "synthetic__nemotron_h-tiny",
    "synthetic__jamba-tiny",
    "synthetic__granitemoehybrid-tiny",
    "synthetic__falcon_h1-tiny",
    # issue 14, group mllama
    "synthetic__mllama-tiny",
    # issue 14, group gemma
    "synthetic__gemma4-tiny",
    "synthetic__gemma4-moe-tiny",
    # issue 29 item 3: LoRA on fused MoE experts, both PEFT conversion patterns (qwen2_moe's with dense
    # layers between the MoE ones, mixtral's)
    "synthetic__qwen3_moe-sparse-step2",
    "synthetic__minimax-tiny",
)


def all_models() -> list[str]:
    return sorted({p.stem for d in CONFIG_DIRS for p in d.glob("*.json")})


def _window(cfg: dict[str, Any]) -> int | None:
    tc = cfg.get("text_config") or cfg
    w = tc.get("sliding_window")
    return w if isinstance(w, int) and w > 0 else None


def inference_points(model: str) -> list[dict[str, Any]]:
    cfg = json.loads(config_path(model).read_text())
    pts = [
        {"batch": 1, "seq": 1024, "logits": "last", "attn": "sdpa"},
        {"batch": 2, "seq": 512, "logits": "all", "attn": "eager"},
        {"batch": 1, "seq": 1000, "new_tokens": 100, "attn": "sdpa"},
        {"batch": 2, "seq": 300, "new_tokens": 50, "attn": "eager"},
    ]
    w = _window(cfg)
    if w is not None and w < 8192:
        pts.append({"batch": 1, "seq": w + 300, "new_tokens": 40, "attn": "sdpa"})
    return pts


def training_points(model: str) -> list[dict[str, Any]]:
    return [
        {"precision": "amp-bf16", "batch": 1, "seq": 512, "attn": "sdpa"},
        {"precision": "bf16", "batch": 2, "seq": 256, "attn": "eager"},
        {"precision": "amp-bf16", "batch": 1, "seq": 512, "attn": "sdpa", "grad_ckpt": True},
        {"method": "lora", "precision": "bf16", "batch": 1, "seq": 512, "attn": "sdpa", "lora_rank": 8},
    ]


def _run(python: str, model: str, mode: str, run: dict[str, Any], timeout: int) -> dict[str, Any]:
    from gpumem_gui.trace import TraceFailure, TraceJob, TraceRequest

    req = TraceRequest(config=json.loads(config_path(model).read_text()), mode=mode, run=run)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    try:
        res = TraceJob(req, python, timeout).result()
    except TraceFailure as e:
        return {"model": model, "mode": mode, "run": run, "error": e.message[:300]}
    res.pop("schema", None)
    print(
        f"{model} {mode} {run}: {res.get('peak_bytes', res.get('error'))} ({time.perf_counter() - t0:.0f} s)",
        file=sys.stderr,
    )
    return {"model": model, "mode": mode, "run": run, **res}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=str(GT_VENV / "bin" / "python"))
    ap.add_argument("--only", help="models whose name contains this")
    ap.add_argument("--kind", choices=["inference", "train", "all"], default="all")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=900)
    args = ap.parse_args(argv)
    jobs: list[tuple[str, str, dict[str, Any]]] = []
    if args.kind in ("inference", "all"):
        jobs += [(m, "inference", r) for m in all_models() for r in inference_points(m)]
    if args.kind in ("train", "all"):
        jobs += [(m, "train", r) for m in TRAIN_MODELS for r in training_points(m)]
    if args.only:
        jobs = [j for j in jobs if args.only in j[0]]
    with ThreadPoolExecutor(args.jobs) as ex:
        results = list(ex.map(lambda j: _run(args.python, *j, args.timeout), jobs))
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / ".lock").open("w") as lock:  # several regenerations may merge into the same files
        fcntl.flock(lock, fcntl.LOCK_EX)
        _merge(results)
    return 1 if any("error" in r for r in results) else 0


def _merge(results: list[dict[str, Any]]) -> None:
    for kind in ("inference", "train"):
        pts = [r for r in results if r["mode"] == kind]
        if not pts:
            continue
        path = OUT / f"{kind}.json"
        old = json.loads(path.read_text())["points"] if path.is_file() else []
        key = lambda r: (r["model"], json.dumps(r["run"], sort_keys=True))  # noqa: E731
        merged = {key(r): r for r in old}
        merged.update({key(r): r for r in pts})
        doc = {
            "about": "Traced by validation/trace_references.py (the gpumem trace worker): the real "
            "transformers model under FakeTensorMode, counted by torch's MemTracker. Bytes.",
            "points": [merged[k] for k in sorted(merged)],
        }
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{path}: {len(doc['points'])} points", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
