"""Llama 4's chunked-local attention layers on the serving engines (issue 28): each engine keeps what its
source keeps of a chunked layer, never every token where it keeps one chunk."""

from __future__ import annotations

import pytest

from gpumem_gui.core import estimate_inference, load_config_file, make_run, model_kinds
from gpumem_gui.core.runtimes import vllm_kv as vk
from gpumem_gui.core.runtimes.llamacpp import kv_buffers
from gpumem_gui.core.runtimes.sglang_swa import stage_cells, swa_layers, swa_window
from tests.conftest import REPO

SCOUT = REPO / "resources" / "configs" / "meta-llama__Llama-4-Scout-17B-16E-Instruct.json"
MIB = 2**20


@pytest.fixture(scope="module")
def scout():  # type: ignore[no-untyped-def]
    return load_config_file(SCOUT)


def test_the_kinds_bound_chunked_layers_by_their_chunk(scout) -> None:  # type: ignore[no-untyped-def]
    """Llama4TextConfig: every fourth layer full (NoPE), the others chunked by attention_chunk_size 8192."""
    bounds = model_kinds(scout).bounds()
    assert sorted(i for i, b in bounds.items() if b is None) == list(range(3, 48, 4))
    assert {b for b in bounds.values() if b is not None} == {("chunked", 8192)}
    assert set(model_kinds(scout).bounds(chunked=False).values()) == {None}


def test_vllm_pages_chunked_layers_in_their_own_groups(scout) -> None:  # type: ignore[no-untyped-def]
    """vLLM's hybrid manager: 12 full + 36 chunked layers make 4 groups of 12 (1 full, 3 chunked); a
    request of L tokens takes ceil(L/16) + 3 x ceil(min(8192 + 8192, L)/16) blocks
    (ChunkedLocalAttentionSpec.max_memory_usage_bytes: no -1, no +1, unlike a sliding window). With the
    published run's num_blocks (979,916 at TP 8, bf16: 89.71 GiB / (12 x 8,192 B)) "GPU KV cache size"
    is 3,919,664 tokens and the concurrency 1.86x at 8M, 2.96x at 5M (fuhengwu2021/coderepo extra/README.md,
    vLLM 0.12.0 with VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1)."""
    page = 16 * 1 * 128 * 2 * 2  # one KV head per rank, K and V, bf16
    lay = vk.layout(scout, 1, page)
    assert (lay.groups, lay.group_size, lay.block_bytes) == (4, 12, 12 * page)
    assert sorted(w or ("full", 0) for w in lay.windows) == [("chunked", 8192)] * 3 + [("full", 0)]
    blocks = 979_916
    assert lay.reported_tokens(blocks, 16) == 3_919_664
    assert lay.blocks_per_request(8_388_608, 16, 8192) == 524_288 + 3 * 1024
    assert round(blocks / lay.blocks_per_request(8_388_608, 16, 8192), 2) == 1.86
    assert round(blocks / lay.blocks_per_request(5_242_880, 16, 8192), 2) == 2.96
    # held: a short request never more than its own pages in a chunked group
    assert lay.blocks_per_request(100, 16, 8192, held=True) == 4 * 7


@pytest.mark.parametrize("hybrid", [True, False])
def test_vllm_estimate_with_and_without_the_hybrid_manager(scout, hybrid: bool) -> None:  # type: ignore[no-untyped-def]
    """The same pool, the same token count; the manager off pages the chunked layers as full attention
    (unify_hybrid_kv_cache_specs), a quarter of the concurrency."""
    run = make_run(engine="vllm", tp=8, seq=5_242_880, max_model_len=5_242_880, hybrid_kv_cache=hybrid)
    est = estimate_inference(scout, run, capacity=143_771 * MIB)
    f = est.facts
    per_request = 327_680 + 3 * 1024 if hybrid else 327_680
    blocks_per_token = 4 if hybrid else 1  # a hybrid block is one page of 12 layers, else of 48
    assert f["kv_tokens"] == f["gpu_blocks"] // blocks_per_token * 16
    want = round(f["gpu_blocks"] / per_request if hybrid else f["kv_tokens"] / 5_242_880, 2)
    assert f["max_concurrency"] == want
    assert ("kv_chunked_groups" in f) is hybrid


def test_sglang_keeps_chunked_layers_in_its_swa_pool(scout) -> None:  # type: ignore[no-untyped-def]
    """SGLang's hybrid-SWA allowlist has Llama4ForConditionalGeneration: the chunked layers
    (get_hybrid_layer_ids: (i + 1) % 4 != 0) in the SWA pool, the window the chunk; at TP 8 in bf16 a
    token's cell is 12 x 512 + 0.8 x 36 x 512 = 20,889.6 B (was 48 x 512)."""
    assert scout.traits.sglang_hybrid_swa
    assert swa_layers(scout) == frozenset(i for i in range(48) if (i + 1) % 4)
    assert swa_window(scout) == 8192
    cells = stage_cells(scout, 2, 8, range(48))
    assert (cells.full, cells.swa, cells.full_layers, cells.swa_layers) == (6144, 18432, 12, 36)
    assert cells.budget(0.8) == pytest.approx(20_889.6)


def test_llamacpp_gives_chunked_layers_swa_cells_and_ollama_does_not(scout) -> None:  # type: ignore[no-untyped-def]
    """llama.cpp: LLM_ARCH_LLAMA4 is LLAMA_SWA_TYPE_CHUNKED with n_swa 8192 and pattern 4: at -c 131072,
    -np 1, n_ubatch 512 in f16 the non-SWA cache is 131,072 cells x 12 layers (6,144 MiB), the SWA cache
    pad(8192 + 512, 256) = 8,704 cells x 36 layers (1,224 MiB). Ollama v0.12.10 runs Llama 4 on its own
    engine, whose chunked cache is the causal cache's size: 48 layers x 131,072 cells (24,576 MiB)."""
    run = make_run(engine="llama.cpp", weights="gguf-q4_k_m", seq=131_071, new_tokens=1, kv_dtype="f16")
    row = 8 * 128 * 2 * 2
    assert kv_buffers(scout, run, 48) == ((131_072 * 12 + 8704 * 36) * row, 0)
    assert kv_buffers(scout, run, 48)[0] == (6144 + 1224) * MIB
    assert kv_buffers(scout, run, 48, chunked=False)[0] == 24_576 * MIB
    ollama = make_run(
        engine="ollama", ollama_version="0.12.10", weights="gguf-q4_k_m", num_ctx=131_072, kv_dtype="f16"
    )
    est = estimate_inference(scout, ollama)
    assert next(c.bytes for c in est.components if c.key == "kv_cache") == 24_576 * MIB
