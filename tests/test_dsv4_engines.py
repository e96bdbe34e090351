"""DeepSeek-V4 on the serving engines (issues 28 / 29): vLLM's packed compressed cache at the byte
(``core/runtimes/vllm_dsv4.py``), against vLLM's own arithmetic on worked examples and a published start-up
error; the engines that do not model it yet refuse it in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpumem_gui.core import estimate_inference, load_model
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.catalog import find_gpu, find_model
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.runtimes import vllm_dsv4 as vd
from gpumem_gui.core.runtimes import vllm_kv as vk
from gpumem_gui.core.runtimes import vllm_layout as vl
from gpumem_gui.core.runtimes.base import component
from gpumem_gui.core.runtimes.inference import RUNTIMES, make_run
from gpumem_gui.core.runtimes.sglang_configurator import DSV4, TOKEN_TO_KV, configurator
from gpumem_gui.core.spec.kinds import CompressedAttention
from gpumem_gui.core.spec.kinds_of import model_kinds
from tests.conftest import REPO

EXTRA = REPO / "tests" / "reference" / "extra"
FLASH = json.loads((EXTRA / "compressed_cache.json").read_text())["configs"][
    "deepseek-ai__DeepSeek-V4-Flash-Base"
]
GIB = 1 << 30


def _flash():
    spec = spec_from_config(FLASH, name="flash")
    assert spec.deepseek_v4 is not None
    return spec


def _layout(max_len: int, batched: int, fp4: bool = False, mtp: int = 0) -> vd.Dsv4Layout:
    at = _flash().deepseek_v4.attention  # type: ignore[union-attr]
    return vd.Dsv4Layout(
        buckets=vd.buckets(at, 256, fp4_indexer=fp4, mtp_layers=mtp),
        block=256,
        max_len=max_len,
        batched=batched,
        attention=at,
    )


def test_pages_and_groups_at_the_byte() -> None:
    """Each spec's page as vLLM computes it (584-byte fp8_ds_mla entries, pages padded to 576), the buckets'
    layer tuples [21, 43 (+1 MTP), 21, 20] padded to d = 22 (the sliding bucket split in two: five groups),
    the block stride (the MLA group: 21 x 37,440 + 21 x 8,640 + 20 x 1,728 with the fp8 indexer; 4,608 with
    the fp4 one) and the start-up check's block price (22 tuples of the MLA bucket)."""
    fp8, fp4 = _layout(1, 1).buckets, _layout(1, 1, fp4=True, mtp=1).buckets
    assert sorted(set(fp8[0].pages)) == [1728, 8640, 37440]  # C128 entries, indexer keys, C4 entries
    assert sorted(set(fp4[0].pages)) == [1728, 4608, 37440]
    assert set(fp8[1].pages) == {37440} and len(fp8[1].pages) == 43 and len(fp4[1].pages) == 44
    assert sorted(set(fp8[2].pages)) == [8640, 32832] and set(fp8[3].pages) == {32832}
    assert [b.tuples for b in fp8] == [21, 43, 21, 20] and [(b.block, b.window) for b in fp8[1:]] == [
        (64, 128),
        (4, 8),
        (8, 128),
    ]
    lay = _layout(1, 1)
    assert (lay.tuples, lay.groups, lay.block_bytes, lay.guard_block_bytes) == (22, 5, 1_002_240, 22 * 47_808)
    lay4 = _layout(1, 1, fp4=True, mtp=1)
    assert (lay4.tuples, lay4.groups, lay4.block_bytes, lay4.guard_block_bytes) == (22, 5, 917_568, 963_072)
    assert vd.approximate_gcd([21, 43, 21, 20], 21) == 22  # d = 21 pads 21 layers, 22 pads 5
    assert lay.per_token_bytes == round((21 * 37_440 + 21 * 8_640 + 20 * 1_728) / 256)  # 3,915 B


# A vLLM v0.27.1 source walk-through recomputing DeepSeek-V4-Flash's pool from the source (fp4 indexer, the
# MTP layer's window, async scheduling: two batches in flight): "第 36 章 部署实战：D4-Flash 进 96GB",
# traces m10, m11, m13 (pool, max_model_len, max_num_batched_tokens) -> (blocks per request, concurrency,
# GPU KV cache size in tokens; None where vLLM's check refuses to start). Arithmetic from the source,
# not a GPU log.
WALKTHROUGH = [
    ((5 * GIB, 131_072, 8192), (7194, None, None)),
    ((5 * GIB, 131_072, 2048), (2202, 2.6571, 348_275)),
    ((8 * GIB, 1_048_576, 8192), (10_778, None, None)),
    ((8 * GIB, 1_048_576, 2048), (5786, 1.6179, 1_696_460)),
    ((8 * GIB, 131_072, 8192), (7194, 1.3012, 170_553)),
    ((5 * GIB, 13_572, 8192), (5574, 1.0497, 14_246)),
]


@pytest.mark.parametrize(("point", "want"), WALKTHROUGH)
def test_pool_as_vllm_sizes_it(point: tuple[int, int, int], want: tuple) -> None:
    pool, max_len, batched = point
    per_request, concurrency, tokens = want
    lay = _layout(max_len, batched, fp4=True, mtp=1)
    blocks = lay.blocks(pool)
    assert blocks == {5 * GIB: 5851, 8 * GIB: 9361}[pool]
    assert lay.blocks_per_request(max_len, 256, batched) == per_request
    refusal = lay.start_refusal(pool, per_request, max_len)
    if concurrency is None:
        assert refusal is not None and "\n" not in refusal
        return
    assert refusal is None
    assert round(blocks / per_request, 4) == concurrency
    assert lay.reported_tokens(blocks, 256) == tokens


def test_published_start_up_error() -> None:
    """vllm-project/vllm issue #44376 (simonwalo, 2026-06-03), DeepSeek-V4-Flash on 2 x GH200, TP 2,
    max_model_len 30,000, --block-size 256, --kv-cache-dtype fp8 (the fp8 indexer cache, no MTP), offline
    LLM (16,384 tokens in flight): "ValueError: To serve at least one request with the model's max seq len
    (30000), (6.66 GiB KV cache is needed, which is larger than the available KV cache memory (5.44 GiB).
    Based on the available memory, the estimated maximum model length is 13528." The check's price of one
    request, and the length whose price sits at the published 5.44 GiB."""
    lay = _layout(30_000, 16_384 // vd.IN_FLIGHT_BATCHES)
    need = lay.request_bytes(lay.blocks_per_request(30_000, 256, lay.batched))
    assert f"{need / GIB:.2f}" == "6.66"
    at = [lay.request_bytes(lay.blocks_per_request(n, 256, lay.batched)) for n in (13_528, 13_529)]
    assert f"{at[0] / GIB:.2f}" == "5.44" and at[1] > at[0]  # 13,529 costs more than 13,528
    assert lay.start_refusal(int(5.44 * GIB), lay.blocks_per_request(30_000, 256, lay.batched), 30_000)


def test_estimate_on_eight_h200() -> None:
    """The question users ask: DeepSeek-V4-Flash on 8 x H200 in vLLM is an estimate (the fp8 cache, the
    default block size 256), its KV tokens and concurrency from the pool as above, the prefill workspace in
    the profiled peak; auto KV dtype is sized as fp8 with a warning (vLLM asserts fp8)."""
    entry = find_model("deepseek-ai/DeepSeek-V4-Flash-Base")
    assert entry is not None
    gpu = find_gpu("H200").gpu_memory
    est = estimate_inference(entry.spec, make_run(engine="vllm", tp=8, seq=2048, max_model_len=131_072), gpu)
    f = est.facts
    lay = _layout(131_072, int(f["max_num_batched_tokens"]))  # type: ignore[call-overload]
    assert f["block_size"] == 256 and f["gpu_blocks"] == int(f["kv_pool_bytes"]) // 1_002_240  # type: ignore[call-overload]
    assert f["kv_blocks_per_request"] == lay.blocks_per_request(131_072, 256, lay.batched)
    assert f["kv_tokens"] == lay.reported_tokens(int(f["gpu_blocks"]), 256)  # type: ignore[call-overload]
    act = next(c for c in est.components if c.key == "activations")
    rows = 131_072 // 4 + 128 + lay.batched
    assert act.explain.inputs["prefill_workspace_bytes"] == 4 * rows * 512 * 2
    assert any("--kv-cache-dtype fp8" in w for w in est.warnings)


@pytest.mark.parametrize(
    ("change", "field"),
    [({"kv_dtype": "bf16"}, "kv_dtype"), ({"pp": 2}, "pp"), ({"block_size": 64}, "block_size")],
)
def test_vllm_refuses_what_it_cannot_run(change: dict, field: str) -> None:
    spec = _flash()
    with pytest.raises(GpumemInputError) as e:
        estimate_inference(spec, make_run(engine="vllm", seq=64, **change))
    assert e.value.field == field and "\n" not in str(e.value)


def test_other_engines_refuse_in_one_line() -> None:
    """Ollama v0.12.10 does not model the compressed cache: one line, saying what the engine itself does with
    the model; vLLM, SGLang (tests/test_sglang_dsv4.py), llama.cpp (tests/test_llamacpp_dsv4.py), Ollama's
    default release (0.30+: llama-server) and transformers estimate it."""
    spec = load_model(str(EXTRA / "configs" / "synthetic__deepseek_v4-tiny.json")).spec
    assert spec is not None
    kinds = model_kinds(spec).of(CompressedAttention)
    for engine, rt in RUNTIMES.items():
        if engine in ("transformers", "vllm", "sglang", "llama.cpp"):
            assert all(rt.supports(k) for k in kinds)
            continue
        run = make_run(engine=engine, seq=64)
        if rt.for_run(run) is not rt:  # Ollama 0.30+ (the default): llama.cpp's profile
            assert all(rt.for_run(run).supports(k) for k in kinds)
            assert estimate_inference(spec, run).peak_bytes > 0
            run = run.model_copy(update={"ollama_version": "0.12.10"})  # RUNTIMES holds v0.12.10's
        with pytest.raises(GpumemInputError) as e:
            estimate_inference(spec, run)
        assert "\n" not in str(e.value) and engine in str(e.value) and "DeepSeek-V4" in str(e.value)


def test_cli_answers_the_h200_question() -> None:
    args = [
        "estimate",
        "deepseek-ai/DeepSeek-V4-Flash-Base",
        "--engine",
        "vllm",
        "--tp",
        "8",
        "--gpu",
        "H200:8",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "gpumem_gui", *args, "--kv-dtype", "fp8", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["facts"]["kv_tokens"] > 0 and doc["facts"]["block_size"] == 256


def test_the_compressed_capability_picks_each_engines_layout() -> None:
    """``ModelKinds.compressed``, set from the reader's DeepSeek-V4 data, is what the engines take their
    compressed-cache paths on (runtimes/vllm_layout.py, sglang_configurator.py): vLLM's packed groups at its
    own block size with the prefill workspace in the profiled peak, SGLang's DSV4 configurator; a model
    without it (Gemma 3: sliding and full layers) keeps the hybrid allocator's groups and the token-to-KV
    pool."""
    dsv4 = _flash()
    gemma = load_model(str(EXTRA / "configs" / "google__gemma-3-1b-it.json")).spec
    assert gemma is not None and dsv4.deepseek_v4 is not None
    assert model_kinds(dsv4).compressed == dsv4.deepseek_v4.attention
    assert model_kinds(gemma).compressed is None
    run = make_run(engine="vllm", seq=64, kv_dtype="fp8")
    peak = component("activation", "activations", 1_000, "measured", "a test")
    blocked, _ = vl.block_run(dsv4, run, 1)
    lay = vl.layout(dsv4, blocked, 1, 0, 4096, 8192)
    assert isinstance(lay, vd.Dsv4Layout) and lay.block == vd.PREFERRED_BLOCK != run.block_size
    assert lay.profiled(peak).bytes > peak.bytes
    blocked, _ = vl.block_run(gemma, run, 1)
    lay = vl.layout(gemma, blocked, 1, 0, 4096, 8192)
    assert isinstance(lay, vk.KvLayout) and lay.windowed and blocked.block_size == run.block_size
    assert lay.profiled(peak) is peak
    assert configurator(dsv4) is DSV4 and configurator(gemma) is TOKEN_TO_KV
