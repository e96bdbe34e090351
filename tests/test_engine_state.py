"""The serving engines' recurrent-state pools of hybrid models (runtimes/state_pools.py and
vllm_kv.state_layout): vLLM's raised attention block size, its state groups and what it reports, llama.cpp's
RS buffer, each against the engine's own formulas on real configs and against the published lines of
tests/reference/extra/engine_state_logs.json."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpumem_gui.cli import main
from gpumem_gui.core import GpumemInputError
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.runtimes import state_pools as sp
from gpumem_gui.core.runtimes import vllm_kv as vk
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run
from gpumem_gui.core.runtimes.vllm_kv import kv_per_token
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.mamba import Mamba2Spec
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.units import GiB, MiB
from tests.conftest import REPO

EXTRA = REPO / "tests" / "reference" / "extra"
CONFIGS = EXTRA / "configs"
POINTS = {p["id"]: p for p in json.loads((EXTRA / "engine_state_logs.json").read_text())["points"]}


def _cfg(key: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{key}.json").read_text())


def _spec(key: str, cfg: dict[str, Any] | None = None) -> ModelSpec:
    return spec_from_config(cfg or _cfg(key), name=key)


def _qwen35_08b() -> ModelSpec:
    """Qwen3.5-0.8B as the llama.cpp log's GGUF metadata prints it, on Qwen3.5-9B's config."""
    cfg = _cfg("Qwen__Qwen3.5-9B")
    text = cfg["text_config"]
    text |= {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "layer_types": text["layer_types"][:24],
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "linear_num_value_heads": 16,
        "intermediate_size": 3584,
    }
    return _spec("Qwen3.5-0.8B", cfg)


def _nemotron_nano_9b_v2(fp32_state: bool) -> ModelSpec:
    """Nemotron-H-8B with NVIDIA-Nemotron-Nano-9B-v2's Mamba-2 mixer (head_dim 80)."""
    spec = _spec("nvidia__Nemotron-H-8B-Base-8K")
    assert spec.mamba is not None and spec.traits.vllm_ssm_state_fp32
    mixer = Mamba2Spec(**(spec.mamba.model_dump() | {"heads": 128, "head_dim": 80, "groups": 8}))
    traits = spec.traits.model_copy(update={"vllm_ssm_state_fp32": fp32_state})
    return spec.model_copy(update={"mamba": mixer, "traits": traits})


def _vllm_block(spec: ModelSpec, tp: int = 1) -> tuple[int, int, int]:
    """(attention block size, state page, attention bytes per token and layer) of a bf16 model."""
    attn_1 = kv_per_token(spec, 2, tp, 1)
    page = sp.vllm_state_page(spec, tp, 2)
    return sp.vllm_attention_block_size(page, attn_1, 16), page, attn_1


def test_vllm_qwen3_next_tp2_log() -> None:
    """973,760 tokens and 14.77x from a 44.59 GiB pool: 12 attention layers and 3 groups of 12 GDN layers
    share blocks of 544 tokens (1 KV head of 256 per rank; conv (3, 4096) + state (16, 128, 128), bf16)."""
    point = POINTS["vllm-qwen3-next-80b-tp2-h200"]
    spec, run, want = _spec(point["model"]), point["run"], point["expect"]
    bs, page, attn_1 = _vllm_block(spec, run["tp"])
    assert (page, attn_1) == (3 * 4096 * 2 + 16 * 128 * 128 * 2, 2 * 256 * 2)
    assert bs == want["attention_block_size"]
    assert round(100 * (bs * attn_1 - page) / page, 2) == want["padding_pct"]
    lay = vk.state_layout(spec, 1, bs * attn_1)
    assert (lay.windows, lay.state_groups, lay.group_size) == ((None,), 3, 12)
    blocks = lay.blocks(int(run["pool_gib"] * GiB))
    assert lay.reported_tokens(blocks, bs) == want["kv_tokens"]
    per_request = lay.blocks_per_request(run["max_model_len"], bs, run["max_num_batched_tokens"])
    assert per_request == 482 + 3  # ceil(262144 / 544) attention blocks + one page per state group
    assert round(blocks / per_request, 2) == want["max_concurrency"]


def test_vllm_qwen35_fp32_state_from_config() -> None:
    """Qwen3.5's mamba_ssm_dtype float32: the fp32 state gives 544-token blocks, padding 2.64 %."""
    want = POINTS["vllm-qwen3.5-0.8b"]["expect"]
    spec = _qwen35_08b()
    assert spec.traits.vllm_ssm_state_fp32
    bs, page, attn_1 = _vllm_block(spec)
    assert page == 3 * 6144 * 2 + 16 * 128 * 128 * 4
    assert bs == want["attention_block_size"]
    assert round(100 * (bs * attn_1 - page) / page, 2) == want["padding_pct"]


def test_vllm_kimi_linear_mla_block_size_log() -> None:
    """An MLA hybrid aligns vLLM's raised block size to 64 (HybridAttentionMambaModelConfig: MLA kernel
    block alignment), not 16: 960 tokens at TP 2 (15 x 64 x 1,152 B >= the KDA page of 1,085,440 B), the
    page padded by 1.89 % (vLLM issue #28228)."""
    point = POINTS["vllm-kimi-linear-48b-tp2"]
    spec, want = _spec(point["model"]), point["expect"]
    est = estimate_inference(spec, make_run(engine="vllm", tp=point["run"]["tp"]), capacity=80 * GiB)
    f = est.facts
    assert f["attention_block_size"] == want["attention_block_size"]
    pad = 100 * (f["state_page_padded_bytes"] - f["state_page_bytes"]) / f["state_page_bytes"]
    assert round(pad, 2) == want["padding_pct"]


def test_vllm_nemotron_nano_block_size() -> None:
    """672 tokens with the float16 state vLLM defaulted to in 2025 (issue #24280); 1312 with float32."""
    want = POINTS["vllm-nemotron-nano-9b-v2"]["expect"]
    assert _vllm_block(_nemotron_nano_9b_v2(False))[0] == want["attention_block_size"]
    assert _vllm_block(_nemotron_nano_9b_v2(True))[0] == want["attention_block_size_fp32_state"]


@pytest.mark.parametrize(
    "pid", ["llamacpp-qwen3.5-0.8b-np4", "llamacpp-qwen3.5-9b-np4", "llamacpp-lfm2-1.2b-backbone"]
)
def test_llamacpp_qwen35_rs_buffer_log(pid: str) -> None:
    """The KV of the attention layers only (6 of 24, 8 of 32, 6 of 16) and the RS buffer of n_seq_max cells,
    R (f32) and S (f32), as logged."""
    point = POINTS[pid]
    want = point["expect"]
    spec = _qwen35_08b() if point["model"].startswith("derived") else _spec(point["model"])
    est = estimate_inference(spec, make_run(engine="llama.cpp", **point["run"]))
    facts = est.facts
    assert est.kv_cache_bytes == want["kv_mib"] * MiB
    assert round(int(facts["rs_r_bytes"]) / MiB, 2) == want["r_mib"]  # type: ignore[call-overload]
    assert round(int(facts["rs_s_bytes"]) / MiB, 2) == want["s_mib"]  # type: ignore[call-overload]
    assert facts["rs_cells"] == want["rs_cells"]
    state = next(c for c in est.components if c.key == "recurrent_state")
    assert state.bytes == int(facts["rs_r_bytes"]) + int(facts["rs_s_bytes"])  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("key", "conv", "ssm"),
    [
        # Mamba-2: (d_conv - 1) x (d_inner + 2 n_group d_state), d_state x d_inner
        ("nvidia__Nemotron-H-8B-Base-8K", 3 * (8192 + 2 * 8 * 128), 128 * 8192),
        ("ibm-granite__granite-4.0-h-tiny", 3 * (3072 + 2 * 128), 128 * 3072),
        # Falcon-H1: a Mamba-2 mixer beside attention in every layer (filter_recr true for all)
        ("tiiuae__Falcon-H1-0.5B-Instruct", 3 * (1536 + 2 * 128), 128 * 1536),
        # Mamba-1 (n_group 0): (d_conv - 1) x d_inner, d_state x d_inner
        ("ai21labs__Jamba-v0.1", 3 * 8192, 16 * 8192),
        # LFM2 short conv: n_embd x (L_cache - 1), no s
        ("LiquidAI__LFM2-1.2B", 2048 * 2, 0),
        # gated DeltaNet: conv over q, k, v; s = k_dim x (v heads x v_dim)
        ("Qwen__Qwen3-Next-80B-A3B-Instruct", 3 * 8192, 128 * 32 * 128),
    ],
)
def test_llamacpp_widths_are_n_embd_r_and_s(key: str, conv: int, ssm: int) -> None:
    spec = _spec(key)
    (kind,) = model_kinds(spec).state  # one state kind per model here
    assert sp.llamacpp_state_widths(spec, kind) == (conv, ssm)
    est = estimate_inference(spec, make_run(engine="llama.cpp", batch=3, seq=1024))
    n = len(sp.state_layer_indices(spec))
    assert est.facts["rs_r_bytes"] == n * 3 * conv * 4 and est.facts["rs_s_bytes"] == n * 3 * ssm * 4


def test_llamacpp_kv_counts_attention_layers_only() -> None:
    spec = _spec("nvidia__Nemotron-H-8B-Base-8K")  # 4 attention layers of 52, 8 KV heads of 128
    est = estimate_inference(spec, make_run(engine="llama.cpp", batch=1, seq=4096, kv_dtype="fp16"))
    assert sp.attention_layer_count(spec) == 4
    assert est.kv_cache_bytes == 4 * 4096 * 2 * 8 * 128 * 2


def test_vllm_estimate_of_a_hybrid() -> None:
    """The estimate raises the block size, pads the state pages and admits by blocks over the groups."""
    spec = _spec("Qwen__Qwen3-Next-80B-A3B-Instruct")
    est = estimate_inference(spec, make_run(engine="vllm", seq=8192, weights="gptq-4"), capacity=140 * GiB)
    f = est.facts
    assert f["attention_block_size"] == f["block_size"] == 544  # 2 KV heads of 256 on one rank
    assert (f["kv_groups"], f["kv_group_layers"], f["kv_blocks_per_request"]) == (4, 12, 16 + 3)
    assert f["kv_tokens"] == int(f["gpu_blocks"]) // 4 * 544  # type: ignore[call-overload]
    assert f["kv_bytes_per_token"] == 12 * 2 * 2 * 256 * 2


# llama.cpp's own widths of the two linear-attention kinds it gained in 2026 (src/llama-hparams.cpp
# llama_hparams::n_embd_r / n_embd_s): KDA (Kimi-Linear, PR #18755: n_embd_head_kda = 128, n_head 32,
# ssm_d_conv 4) keeps a conv of q, k and v, r = 3 x (4 - 1) x 32 x 128, and s = 128 x 128 x 32 (the comment
# there: 524288); lightning (MiniMax-Text-01, PR #27018: n_embd_head_la = 128, n_head 64, no ssm_d_conv)
# keeps no conv, s = 128 x 128 x 64 (its comment: 1048576). Both f32, one cell per sequence.
@pytest.mark.parametrize(
    ("key", "layers", "conv", "ssm"),
    [
        ("moonshotai__Kimi-Linear-48B-A3B-Instruct", 20, 3 * 3 * 32 * 128, 524288),
        ("MiniMaxAI__MiniMax-Text-01-hf", 70, 0, 1048576),
    ],
)
def test_llamacpp_kda_and_lightning_widths(key: str, layers: int, conv: int, ssm: int) -> None:
    spec = _spec(key)
    (kind,) = model_kinds(spec).state
    assert sp.llamacpp_state_widths(spec, kind) == (conv, ssm)
    assert len(sp.state_layer_indices(spec)) == layers
    est = estimate_inference(spec, make_run(engine="llama.cpp", batch=2, seq=4096))
    assert est.facts["rs_cells"] == 2
    assert est.facts["rs_r_bytes"] == layers * 2 * conv * 4
    assert est.facts["rs_s_bytes"] == layers * 2 * ssm * 4
    assert any("decay tensors" in w for w in est.warnings)  # their graphs' compute inputs: not modelled


@pytest.mark.parametrize(
    ("key", "engine", "reason"),
    [
        # not in Ollama v0.12.10's vendored llama.cpp (llama/llama.cpp/src/llama-arch.cpp) nor its Go models
        (
            "MiniMaxAI__MiniMax-Text-01-hf",
            "ollama 0.12.10",
            r"v0\.12\.10 does not run MiniMax-Text-01.*#27018",
        ),
        (
            "moonshotai__Kimi-Linear-48B-A3B-Instruct",
            "ollama 0.12.10",
            r"v0\.12\.10 does not run Kimi-Linear.*#18755",
        ),
        # SGLang: no MiniMaxText01ForCausalLM (tracking issue #18458), no Mamba-1 state shape
        ("MiniMaxAI__MiniMax-Text-01-hf", "sglang", r"does not run MiniMax-Text-01 .*#18458"),
        ("ai21labs__Jamba-v0.1", "sglang", r"no Mamba-1 \(Jamba\) layout.*mambaish_config"),
    ],
)
def test_engines_that_do_not_run_a_state_kind_say_so(key: str, engine: str, reason: str) -> None:
    name, _, version = engine.partition(" ")  # "ollama 0.12.10": that release (0.30+ is the default)
    fields = {"ollama_version": version} if version else {}
    with pytest.raises(GpumemInputError, match=reason) as e:
        estimate_inference(_spec(key), make_run(engine=name, **fields))
    assert e.value.field == "engine" and "\n" not in str(e.value)


def test_vllm_tensor_parallel_splits_the_state_page() -> None:
    """vLLM shards every state shape by TP (MambaStateShapeCalculator): a TP-2 rank keeps half the page."""
    spec = _spec("LiquidAI__LFM2-1.2B")
    one, two = (estimate_inference(spec, make_run(engine="vllm", tp=tp)) for tp in (1, 2))
    assert two.facts["state_page_bytes"] * 2 == one.facts["state_page_bytes"]


@pytest.mark.parametrize(("pp", "tensors"), [(1, 6), (2, 4), (4, 2)])
def test_vllm_hybrid_groups_projected_on_pipeline_stages(pp: int, tensors: int) -> None:
    """LFM2-1.2B (16 layers; attention 2, 5, 8, 10, 12, 14; 10 short-conv layers): vLLM groups the whole
    model (kv_cache_utils.py _get_kv_cache_groups_uniform_page_size: group size 6, the attention layers'
    count, as 10 >= 1.5 x 6; the conv layers dealt layers[i::2] into 2 groups: 0 3 6 9 13 and 1 4 7 11 15),
    projects the 3 groups on each stage (_project_kv_cache_groups_to_worker) and gives a stage one tensor
    per layer of its fullest group (get_kv_cache_config_from_groups). pp 2 (get_pp_indices: 0-7, 8-15):
    stage 1 holds 4 attention layers (8 10 12 14), stage 0 3 + 3 conv: 4 tensors; pp 4 (4 layers a stage):
    2 (8 10; 12 14; 0 3; 4 7)."""
    spec = _spec("LiquidAI__LFM2-1.2B")
    est = estimate_inference(spec, make_run(engine="vllm", pp=pp, seq=4096), capacity=80 * GiB)
    f = est.facts
    page = 16 * 8 * 64 * 2 * 2  # a 16-token block x 8 KV heads x head_dim 64 x (K, V) x bf16
    assert f["attention_block_size"] == 16 and (f["kv_groups"], f["kv_group_layers"]) == (3, tensors)
    assert f["kv_block_bytes"] == tensors * page
    assert f["kv_tokens"] == int(f["gpu_blocks"]) // 3 * f["attention_block_size"]  # type: ignore[call-overload]


def test_llamacpp_partial_offload_splits_the_rs_buffer() -> None:
    """Each recurrent layer's r and s live on the layer's device (llama_memory_recurrent, model.dev_layer)."""
    spec = _spec("nvidia__Nemotron-H-8B-Base-8K")
    full = estimate_inference(spec, make_run(engine="llama.cpp", batch=2, seq=512))
    half = estimate_inference(spec, make_run(engine="llama.cpp", batch=2, seq=512, n_gpu_layers=26))
    total = int(full.facts["rs_r_bytes"]) + int(full.facts["rs_s_bytes"])  # type: ignore[call-overload]
    gpu = next(c.bytes for c in half.components if c.key == "recurrent_state")
    assert 0 < gpu < total and gpu + int(half.facts["rs_host_bytes"]) == total  # type: ignore[call-overload]


def test_bad_ssm_dtype_names_the_field() -> None:
    cfg = _cfg("Qwen__Qwen3.5-9B")
    cfg["text_config"]["mamba_ssm_dtype"] = "fp33"
    with pytest.raises(GpumemInputError) as e:
        _spec("bad", cfg)
    assert e.value.field == "mamba_ssm_dtype"


def test_cli_estimates_a_hybrid_on_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(CONFIGS / "Qwen__Qwen3.5-9B.json")
    assert main(["estimate", path, "--engine", "vllm", "--gpu", "H100", "--seq", "8192", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "attention_block_size" in json.dumps(out)
