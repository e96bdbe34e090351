"""SGLang's recurrent-state ("mamba") pool of hybrid models (gpumem_gui/core/runtimes/sglang_state.py): the
per-request state bytes at the byte against our reading of SGLang's configs/mamba_utils.py, the split of the
budget between the state pool and the KV pool (kv_cache_configurator.py), and two published startup logs:

* Qwen3.5-9B, TP=2, --mem-fraction-static 0.8 (a study note of SGLang's memory, stored file 53944457073;
  its address could not be resolved): ``avail mem=22.93 GB`` before load, ``14.08 GB`` after, ``Mamba Cache
  is allocated. max_mamba_cache_size: 186, conv_state size: 0.10GB, ssm_state size: 4.38GB``, ``#tokens:
  327310``, ``max_running_requests=62``;
* LFM2-700M, TP=1 (https://github.com/sgl-project/sglang/pull/16065, sglang 0.5.6.post2, a 16 GB GPU):
  ``avail mem=15.33 GB`` before load, ``13.81 GB`` after, ``max_mamba_cache_size: 85292``, ``#tokens:
  473854``. That build solved ``K = budget // per_req`` (no padding slot); the newest code, modelled here,
  gives one slot less per ``per_req`` of budget.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.fit import GpuTarget, fit_report
from gpumem_gui.core.imports import import_command
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run, runtime
from gpumem_gui.core.runtimes.sglang_defaults import server_defaults
from gpumem_gui.core.runtimes.sglang_pool import preload_bytes, size_pool
from gpumem_gui.core.runtimes.sglang_state import hybrid_cells, staged_state, state_per_request
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.state import has_state
from gpumem_gui.core.units import GiB, MiB
from tests.conftest import REPO

CONFIGS = REPO / "resources" / "configs"
EXTRA = REPO / "tests" / "reference" / "extra" / "configs"


def _spec(key: str) -> ModelSpec:
    return spec_from_config(json.loads((CONFIGS / f"{key}.json").read_text()), name=key)


def _est(spec: ModelSpec, capacity: int | None = 80 * GiB, **fields: object):
    return estimate_inference(spec, make_run(engine="sglang", **fields), capacity=capacity)


def _comp(est, key: str):
    return next(c for c in est.components if c.key == key)


# ----------------------------------------------------------------------------------- per-request state


@pytest.mark.parametrize(
    ("key", "tp", "conv", "ssm"),
    [
        # gated DeltaNet (n_groups = 16 key heads, state = key dim 128): 24 layers of conv ((4096 + 2 x 16 x
        # 128) / tp, 3) in bf16 and temporal (32 / tp, 128, 128) in fp32
        ("Qwen__Qwen3.5-9B", 2, 24 * 4096 * 3 * 2, 24 * 16 * 128 * 128 * 4),
        # Qwen3-Next: 36 GDN layers, conv (8192 / tp, 3), temporal (32 / tp, 128, 128): 73.69 MiB at tp 1
        ("Qwen__Qwen3-Next-80B-A3B-Instruct", 1, 36 * 8192 * 3 * 2, 36 * 32 * 128 * 128 * 4),
        ("Qwen__Qwen3-Next-80B-A3B-Instruct", 4, 36 * 2048 * 3 * 2, 36 * 8 * 128 * 128 * 4),
        # Mamba-2, 8 groups divide tp 2: conv ((8192 + 2 x 8 x 128) / 2, 3), temporal (64, 64, 128)
        ("nvidia__Nemotron-H-8B-Base-8K", 2, 24 * 5120 * 3 * 2, 24 * 64 * 64 * 128 * 4),
        # Mamba-2, 1 group padded to tp 2 (extra_groups_for_head_shards): conv ((3072 + 2 x 2 x 128) / 2, 3)
        ("ibm-granite__granite-4.0-h-tiny", 2, 36 * 1792 * 3 * 2, 36 * 24 * 64 * 128 * 4),
        # Falcon-H1: every layer is Mamba-2 (and attention): conv (1536 + 2 x 128, 3), temporal (24, 64, 128)
        ("tiiuae__Falcon-H1-0.5B-Instruct", 1, 36 * 1792 * 3 * 2, 36 * 24 * 64 * 128 * 4),
        # KDA: conv (3, (32 x 128 + 2 x 32 x 128) / tp), temporal (32 / tp, 128, 128)
        ("moonshotai__Kimi-Linear-48B-A3B-Instruct", 2, 20 * 3 * 6144 * 2, 20 * 16 * 128 * 128 * 4),
        # LFM2 short conv: conv (hidden / tp, L_cache - 1), no temporal state
        ("LiquidAI__LFM2-700M", 1, 10 * 1536 * 2 * 2, 0),
    ],
)
def test_state_per_request_is_sglangs_mamba_cache_per_req(key: str, tp: int, conv: int, ssm: int) -> None:
    state = state_per_request(_spec(key), tp)
    assert (state.conv, state.ssm, state.per_req) == (conv, ssm, conv + ssm)


def test_conv_state_is_bf16_whatever_the_model_dtype_and_ssm_follows_its_flag() -> None:
    spec = _spec("Qwen__Qwen3.5-9B")
    fp32 = _est(spec, compute_dtype="fp32", tp=2).facts
    bf16 = _est(spec, tp=2, mamba_ssm_dtype="bfloat16").facts
    assert fp32["state_bytes_per_request"] == 25_755_648  # 24.56 MiB: conv 2 B, temporal fp32
    assert bf16["state_bytes_per_request"] == 24 * (4096 * 3 * 2 + 16 * 128 * 128 * 2)
    assert bf16["mamba_ssm_dtype"] == "bfloat16"


# ------------------------------------------------------------------------------------ published logs


def _pool(key: str, tp: int, before: float, after: float, sd_gpu: int, context_len: int, **fields: object):
    """The pool from a log's free memory before (P) and after loading (P - weights), in GiB, and SGLang's
    defaults for a GPU of ``sd_gpu`` bytes."""
    spec = _spec(key)
    run = make_run(engine="sglang", tp=tp, **fields)
    free = round(before * GiB)
    capacity = free + preload_bytes(run, free + 2 * GiB)
    weights = free - round(after * GiB)
    cells = hybrid_cells(spec, 2, tp, range(spec.num_layers))
    state = staged_state(spec, tp, "float32", [range(spec.num_layers)])
    return size_pool(run, capacity, server_defaults(run, sd_gpu), [(weights, cells)], context_len, state)


def test_qwen35_9b_tp2_log() -> None:
    pool = _pool("Qwen__Qwen3.5-9B", 2, 22.93, 14.08, 24 * GiB, 262144, mem_fraction_static=0.8)
    m = pool.mamba
    assert m is not None and m.slots == 186 and pool.max_running_requests == 62  # 186 // 3
    assert round((m.slots + 1) * m.state.conv / GiB, 2) == 0.10
    assert round((m.slots + 1) * m.state.ssm / GiB, 2) == 4.38
    assert abs(pool.tokens / 327_310 - 1) < 0.005  # 328,234: +0.28 % (the log's 2-decimal GB)


def test_lfm2_700m_log() -> None:
    """SGLang's default fraction for a 16,303 MiB GPU: round((16303 - 3728) / 16303, 3) = 0.771."""
    pool = _pool("LiquidAI__LFM2-700M", 1, 15.33, 13.81, 16303 * MiB, 128000)
    assert pool.fraction == 0.771
    m = pool.mamba
    assert m is not None and abs(m.slots / 85_292 - 1) < 0.005  # 85,260: -0.04 %
    assert abs(pool.tokens / 473_854 - 1) < 0.005  # 473,673: -0.04 %
    assert round((m.slots + 1) * m.state.conv / GiB, 2) == 4.88 and m.state.ssm == 0


# ------------------------------------------------------------------------------------- the pool split


def test_budget_branch_at_the_byte() -> None:
    spec = _spec("Qwen__Qwen3.5-9B")
    est = _est(spec, tp=2, batch=4, seq=4096)
    f = est.facts
    per = 25_755_648
    rest = int(f["pre_load_free_bytes"]) * float(f["mem_fraction_static"]) - _comp(est, "weights").bytes  # type: ignore[call-overload, arg-type]
    k = int((rest * 0.9 / 1.9 - per) // per)
    assert f["max_mamba_cache_size"] == k
    assert f["max_total_num_tokens"] == int((rest - (k + 1) * per) // 16384)  # 8 attention layers only
    assert f["kv_bytes_per_token"] == 8 * 2 * 512 * 2
    assert _comp(est, "mamba_state").bytes == (k + 1) * per == f["conv_state_bytes"] + f["ssm_state_bytes"]  # type: ignore[operator]
    assert f["max_running_requests"] == min(k // 3, int(f["max_total_num_tokens"]) // 2)  # type: ignore[call-overload]
    assert est.phases["pool"].peak_bytes >= _comp(est, "mamba_state").bytes + _comp(est, "kv_cache").bytes
    tokens = make_run(engine="sglang", batch=4, seq=4096).tokens
    assert est.kv_cache_bytes == 4 * tokens * 16384 + 4 * per  # a sequence: its KV and its state


def test_explicit_and_radix_off_branches() -> None:
    spec = _spec("LiquidAI__LFM2-700M")
    assert _est(spec, max_mamba_cache_size=500).facts["max_mamba_cache_size"] == 500
    assert _est(spec, max_mamba_cache_size=500).facts["max_running_requests"] == 500 // 3
    off = _est(spec, disable_radix_cache=True, max_running_requests=64).facts
    assert (off["max_mamba_cache_size"], off["max_running_requests"], off["mamba_slots_per_request"]) == (
        64,
        64,
        1,
    )
    dp = _est(spec, tp=2, dp_size=2, enable_dp_attention=True, max_mamba_cache_size=500).facts
    assert dp["max_mamba_cache_size"] == 250  # per attention-DP rank


def test_falcon_h1_counts_every_layer_as_attention() -> None:
    spec = _spec("tiiuae__Falcon-H1-0.5B-Instruct")
    assert _est(spec).facts["kv_bytes_per_token"] == 36 * 2 * 2 * 64 * 2


def test_no_slot_is_a_one_line_refusal_and_not_admitted() -> None:
    est = _est(_spec("Qwen__Qwen3.5-9B"), mamba_full_memory_ratio=0.0001)
    assert est.facts["max_mamba_cache_size"] <= 0  # type: ignore[operator]
    (w,) = [w for w in est.warnings if "hybrid state" in w]
    assert w.startswith("mamba_full_memory_ratio:") and "\n" not in w
    assert not runtime("sglang").admits(est)


def test_a_batch_beyond_the_state_slots_warns_and_is_not_admitted() -> None:
    spec = _spec("Qwen__Qwen3.5-9B")
    est = _est(spec, batch=40, seq=1024, max_mamba_cache_size=60)
    assert est.facts["max_running_requests"] == 20
    assert any(w.startswith("max_mamba_cache_size:") for w in est.warnings)
    assert not runtime("sglang").admits(est)
    assert runtime("sglang").admits(_est(spec, batch=20, seq=1024, max_mamba_cache_size=60))


def test_without_a_gpu_the_state_pool_holds_the_batch() -> None:
    est = _est(_spec("LiquidAI__LFM2-700M"), capacity=None, batch=5)
    assert est.facts["max_mamba_cache_size"] == 15 and _comp(est, "mamba_state").bytes == 16 * 61440


# ---------------------------------------------------------------------------- options, command, checks


def test_options_are_validated_and_written_back() -> None:
    with pytest.raises(GpumemInputError) as e:
        make_run(engine="sglang", mamba_full_memory_ratio=0)
    assert e.value.field == "mamba_full_memory_ratio"
    with pytest.raises(GpumemInputError):
        make_run(engine="sglang", mamba_ssm_dtype="int8")
    spec = _spec("LiquidAI__LFM2-700M")
    run = make_run(
        engine="sglang", mamba_full_memory_ratio=0.5, max_mamba_cache_size=100, mamba_ssm_dtype="bfloat16"
    )
    cmd = runtime("sglang").command("LiquidAI/LFM2-700M", run, estimate_inference(spec, run, 80 * GiB))
    assert "--mamba-full-memory-ratio 0.5 --max-mamba-cache-size 100 --mamba-ssm-dtype bfloat16" in cmd
    back = import_command(cmd).run
    assert (back.mamba_full_memory_ratio, back.max_mamba_cache_size, back.mamba_ssm_dtype) == (
        0.5,
        100,
        "bfloat16",
    )
    plain = make_run(engine="sglang")
    assert "mamba" not in runtime("sglang").command("x", plain, estimate_inference(spec, plain, 80 * GiB))


def test_tp_shards_the_state() -> None:
    spec = _spec("Qwen__Qwen3-Next-80B-A3B-Instruct")
    assert _est(spec, tp=4, weights="fp8").facts["state_bytes_per_request"] == 36 * (
        2048 * 3 * 2 + 8 * 128**2 * 4
    )
    with pytest.raises(GpumemInputError) as e:  # llama.cpp keeps whole layers per GPU: no TP
        estimate_inference(spec, make_run(engine="llama.cpp", weights="gguf-q4_k_m", tp=2))
    assert e.value.field == "tp"


@pytest.mark.parametrize("key", ["ai21labs__Jamba-v0.1", "MiniMaxAI__MiniMax-Text-01-hf"])
def test_mamba1_and_lightning_stay_refused(key: str) -> None:
    cfg = EXTRA / f"{key}.json"
    spec = spec_from_config(json.loads(cfg.read_text()), name=key)
    with pytest.raises(GpumemInputError) as e:
        _est(spec)
    assert e.value.field == "engine" and "\n" not in str(e.value)


def _hybrid_configs() -> list[Path]:
    return sorted(p for d in (CONFIGS, EXTRA) for p in d.glob("*.json"))


def test_every_hybrid_the_readers_read_estimates_or_refuses_in_one_line() -> None:
    seen = estimated = 0
    for path in _hybrid_configs():
        try:
            spec = spec_from_config(json.loads(path.read_text()), name=path.stem)
        except GpumemInputError:
            continue
        if not has_state(spec):
            continue
        seen += 1
        for tp in (1, 2):
            try:
                est = _est(spec, tp=tp, batch=2, seq=2048)
            except GpumemInputError as e:
                assert "\n" not in str(e) and e.field, path.stem
                continue
            estimated += 1
            assert _comp(est, "mamba_state").bytes > 0 or est.facts["max_mamba_cache_size"] <= 0, path.stem  # type: ignore[operator]
    assert seen >= 20 and estimated >= 20


def test_the_fit_sees_the_state_slots() -> None:
    """On a 24 GiB GPU the state pool, not the KV pool, caps the batch: max_running_requests = K // 3; the
    levers offer a larger state share and the radix cache off."""
    spec = _spec("Qwen__Qwen3.5-9B")
    target = GpuTarget(name="24 GiB", capacity_bytes=24 * GiB, count=1)
    rep = fit_report(spec, make_run(engine="sglang", batch=1, seq=2048), target)
    f = rep.estimate.facts
    assert rep.max_batch == f["max_running_requests"] == int(f["max_mamba_cache_size"]) // 3  # type: ignore[call-overload]
    over = fit_report(spec, make_run(engine="sglang", batch=rep.max_batch + 1, seq=2048), target)  # type: ignore[operator]
    kinds = {c.kind for c in over.changes if c.fits}
    assert {"mamba_full_memory_ratio", "disable_radix_cache"} <= kinds
