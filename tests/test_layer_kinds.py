"""Layer kinds as types (issue 27, first steps): what ``model_kinds`` makes of real configs, and that the
per-layer views built on it (spec/kv.py, spec/state.py, the replay's cache) cover every layer once."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpumem_gui.core import load_config_file
from gpumem_gui.core.spec.kinds import (
    Attention,
    Bidirectional,
    CrossAttention,
    LatentAttention,
    MLPOnly,
    RecurrentState,
    SharedKV,
)
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.kv import kv_bytes_per_token_per_layer, tokens_kept_transformers
from gpumem_gui.core.spec.state import state_bytes_per_sequence_per_layer
from tests.conftest import REPO

RES = REPO / "resources" / "configs"
EXTRA = REPO / "tests" / "reference" / "extra" / "configs"


def _kinds(path: Path):
    spec = load_config_file(path)
    return spec, model_kinds(spec)


def _summary(kinds) -> list[tuple[str, int]]:
    return [(k.kind, len(k.layers)) for k in kinds.layers]


def test_dense_decoder_is_one_full_attention_kind() -> None:
    _, k = _kinds(RES / "meta-llama__Llama-3.1-8B.json")
    assert k.model == "decoder"
    (a,) = k.layers
    assert isinstance(a, Attention) and a.kind == "full_attention"
    assert (a.layers, a.kv_heads, a.head_dim, a.window) == (tuple(range(32)), 8, 128, None)
    assert a.kv_elems() == (1024, 1024) and a.kv_elems(tp=16) == (128, 128)  # at least one KV head per rank


def test_sliding_and_chunked_kinds_own_their_window() -> None:
    _, g = _kinds(RES / "google__gemma-3-27b-it.json")
    sliding = [x for x in g.attention if x.kind == "sliding_attention"]
    full = [x for x in g.attention if x.kind == "full_attention"]
    assert len(sliding) == 1 and len(full) == 1
    assert sliding[0].window == 1024 and sliding[0].kept(5000) == 1023 and full[0].kept(5000) == 5000
    assert len(sliding[0].layers) + len(full[0].layers) == 62
    _, scout = _kinds(RES / "meta-llama__Llama-4-Scout-17B-16E-Instruct.json")
    chunked = [x for x in scout.attention if x.kind == "chunked_attention"]
    assert chunked and chunked[0].window == 8192 and len(chunked[0].layers) == 36


def test_mla_with_indexer_and_shared_layers() -> None:
    _, v32 = _kinds(EXTRA / "deepseek-ai__DeepSeek-V3.2-Exp.json")
    (mla,) = v32.attention
    assert isinstance(mla, LatentAttention) and len(mla.layers) == 61
    assert (mla.latent_elems, mla.indexer_dim) == (576, 128)
    assert mla.kv_elems("latent") == (
        512 + 128,
        64,
    )  # transformers' DynamicIndexedLayer: latent + indexer key
    assert mla.llamacpp_elems(full=False) == (576, 512)
    _, glm = _kinds(EXTRA / "synthetic__glm_moe_dsa-tiny.json")
    dims = sorted({x.indexer_dim for x in glm.of(LatentAttention)})
    assert dims[0] == 0 and dims[-1] > 0  # layers sharing another's top-k cache no indexer key
    assert glm.latent is not None and glm.latent.indexer_dim == dims[-1]


def test_hybrids_are_typed_per_mixer() -> None:
    _, nxt = _kinds(RES / "Qwen__Qwen3-Next-80B-A3B-Instruct.json")
    assert nxt.model == "hybrid"
    assert _summary(nxt)[:2] == [("recurrent", 36), ("full_attention", 12)]
    (st,) = nxt.state
    assert st.mixer == "gated_deltanet" and st.recurrent_fp32
    _, fh1 = _kinds(RES / "tiiuae__Falcon-H1-0.5B-Instruct.json")
    (att,), (mamba,) = fh1.attention, fh1.state
    assert mamba.mixer == "mamba2" and att.layers == mamba.layers  # attention and Mamba-2 side by side
    _, nem = _kinds(RES / "nvidia__Nemotron-H-8B-Base-8K.json")
    assert {type(x) for x in nem.layers} == {Attention, RecurrentState, MLPOnly}
    _, lfm = _kinds(RES / "LiquidAI__LFM2-1.2B.json")
    assert lfm.state[0].mixer == "short_conv" and lfm.state[0].recurrent_elems == 0


def test_cross_attention_shared_kv_and_encoders() -> None:
    _, ml = _kinds(RES / "meta-llama__Llama-3.2-11B-Vision.json")
    (cross,) = ml.of(CrossAttention)
    assert cross.layers == (3, 8, 13, 18, 23, 28, 33, 38)
    assert not set(cross.layers) & {i for a in ml.attention for i in a.layers}
    _, g3n = _kinds(RES / "google__gemma-3n-E2B-it.json")
    (shared,) = g3n.of(SharedKV)
    assert shared.layers and not set(shared.layers) & {i for a in g3n.attention for i in a.layers}
    _, bert = _kinds(RES / "google-bert__bert-base-uncased.json")
    assert bert.model == "encoder" and _summary(bert) == [("bidirectional", 12)] and not bert.attention
    _, t5 = _kinds(REPO / "tests" / "reference" / "seq2seq" / "configs" / "google-t5__t5-small.json")
    assert t5.model == "encoder-decoder"
    assert isinstance(t5.layers[0], Bidirectional) and t5.layers[0].layers == tuple(range(6))
    assert t5.attention[0].layers == tuple(range(6, 12))


CONFIGS = sorted(
    {
        *glob.glob(str(REPO / "tests/reference/**/configs/*.json"), recursive=True),
        *map(str, RES.glob("*.json")),
    }
)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: Path(p).stem)
def test_every_layer_is_cached_by_at_most_one_kind(path: str) -> None:
    """Over every reference and catalog config: no layer is in two per-token-cache kinds or two state kinds;
    the per-layer views equal the kinds' own answers."""
    try:
        spec = load_config_file(Path(path))
    except Exception:  # configs kept to test refusals
        pytest.skip("not read")
    k = model_kinds(spec)
    for group in (k.attention, k.state):
        seen = [i for x in group for i in x.layers]
        assert len(seen) == len(set(seen))
        assert all(0 <= i < spec.num_layers for i in seen)
    per_token = kv_bytes_per_token_per_layer(spec)
    kept = tokens_kept_transformers(spec, 10_000)
    states = state_bytes_per_sequence_per_layer(spec)
    for x in k.attention:
        elems = x.kv_elems() if isinstance(x, LatentAttention) else x.kv_elems(transformers=True)
        assert all(per_token[i] == 2 * sum(elems) for i in x.layers)
        assert all(kept[i] == (x.kept(10_000) if isinstance(x, Attention) else 10_000) for i in x.layers)
    cached = {i for x in k.attention for i in x.layers}
    assert all(per_token[i] == 0 and kept[i] == 0 for i in range(spec.num_layers) if i not in cached)
    assert sum(states) == sum(x.state_bytes(2) * len(x.layers) for x in k.state)
    assert (k.model == "hybrid") == bool(k.state)


def test_kinds_are_frozen_and_validated() -> None:
    a = Attention(kind="full_attention", layers=(0,), query_heads=8, kv_heads=8, head_dim=64)
    with pytest.raises(ValidationError):
        Attention.model_validate({**a.model_dump(), "x": 1})  # extra="forbid"
    with pytest.raises(ValidationError):
        Attention(kind="full_attention", layers=(0,), query_heads=8, kv_heads=0, head_dim=64)
    with pytest.raises(ValidationError):
        a.window = 4  # type: ignore[misc]


# DeepSeek-V3.2 (61 layers, every one with an indexer of 128 dims) on the serving engines, as their source
# allocates (vLLM deepseek_v2.py Indexer / DeepseekV32IndexerCache, MLAAttentionSpec.real_page_size_bytes;
# SGLang NSATokenToKVPool, ModelRunnerKVCacheMixin.get_cell_size_per_token)
V32 = EXTRA / "deepseek-ai__DeepSeek-V3.2-Exp.json"


@pytest.mark.parametrize(
    ("engine", "kv_dtype", "per_token"),
    [
        (
            "vllm",
            "auto",
            61 * (576 * 2 + 132),
        ),  # bf16 latent + the uint8 indexer cache (128 fp8 + 1 fp32 scale)
        ("vllm", "fp8", 61 * (656 + 132)),  # fp8_ds_mla: 512 fp8, 4 fp32 scales, 64 bf16 rope
        ("sglang", "auto", 61 * (576 * 2 + 132)),
        ("sglang", "fp8_e4m3", 61 * (576 + 132)),  # what SGLang counts (its pool then allocates 656 + 132)
    ],
)
def test_dsa_indexer_cache_on_serving_engines(engine: str, kv_dtype: str, per_token: int) -> None:
    from gpumem_gui.core import estimate_inference, make_run

    spec = load_config_file(V32)
    est = estimate_inference(spec, make_run(engine=engine, kv_dtype=kv_dtype, seq=4096, tp=8))
    assert est.facts["kv_bytes_per_token"] == per_token


def test_dsa_fp8_pool_matches_a_published_sglang_log() -> None:
    """SGLang PR #11309 (8 x B200, DeepSeek-V3.2-Exp, fp8 cache): "KV Cache is allocated. #tokens: 975424, KV
    size: 43.67 GB" (GB: 2^30 bytes), the indexer included; 54.52 GB for 1,462,784 tokens before the PR,
    which left the indexer out."""
    (mla,) = model_kinds(load_config_file(V32)).attention
    assert isinstance(mla, LatentAttention)
    page = 64  # NSATokenToKVPool asserts page_size == 64 on CUDA; each buffer has size + page_size rows
    main, ix = mla.fp8_ds_mla_bytes, mla.indexer_cache_bytes
    with_indexer = 61 * ((975_424 + page) * main + (975_424 + page + 1) // page * page * ix)
    assert round(with_indexer / 2**30, 2) == 43.67
    assert round(61 * (1_462_784 + page) * main / 2**30, 2) == 54.52


def test_engines_answer_by_capability() -> None:
    """Which engine models which kind is a capability of its runtime module (Runtime.supports / serves)."""
    from gpumem_gui.core.runtimes.inference import RUNTIMES

    def able(path: Path) -> list[str]:
        k = model_kinds(load_config_file(path))
        return [
            name
            for name, rt in RUNTIMES.items()
            if rt.serves(k.model) and all(rt.supports(kind) for kind in k.layers)
        ]

    assert able(RES / "Qwen__Qwen3-Next-80B-A3B-Instruct.json") == [
        "transformers",
        "vllm",
        "llama.cpp",
        "sglang",
    ]
    assert able(RES / "moonshotai__Kimi-Linear-48B-A3B-Instruct.json") == [
        "transformers",
        "vllm",
        "llama.cpp",
        "sglang",
    ]
    assert able(RES / "MiniMaxAI__MiniMax-Text-01-hf.json") == ["transformers", "vllm", "llama.cpp"]
    assert able(RES / "google-bert__bert-base-uncased.json") == ["transformers"]
    assert able(RES / "meta-llama__Llama-3.2-11B-Vision.json") == ["transformers", "sglang"]
    assert len(able(RES / "meta-llama__Llama-3.1-8B.json")) == len(RUNTIMES)


def test_no_check_tests_an_engine_name() -> None:
    """The runtimes and the spec ask capabilities; an engine's name is only its own module's label."""
    import re

    # (a version field of one engine's own run options, vllm_engine == "v0", is not an engine's name)
    pattern = re.compile(r"""((?<!\w)engine|\.name)\s*(==|!=)\s*["']|(?<!\w)engine\s+(not\s+)?in\s+\(""")
    hits = [
        f"{p.relative_to(REPO)}:{n}"
        for folder in ("gpumem_gui/core/runtimes", "gpumem_gui/core/spec")
        for p in sorted((REPO / folder).glob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def test_every_kind_the_readers_make_has_a_registered_replay() -> None:
    """The forward finds each layer's block and token mixer in the replay's registry (replay/registry.py),
    filled by the variant modules replay/variants.py imports: none is missing for any config we read."""
    import typing

    from gpumem_gui.core.replay import variants  # noqa: F401
    from gpumem_gui.core.replay.registry import BLOCKS, MIXERS
    from gpumem_gui.core.spec.arch_traits import ArchTraits

    blocks = typing.get_args(ArchTraits.model_fields["block"].annotation)
    assert set(blocks) - {"llama"} == set(BLOCKS)
    assert "attention" in MIXERS
    for path in CONFIGS:
        try:
            spec = load_config_file(Path(path))
        except Exception:
            continue
        if spec.traits.block != "llama" or spec.encoder is not None or spec.seq2seq is not None:
            continue  # the architecture's own block runs its mixers
        for kind in model_kinds(spec).state:
            assert kind.mixer in MIXERS, (path, kind.mixer)


def test_llamacpp_gives_kv_shared_layers_no_cache() -> None:
    """llama.cpp allocates K/V only for Gemma 3n's first 20 layers (llama_hparams::has_kv with
    n_layer_kv_from_start = 20 for LLM_ARCH_GEMMA3N; the shared layers reuse layer 18 or 19). Published
    (llama.cpp issue #14604, gemma-3n-E4B, -c 32768): "GEMMA3N: reuse layers [20, 34]" and the non-SWA cache
    "size =  256,00 MiB ( 32768 cells,   4 lay[ers]"; its 16 sliding layers hold
    pad(n_swa + n_ubatch, 256) = 1024 cells (llama_kv_cache_iswa)."""
    from gpumem_gui.core import make_run
    from gpumem_gui.core.runtimes.llamacpp import kv_buffers

    spec = load_config_file(RES / "google__gemma-3n-E4B-it.json")
    run = make_run(engine="llama.cpp", weights="gguf-q4_k_m", seq=32768 - 512, new_tokens=512)
    gpu, host = kv_buffers(spec, run, spec.num_layers)
    row = 2 * 2 * 256 * 2  # K and V, 2 KV heads x 256, f16
    assert (gpu, host) == (256 * 2**20 + 16 * 1024 * row, 0)


@pytest.mark.parametrize("hybrid", [True, False])
def test_vllm_gives_kv_shared_layers_no_cache(hybrid: bool) -> None:
    """vLLM's Gemma 3n (``models/gemma3n.py`` ``Gemma3nAttention``) sets ``kv_sharing_target_layer_name`` on
    the last ``num_kv_shared_layers`` layers, and ``gpu_model_runner.get_kv_cache_spec`` gives such a layer no
    cache of its own: E4B's 35 layers hold 20 layers' KV (16 sliding + 4 full), with the hybrid manager on
    or off; one token costs 20 x 2 x 2 KV heads x 256 x 2 bytes."""
    from gpumem_gui.core import estimate_inference, make_run

    spec = load_config_file(RES / "google__gemma-3n-E4B-it.json")
    kinds = model_kinds(spec)
    bounds = kinds.bounds()
    assert len(bounds) == 20 and sum(b is not None for b in bounds.values()) == 16
    assert len(kinds.layers_of("sliding_attention")) == 28  # the layer types: shared ones included
    run = make_run(engine="vllm", seq=4096, new_tokens=0, hybrid_kv_cache=hybrid)
    est = estimate_inference(spec, run, capacity=80 * 2**30)
    assert est.facts["kv_bytes_per_token"] == 20 * 2 * 2 * 256 * 2
    if hybrid:  # 4 sliding groups and 1 full group of 4 layers: a block is one 16-token page of 4 layers
        assert est.facts["kv_pool_bytes"] // est.facts["gpu_blocks"] == 4 * 16 * 2 * 2 * 256 * 2
