"""SGLang hybrids over pipeline stages (gpumem_gui/core/runtimes/sglang_state.py ``staged_state``,
sglang_pool.py ``size_pool``), at the byte against SGLang's own arithmetic, re-derived here from the
configs' layer patterns rather than from gpumem's layer kinds:

* each rank allocates the state of its own slice only: ``_init_pools`` passes ``mamba_layer_ids = [i for i
  in config.mamba2_cache_params.layers if start_layer <= i < end_layer]`` (sglang PR #21448);
* the profile charges every rank the fullest stage's share: ``stage_per_req = int(mamba_cache_per_req x
  max_stage_mamba_layers / len(layers))`` (kv_cache_configurator.py ``_handle_max_mamba_cache``, PR #33666,
  in release v0.5.17), K = ``int((rest x r / (1 + r) - stage_per_req) // stage_per_req)`` and ``rest -
  (K + 1) x stage_per_req`` is left for the KV pool;
* ``rest`` is the least over all ranks (``get_available_gpu_memory(distributed=True)`` all-reduces MIN);
* each stage's KV cell counts its own attention layers (pool_configurator.py ``DefaultPoolConfigurator``:
  ``full_attention_layer_ids`` in ``[start_layer, end_layer)``), and the token count is the minimum over
  stages (``_apply_token_constraints``: all-reduce MIN over the PP ranks).

Stages follow sglang distributed/utils.py ``get_pp_indices`` (the last ``remainder`` stages take one layer
more: Nemotron-H-8B's 52 layers at pp 3 are 17, 17, 18; LFM2-700M's 16 are 5, 5, 6).
"""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.units import GiB
from tests.conftest import REPO

CONFIGS = REPO / "resources" / "configs"


def _config(key: str) -> dict:
    return json.loads((CONFIGS / f"{key}.json").read_text())


def _sglang_pp_indices(n: int, rank: int, pp: int) -> tuple[int, int]:
    """sglang/srt/distributed/utils.py get_pp_indices without SGLANG_PP_LAYER_PARTITION."""
    base, rem = divmod(n, pp)
    if rank >= pp - rem:
        start = rank * (base + 1) - (pp - rem)
        return start, start + base + 1
    return rank * base, rank * base + base


def _layers(key: str) -> tuple[int, list[int], list[int]]:
    """(layers, state layer ids, attention layer ids) from the config as SGLang's configs read it."""
    c = _config(key)
    n = c["num_hidden_layers"]
    if "full_attention_interval" in c:  # configs/qwen3_next.py layers_block_type
        attention = [i for i in range(n) if (i + 1) % c["full_attention_interval"] == 0]
        return n, [i for i in range(n) if i not in attention], attention
    if "hybrid_override_pattern" in c:  # configs/nemotron_h.py: M = Mamba-2, * = attention, - = MLP
        p = c["hybrid_override_pattern"]
        return n, [i for i, t in enumerate(p) if t == "M"], [i for i, t in enumerate(p) if t == "*"]
    attention = c["full_attn_idxs"]  # configs/lfm2.py: every other layer is a short convolution
    return n, [i for i in range(n) if i not in attention], attention


# per-layer state bytes of one request at tp 1 (conv bf16, temporal fp32) and KV bytes per token and layer
# (bf16 K and V), written out from each config
PER_LAYER = {
    # conv (2 x 16 key heads x 128 + 32 x 128, 3), temporal (32, 128, 128); 2 KV heads x 256
    "Qwen__Qwen3-Next-80B-A3B-Instruct": (8192 * 3 * 2 + 32 * 128 * 128 * 4, 2 * 2 * 256 * 2),
    # conv (8192 + 2 x 8 groups x 128, 3), temporal (128 heads, 64, 128); 8 KV heads x 128
    "nvidia__Nemotron-H-8B-Base-8K": (10240 * 3 * 2 + 128 * 64 * 128 * 4, 2 * 8 * 128 * 2),
    # conv (1536, L_cache 3 - 1), no temporal state; 8 KV heads x 64
    "LiquidAI__LFM2-700M": (1536 * 2 * 2, 2 * 8 * 64 * 2),
}
WEIGHTS = {"Qwen__Qwen3-Next-80B-A3B-Instruct": "fp8"}


def _est(key: str, pp: int, **fields: object):
    spec: ModelSpec = spec_from_config(_config(key), name=key)
    run = make_run(engine="sglang", pp=pp, weights=WEIGHTS.get(key, "bf16"), batch=4, seq=2048, **fields)
    return estimate_inference(spec, run, capacity=80 * GiB)


def _comp(share, key: str) -> int:
    return next(c.bytes for c in share.components if c.key == key)


@pytest.mark.parametrize("pp", [2, 3, 4])
@pytest.mark.parametrize("key", sorted(PER_LAYER))
def test_pool_over_stages_is_sglangs_arithmetic(key: str, pp: int) -> None:
    _check(key, pp)


def test_a_stage_without_attention_layers_does_not_bound_the_pool() -> None:
    """Qwen3-Next at pp 16: 3 layers a stage, stage 0 (layers 0-2) has no attention layer; SGLang's
    DefaultPoolConfigurator gives it int64 max tokens (has_kv_on_another_pp_stage) and the PP all-reduce
    MIN takes the other stages' count."""
    n, _, attn_ids = _layers("Qwen__Qwen3-Next-80B-A3B-Instruct")
    assert not any(i in range(*_sglang_pp_indices(n, 0, 16)) for i in attn_ids)
    _check("Qwen__Qwen3-Next-80B-A3B-Instruct", 16)


def _check(key: str, pp: int) -> None:
    n, state_ids, attn_ids = _layers(key)
    ranges = [range(*_sglang_pp_indices(n, r, pp)) for r in range(pp)]
    state_layers = [sum(i in s for i in state_ids) for s in ranges]
    attn_layers = [sum(i in s for i in attn_ids) for s in ranges]
    per_layer, kv_layer = PER_LAYER[key]
    per_req = len(state_ids) * per_layer  # mamba_cache_per_req: every state layer of the model
    charged = int(per_req * (max(state_layers) / len(state_ids)))  # pp_layer_scale, truncated

    est = _est(key, pp)
    f = est.facts
    assert len(est.per_gpu) == pp  # tp 1: one GPU per stage
    free, frac = int(f["pre_load_free_bytes"]), float(f["mem_fraction_static"])  # type: ignore[call-overload, arg-type]
    rest = min(free * frac - _comp(g, "weights") for g in est.per_gpu)  # the world's least rest
    k = int((rest * 0.9 / 1.9 - charged) // charged)  # --mamba-full-memory-ratio 0.9
    tokens = min(int((rest - (k + 1) * charged) // (a * kv_layer)) for a in attn_layers if a)
    assert f["max_mamba_cache_size"] == k
    assert f["max_total_num_tokens"] == tokens
    assert f.get("state_bytes_charged_per_request", f["state_bytes_per_request"]) == charged
    for g, s_layers, a in zip(est.per_gpu, state_layers, attn_layers, strict=True):
        assert _comp(g, "mamba_state") == (k + 1) * s_layers * per_layer  # its own state layers
        assert _comp(g, "kv_cache") == (tokens + 1) * a * kv_layer  # its own attention layers, + 1 page
    layers = [
        next(c for c in g.components if c.key == "weights").explain.inputs["stage_layers"]
        for g in est.per_gpu
    ]
    assert layers == [len(r) for r in ranges]
    # resolve_max_num_reqs: min(estimated, tokens // 2, K // 3 slots per request with the radix cache)
    estimated = max(min(int(tokens / _config(key)["max_position_embeddings"] * 512), 4096), 2048)
    assert f["max_running_requests"] == min(estimated, tokens // 2, k // 3)


def test_uneven_stages_charge_the_fullest_share() -> None:
    """LFM2-700M at pp 2: 6 convolution layers on stage 0 (attention at 2, 5), 4 on stage 1 (8, 10, 12, 14);
    every rank is charged 6 / 10 of the model's state per slot, stage 1 allocates 4 / 10."""
    est = _est("LiquidAI__LFM2-700M", 2)
    k = int(est.facts["max_mamba_cache_size"])  # type: ignore[call-overload]
    per_layer = 1536 * 2 * 2
    assert est.facts["state_bytes_per_request"] == 6 * per_layer  # the fullest stage's slot
    assert [_comp(g, "mamba_state") for g in est.per_gpu] == [
        (k + 1) * 6 * per_layer,
        (k + 1) * 4 * per_layer,
    ]
    # a sequence on the stage shown (stage 1: the larger KV) costs its KV and that stage's state
    seqs, tokens = 4, make_run(engine="sglang", batch=4, seq=2048).tokens
    assert est.kv_cache_bytes == seqs * tokens * 4 * 2048 + seqs * 4 * per_layer


def test_pp_1_is_unchanged_and_pp_no_longer_refused() -> None:
    one = _est("LiquidAI__LFM2-700M", 1).facts
    assert (
        one["state_bytes_per_request"] == 10 * 1536 * 2 * 2 and "state_bytes_charged_per_request" not in one
    )
    two = _est("LiquidAI__LFM2-700M", 2).facts
    # the state charged per slot falls from 10 to 6 layers: more slots from the same share of the memory
    assert int(two["max_mamba_cache_size"]) > int(one["max_mamba_cache_size"])  # type: ignore[call-overload]


def test_sglang_stages_take_the_remainder_last() -> None:
    """gpumem's stage_layers(remainder="last") is SGLang's get_pp_indices for every split; the default
    (the first stages take the remainder) stays for the engines that split that way."""
    from types import SimpleNamespace

    from gpumem_gui.core.spec.parallel import stage_layers

    for n in range(1, 100):
        for pp in range(1, min(n, 8) + 1):
            spec = SimpleNamespace(num_layers=n)
            got = [stage_layers(spec, pp, r, "last") for r in range(pp)]  # type: ignore[arg-type]
            assert got == [range(*_sglang_pp_indices(n, r, pp)) for r in range(pp)]
    assert [len(stage_layers(SimpleNamespace(num_layers=10), 4, r)) for r in range(4)] == [3, 3, 2, 2]  # type: ignore[arg-type]


def test_vllm_stages_take_the_remainder_before_the_last() -> None:
    """stage_layers(remainder="before_last") is vLLM's get_pp_indices for every split (vllm/distributed/
    utils.py: partitions[-i] += 1 for i in 2 .. remainder + 1), e.g. 61 layers at pp 4: 15, 15, 16, 15."""
    from types import SimpleNamespace

    from gpumem_gui.core.spec.parallel import stage_layers

    def vllm_partitions(n: int, pp: int) -> list[int]:
        parts = [n // pp] * pp
        for i in range(2, n % pp + 2):
            parts[-i] += 1
        return parts

    for n in range(1, 100):
        for pp in range(1, min(n, 8) + 1):
            spec = SimpleNamespace(num_layers=n)
            got = [len(stage_layers(spec, pp, r, "before_last")) for r in range(pp)]  # type: ignore[arg-type]
            assert got == vllm_partitions(n, pp)
            assert stage_layers(spec, pp, pp - 1, "before_last").stop == n  # type: ignore[arg-type]
    assert [len(stage_layers(SimpleNamespace(num_layers=61), 4, r, "before_last")) for r in range(4)] == [  # type: ignore[arg-type]
        15,
        15,
        16,
        15,
    ]
