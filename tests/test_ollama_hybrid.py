"""Ollama v0.12.10 on hybrid models: llama.cpp's recurrent buffers (n_seq_max = num_parallel) for the bytes,
and ``fs/ggml/ggml.go GraphSize`` (ollama commit 7b91c9c, #12186) for the prediction Ollama places layers
by. Each expected figure below is the Go code's arithmetic written out by hand for the model's GGUF keys:

* a block with ``head_count > 0 && head_count_kv > 0``: ``ctx x num_parallel x (key_length + value_length)
  x head_count_kv x kv bytes``;
* any other block: ``((ssm.conv_kernel - 1) x (ssm.inner_size + 2 x ssm.group_count x ssm.state_size) +
  ssm.state_size x ssm.inner_size) x 4``, once (0 without ``ssm.*`` keys: LFM2);
* ``llm/memory.go estimateGPULayers``: no case for these architectures, so ``graph partial = full =
  HeadCountMax / max(HeadCountKVMin, 1) x kvTotal / 6``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats import weight_bytes
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run
from gpumem_gui.core.runtimes.ollama import ollama_plan
from gpumem_gui.core.runtimes.ollama_predict import MINIMUM_MEMORY, recurrent_block_bytes
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.state import has_state
from gpumem_gui.core.units import GiB
from tests.conftest import REPO

EXTRA = REPO / "tests" / "reference" / "extra" / "configs"
RESOURCES = REPO / "resources" / "configs"


def _spec(key: str) -> ModelSpec:
    return spec_from_config(json.loads((EXTRA / f"{key}.json").read_text()), name=key)


def _run(**kw: Any) -> Any:
    return make_run(engine="ollama", ollama_version="0.12.10", weights="gguf-Q4_K_M", **kw)


def _pred(spec: ModelSpec, **kw: Any) -> Any:
    run = _run(**kw)
    return ollama_plan(spec, run, weight_bytes(spec, run.weights), None)[1]


def _attn(ctx: int, head_dim: int, kv_heads: int, elem: int = 2) -> int:
    return ctx * (head_dim + head_dim) * kv_heads * elem


# (model, attention blocks, (KV heads, head dim), Go's per-block bytes of the other blocks)
CASES = {
    # Jamba: attn_layer_offset 4, period 8; ssm.conv_kernel 4, inner_size 8192, state_size 16, no group_count
    "ai21labs__Jamba-v0.1": ((4, 12, 20, 28), (8, 128), (3 * 8192 + 16 * 8192) * 4),
    # Nemotron-H 8B: 52 blocks, 4 attention ('*'); the 24 MLP blocks ('-') predict the Mamba state too:
    # conv 4, inner 128 x 64 = 8192, group_count 8, state 128
    "nvidia__Nemotron-H-8B-Base-8K": (
        (7, 18, 29, 40),
        (8, 128),
        (3 * (8192 + 2 * 8 * 128) + 128 * 8192) * 4,
    ),
    # Granite 4.0-H small: 40 blocks, attention at 5, 15, 25, 35; inner 8192, group_count 1, state 128
    "ibm-granite__granite-4.0-h-small": ((5, 15, 25, 35), (8, 128), (3 * (8192 + 2 * 128) + 128 * 8192) * 4),
    # LFM2: short-conv blocks have no ssm.* keys: 0
    "LiquidAI__LFM2-1.2B": ((2, 5, 8, 10, 12, 14), (8, 64), 0),
}


@pytest.mark.parametrize("key", sorted(CASES))
@pytest.mark.parametrize(("num_ctx", "parallel"), [(4096, 1), (8192, 3)])
def test_graphsize_of_hybrids_to_the_byte(key: str, num_ctx: int, parallel: int) -> None:
    spec = _spec(key)
    attn, (kv_heads, head_dim), other = CASES[key]
    p = _pred(spec, num_ctx=num_ctx, num_parallel=parallel)
    want = [other] * spec.num_layers
    for i in attn:
        want[i] = _attn(num_ctx * parallel, head_dim, kv_heads)
    assert list(p.kv) == want
    assert recurrent_block_bytes(spec) == other
    assert p.kv_recurrent == other * (spec.num_layers - len(attn))  # once, whatever num_parallel
    # HeadCountKVMin is 0 (a per-layer array with zeros): gqa = every query head
    assert p.graph_partial == p.graph_full == spec.num_attention_heads * sum(want) // 6


def test_falcon_h1_predicts_attention_only() -> None:
    """Falcon-H1's layers all have attention heads (the Mamba half of each layer is not predicted); its
    head_count_kv is one value, so gqa = 8 / 2."""
    spec = _spec("tiiuae__Falcon-H1-0.5B-Instruct")  # 36 layers, 2 KV heads of 64 (key_length 64)
    p = _pred(spec, num_ctx=8192)
    assert list(p.kv) == [_attn(8192, 64, 2)] * 36
    assert p.kv_recurrent == 0
    assert p.graph_partial == 8 // 2 * 36 * _attn(8192, 64, 2) // 6


def test_flash_attention_quantizes_only_the_attention_blocks() -> None:
    spec = _spec("ibm-granite__granite-4.0-h-small")
    f16, q8 = (_pred(spec, flash_attention="on", kv_dtype=t) for t in ("f16", "q8_0"))
    assert q8.kv[5] * 2 == f16.kv[5] and q8.kv[0] == f16.kv[0] == recurrent_block_bytes(spec)


def test_bytes_are_llamacpps_with_num_parallel_cells() -> None:
    """The estimate is llama.cpp's: KV cells for the attention layers only, r / s rows x num_parallel."""
    spec = _spec("ibm-granite__granite-4.0-h-small")
    est = estimate_inference(spec, _run(num_ctx=8192, num_parallel=2))
    f = est.facts
    assert est.kv_cache_bytes == 4 * _attn(2 * 8192, 128, 8)
    assert f["rs_cells"] == 2
    assert f["rs_r_bytes"] == 36 * 2 * 3 * (8192 + 2 * 128) * 4
    assert f["rs_s_bytes"] == 36 * 2 * 128 * 8192 * 4
    assert f["ollama_kv_recurrent"] == 36 * recurrent_block_bytes(spec)  # half of what is allocated
    rs = next(c for c in est.components if c.key == "recurrent_state")
    assert rs.bytes == f["rs_r_bytes"] + f["rs_s_bytes"]  # type: ignore[operator]
    note = next(w for w in est.warnings if "recurrent state" in w)
    assert "once, not x num_parallel 2" in note and "\n" not in note


def test_placement_counts_block_zeros_prediction_as_the_spare_layer() -> None:
    """memory.required.full of a full offload: 457 MiB + blk.0 (+ its kv[0], here a Mamba block's state)
    + every block with its prediction + the output layer + the full graph (estimateGPULayers)."""
    spec = _spec("nvidia__Nemotron-H-8B-Base-8K")
    run = _run(num_ctx=4096)
    wb = weight_bytes(spec, run.weights)
    _, p, plc = ollama_plan(spec, run, wb, 80 * GiB)
    assert plc.layers == spec.num_layers + 1
    spare = p.layer_bytes[0] + recurrent_block_bytes(spec)  # block 0 is 'M'
    assert p.kv[0] == recurrent_block_bytes(spec)
    want = MINIMUM_MEMORY + spare + sum(p.layer_bytes) + sum(p.kv) + p.output_bytes + p.graph_full
    assert plc.total == want


def test_hybrid_over_two_gpus_puts_each_layers_state_on_its_gpu() -> None:
    spec = _spec("ibm-granite__granite-4.0-h-small")
    est = estimate_inference(spec, _run(num_ctx=8192, pp=2, sched_spread=True), 80 * GiB)
    shares = [next(c.bytes for c in g.components if c.key == "recurrent_state") for g in est.per_gpu]
    assert sum(shares) == est.facts["rs_r_bytes"] + est.facts["rs_s_bytes"]  # type: ignore[operator]
    assert all(shares)


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("Qwen__Qwen3-Next-80B-A3B-Instruct", "v0.15.5"),
        ("Qwen__Qwen3.5-9B", "v0.17.1"),
        ("moonshotai__Kimi-Linear-48B-A3B-Instruct", "Kimi-Linear \\(KDA\\)"),
        ("MiniMaxAI__MiniMax-Text-01-hf", "lightning"),
    ],
)
def test_mixers_v0_12_10_does_not_run_refuse_in_one_line(key: str, words: str) -> None:
    spec = _spec(key)
    with pytest.raises(GpumemInputError, match=words) as e:
        estimate_inference(spec, _run())
    assert e.value.field == "engine" and "\n" not in str(e.value)


def _hybrid_configs() -> list[Path]:
    return sorted(p for d in (EXTRA, RESOURCES) for p in d.glob("*.json"))


def test_every_hybrid_the_readers_read_gives_an_estimate_or_one_line() -> None:
    seen = estimated = 0
    for path in _hybrid_configs():
        try:
            spec = spec_from_config(json.loads(path.read_text()), name=path.stem)
        except (GpumemInputError, ValueError, KeyError):
            continue
        if not has_state(spec):
            continue
        seen += 1
        try:
            est = estimate_inference(spec, _run(num_ctx=4096, num_parallel=2), 24 * GiB)
        except GpumemInputError as e:
            assert "\n" not in str(e), path.stem
            continue
        estimated += 1
        assert est.facts["ollama_kv_recurrent"] >= 0 and est.peak_bytes > 0, path.stem
    assert seen >= 20 and estimated >= 12


def test_published_granite4_micro_h_request_on_a_cpu_box() -> None:
    """ollama issue #12692 (v0.12.x, CPU only, 6 GiB): granite4:micro-h at num_ctx 65536 logs "model request
    too large for system" requested="5.5 GiB" (format.HumanBytes2). On a CPU box estimateGPULayers places the
    layers on the CPU 'GPU' (MinimumMemory 0) and adds the graph, 32 query heads / max(0, 1) x kvTotal / 6:
    blk.0 + kv[0] + every block + kv + output + graph. The config is rebuilt: H-Tiny's with the dense sizes
    recalled from Granite 4.0-H Micro's model card, not checked against its published config.json (none is
    stored); it gives 3.19 B parameters and 1.94 GB at Q4_K_M, where Ollama's library lists 1.9 GB."""
    cfg = json.loads((EXTRA / "ibm-granite__granite-4.0-h-tiny.json").read_text())
    cfg |= {"hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8, "mamba_n_heads": 64}
    cfg |= {"num_local_experts": 0, "num_experts_per_tok": 0}
    cfg |= {"shared_intermediate_size": 8192, "intermediate_size": 8192}
    spec = spec_from_config(cfg, name="granite-4.0-h-micro")
    p = _pred(spec, num_ctx=65536)
    assert p.graph_full == 32 * sum(p.kv) // 6
    requested = p.layer_bytes[0] + p.kv[0] + sum(p.layer_bytes) + sum(p.kv) + p.output_bytes + p.graph_full
    assert 5.45 * GiB <= requested < 5.55 * GiB  # 5.47 GiB
