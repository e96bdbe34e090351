"""DeepSeek-V4 (issue 29): the reader (transformers 5.24 ``configuration_deepseek_v4.py``), its parameters
as transformers builds them, its layer kinds (the compressed CSA / HCA layers and the sliding ones) with the
cache transformers keeps, and the one-line refusals of the estimates whose forward is not replayed yet."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpumem_gui.core import estimate_inference, estimate_training, load_model
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.runtimes.inference import RUNTIMES, make_run
from gpumem_gui.core.spec.compressed import deepseek_v4_held_bytes, deepseek_v4_params, is_fp32, shape_of
from gpumem_gui.core.spec.kinds import Attention, CompressedAttention
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.kv import kv_cache_bytes_transformers
from gpumem_gui.core.spec.params import count_params, text_tensors
from gpumem_gui.core.training.run import TrainingRun
from tests.conftest import REPO

EXTRA = REPO / "tests" / "reference" / "extra"
REF = json.loads((EXTRA / "compressed_cache.json").read_text())
LISTED = json.loads((EXTRA / "deepseek_v4_params.json").read_text())
TINY = json.loads((EXTRA / "configs" / "synthetic__deepseek_v4-tiny.json").read_text())
FLASH = REF["configs"]["deepseek-ai__DeepSeek-V4-Flash-Base"]
TRACED = json.loads((EXTRA / "deepseek_v4_trace.json").read_text())["points"]


def _spec(cfg: dict, name: str = "v4"):
    return spec_from_config(cfg, name=name)


def test_parameters_are_the_ones_transformers_builds() -> None:
    """Names, shapes and order of named_parameters() on the meta device (validation/
    measure_deepseek_v4_params.py), and the totals of the three configs transformers counted."""
    spec = _spec(TINY)
    mine = [[t.name, list(t.shape)] for t in text_tensors(spec)]
    assert mine == [[n, shape] for n, shape, _ in LISTED["params"]]
    assert count_params(spec).total == LISTED["total"]
    for key, want in REF["parameters"].items():
        if key != "about":
            spec = _spec(REF["configs"][key])
            assert count_params(spec).total == want["total"], key
            assert deepseek_v4_params(shape_of(spec)) == (want["total"], want["fp32"]), key


def test_flash_reads_as_published() -> None:
    spec = _spec(FLASH)
    v4 = spec.deepseek_v4
    assert v4 is not None and spec.moe is not None
    types = spec.layer_types
    # compress_ratios has 44 entries: the MTP slot is dropped; two sliding layers, then CSA / HCA alternating
    assert len(types) == 43 and types[:4] == ("sliding_attention",) * 2 + (
        "compressed_sparse_attention",
        "heavily_compressed_attention",
    )
    assert (types.count("compressed_sparse_attention"), types.count("heavily_compressed_attention")) == (
        21,
        20,
    )
    assert v4.hash_layers == (0, 1, 2)  # num_hash_layers 3
    assert (spec.num_kv_heads, spec.head_dim, spec.intermediate_size) == (1, 512, 2048)
    p = count_params(spec)
    assert (p.total, p.active_per_token) == (284_332_230_231, 13_799_622_231)


def test_layer_kinds_and_the_cache_transformers_keeps() -> None:
    """The compressed layers are a kind of their own, the sliding layers a one-head sliding Attention; the
    cache of every layer equals the bytes measured from transformers' cache objects at every point."""
    kinds = model_kinds(_spec(TINY))
    comp = kinds.of(CompressedAttention)
    assert {(k.kind, k.layers) for k in comp} == {
        ("heavily_compressed_attention", (0,)),
        ("compressed_sparse_attention", (1, 3)),
    }
    (sliding,) = kinds.of(Attention)
    assert (sliding.layers, sliding.kv_heads, sliding.head_dim, sliding.window) == ((2,), 1, 64, 16)
    for p in REF["points"]:
        spec = _spec(REF["configs"][p["config"]])
        assert list(kv_cache_bytes_transformers(spec, p["tokens"], p["batch"])) == p["per_layer_bytes"], p
    # DeepSeek-V4-Flash after 1M tokens (21 CSA x 320 B + 20 HCA x 8 B per token once the windows are full)
    assert sum(kv_cache_bytes_transformers(_spec(FLASH), 1 << 20)) == 7_220_377_600


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"layer_types": None, "compress_ratios": [0, 4, 3, 128]}, "compress_ratios"),
        (
            {
                "layer_types": [
                    "sliding_attention",
                    "full_attention",
                    "sliding_attention",
                    "sliding_attention",
                ]
            },
            "layer_types",
        ),
        ({"layer_types": ["sliding_attention"]}, "layer_types"),
        ({"mlp_layer_types": ["moe", "dense", "moe", "moe"]}, "mlp_layer_types"),
        ({"o_groups": 3}, "o_groups"),
        ({"compress_rates": {"compressed_sparse_attention": 0}}, "compress_rates"),
        ({"mlp_bias": True}, "mlp_bias"),
    ],
)
def test_bad_fields_are_one_line(change: dict, field: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        _spec({**TINY, **change})
    assert field in str(e.value) and "\n" not in str(e.value)


def test_legacy_keys_read_as_post_init_folds_them() -> None:
    """compress_ratios (0 / 4 / 128) is layer_types; num_hash_layers the hash_moe prefix; compress_rate_csa /
    compress_rate_hca the rates; without either list two HCA layers then CSA on odd indices."""
    base = {k: v for k, v in TINY.items() if k not in ("layer_types", "mlp_layer_types", "compress_rates")}
    legacy = {**base, "compress_ratios": [128, 4, 0, 4], "num_hash_layers": 1}
    legacy |= {"compress_rate_csa": 4, "compress_rate_hca": 32}
    assert _spec(legacy).model_dump(exclude={"name"}) == _spec(TINY).model_dump(exclude={"name"})
    default = _spec(base)
    assert default.layer_types == ("heavily_compressed_attention",) * 3 + ("compressed_sparse_attention",)
    assert default.deepseek_v4.hash_layers == (0, 1, 2)  # type: ignore[union-attr]


def test_serving_engines_refuse_in_one_line() -> None:
    """The serving engines whose profile does not model the compressed cache say so in one line each;
    transformers (its forward is replayed: replay/dsv4.py), vLLM, SGLang and llama.cpp (runtimes/vllm_dsv4.py,
    sglang_dsv4.py, llamacpp_dsv4.py; tests/test_dsv4_engines.py, test_sglang_dsv4.py, test_llamacpp_dsv4.py)
    estimate it."""
    spec = load_model(str(EXTRA / "configs" / "synthetic__deepseek_v4-tiny.json")).spec
    assert spec is not None
    said = set()
    modelled = ("transformers", "vllm", "sglang", "llama.cpp")
    for engine, rt in RUNTIMES.items():
        if engine in modelled:
            assert all(rt.supports(k) for k in model_kinds(spec).of(CompressedAttention))
            continue
        run = make_run(engine=engine, seq=64)
        if rt.for_run(run) is not rt:  # Ollama's default release (0.30+) runs llama-server, which models it
            assert all(rt.for_run(run).supports(k) for k in model_kinds(spec).of(CompressedAttention))
            run = run.model_copy(update={"ollama_version": "0.12.10"})  # RUNTIMES holds v0.12.10's profile
        assert not any(rt.supports(k) for k in model_kinds(spec).of(CompressedAttention))
        with pytest.raises(GpumemInputError) as e:
            estimate_inference(spec, run)
        msg = str(e.value)
        assert msg.count("\n") == 0 and engine in msg and "DeepSeek-V4" in msg
        said.add(msg)
    assert len(said) == len(RUNTIMES) - len(modelled)  # each engine says what it does with the model


@pytest.mark.parametrize(
    "change", [{"method": "qlora"}, {"tp": 2}, {"cp": 2}, {"compile": True}, {"float8": True}]
)
def test_training_refuses_what_is_not_replayed_in_one_line(change: dict) -> None:
    """Full fine-tuning and LoRA on data-parallel ranks are replayed and measured, nothing else."""
    spec = load_model(str(EXTRA / "configs" / "synthetic__deepseek_v4-tiny.json")).spec
    with pytest.raises(GpumemInputError) as e:
        estimate_training(spec, TrainingRun(seq=64, **change))
    field = next(iter(change))
    assert e.value.field == field and "DeepSeek-V4" in str(e.value) and "\n" not in str(e.value)


def test_training_replay_within_3_percent_of_the_trace() -> None:
    """A full fine-tuning step of the real model (`gpumem trace --mode train`: bf16 and amp-bf16, with and
    without gradient checkpointing): every phase within 3 % (measured: -1.6 % to 0 %), the peak too."""
    spec = load_model(str(EXTRA / "configs" / "synthetic__deepseek_v4-tiny.json")).spec
    points = [p for p in TRACED if p["mode"] == "train" and p["run"]["method"] == "full"]
    assert len(points) >= 4 and any(p["run"].get("grad_ckpt") for p in points)
    for p in points:
        est = estimate_training(spec, TrainingRun(**p["run"]))
        assert est.facts["trainable_params"] == p["trainable_params"], p["run"]
        assert abs(est.peak_bytes / p["peak_bytes"] - 1) <= 0.03, p["run"]
        for phase, want in p["phases"].items():
            assert abs(est.phases[phase].peak_bytes / want - 1) <= 0.03, (p["run"], phase)


def test_lora_replay_within_1_5_percent_of_the_live_storages() -> None:
    """LoRA steps of the real model with PEFT 0.21 (deepseek_v4_lora_storage.json: the targets all-linear
    less o_a_proj and the attention's own, bf16 and amp-bf16, with and without checkpointing): the trainable
    parameters are PEFT's, every phase within 1.5 % of the step counted by its live storages (measured:
    -0.85 % to +1.39 %; the optimizer phase above by the foreach temporary of the indexer's adapters, which
    get no gradient). `gpumem trace` counts more (under MemTracker part of the indexer's graph, whose
    integer top-k never runs a backward, stays alive): the forward, where the checkpointed steps equal the
    storage count to the byte, is within 3 % of the trace and no phase above it."""
    spec = load_model(str(EXTRA / "configs" / "synthetic__deepseek_v4-tiny.json")).spec
    counted = json.loads((EXTRA / "deepseek_v4_lora_storage.json").read_text())["points"]
    traced = [p for p in TRACED if p["mode"] == "train" and p["run"]["method"] == "lora"]
    assert len(counted) == len(traced) >= 4 and any(p["run"].get("grad_ckpt") for p in counted)
    for c, t in zip(counted, traced, strict=True):
        assert c["run"] == t["run"]
        est = estimate_training(spec, TrainingRun(**c["run"]))
        assert est.facts["trainable_params"] == c["trainable_params"] == t["trainable_params"], c["run"]
        for phase, want in c["phases"].items():
            got = est.phases[phase].peak_bytes
            assert abs(got / want - 1) <= 0.015, (c["run"], phase)
            assert got <= t["phases"][phase], (c["run"], phase)
        assert abs(est.phases["forward"].peak_bytes / t["phases"]["forward"] - 1) <= 0.03, c["run"]


@pytest.mark.parametrize(
    ("targets", "said"),
    [("all-linear", "o_a_proj"), ("o_a_proj,q_a_proj", "o_a_proj"), ("weights_proj", "indexer")],
)
def test_lora_peft_cannot_run_is_one_line(targets: str, said: str) -> None:
    """PEFT 0.21 wraps the grouped o_a_proj (an nn.Linear subclass) as a plain Linear: the first forward
    fails to broadcast (all-linear includes it); adapters on the indexer alone get no gradient and
    loss.backward() fails (both measured with gpumem trace)."""
    spec = load_model(str(EXTRA / "configs" / "synthetic__deepseek_v4-tiny.json")).spec
    with pytest.raises(GpumemInputError) as e:
        estimate_training(spec, TrainingRun(seq=64, method="lora", lora_targets=targets))
    assert e.value.field == "lora_targets" and said in str(e.value) and "\n" not in str(e.value)


def test_inference_replay_equals_the_trace() -> None:
    """generate() on the real model (`gpumem trace`, deepseek_v4_trace.json): every phase's peak within
    0.01 % (load exact: fp32 tensors and buffers), the prefill to the byte but for the 32 B PyTorch's tracker
    also counts, and the cache after the generation equal."""
    spec = load_model(str(EXTRA / "configs" / "synthetic__deepseek_v4-tiny.json")).spec
    points = [p for p in TRACED if p["mode"] == "inference"]
    assert len(points) >= 2
    for p in points:
        r = p["run"]
        run = make_run(batch=r["batch"], seq=r["seq"], new_tokens=r["new_tokens"], attn=r["attn"])
        est = estimate_inference(spec, run)
        assert est.phases["load"].peak_bytes == p["phases"]["load"], r
        assert abs(est.peak_bytes - p["peak_bytes"]) <= 1e-4 * p["peak_bytes"], r
        assert abs(est.phases["prefill"].peak_bytes - p["phases"]["prefill"]) <= 64, r
        # the last step: the cache's storage differs from its rule by the views the compressors keep
        assert abs(est.phases["decode"].peak_bytes - p["phases"]["decode"]) <= 0.01 * p["phases"]["decode"], r
        assert est.kv_cache_bytes == p["kv_cache_bytes"], r


@pytest.mark.parametrize(
    ("change", "field"),
    [({"attn": "flash"}, "attn"), ({"kv_dtype": "int8"}, "kv_dtype"), ({"tp": 2}, "tp")],
)
def test_transformers_refuses_what_it_cannot_run(change: dict, field: str) -> None:
    """Eager only (_supports_flash_attn = False), its own cache layers (no quantized cache), one GPU."""
    spec = load_model(str(EXTRA / "configs" / "synthetic__deepseek_v4-tiny.json")).spec
    with pytest.raises(GpumemInputError) as e:
        estimate_inference(spec, make_run(seq=64, **change))
    assert e.value.field == field and "\n" not in str(e.value)


def test_cli_exit_status_2_and_inspect() -> None:
    cfg = str(EXTRA / "configs" / "synthetic__deepseek_v4-tiny.json")
    cli = [sys.executable, "-m", "gpumem_gui"]
    env_ok = subprocess.run(
        [*cli, "estimate", cfg, "--seq", "64", "--engine", "ollama", "--ollama-version", "0.12.10"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert env_ok.returncode == 2 and "Traceback" not in env_ok.stderr
    out = subprocess.run(
        [*cli, "inspect", cfg, "--json"], capture_output=True, text=True, cwd=REPO, check=True
    )
    doc = json.loads(out.stdout)
    assert doc["kv_cache_bytes_per_token"] is None  # a rule of the length, no per-token figure
    assert doc["kv_cache_bytes_per_sequence_at"]["4096"] == sum(
        kv_cache_bytes_transformers(_spec(TINY), 4096)
    )


def test_trace_compares_with_the_estimate_where_there_is_one() -> None:
    """`gpumem trace` of a DeepSeek-V4 run: compared with the estimate where the replay models the run, and
    measured without one (not an error) where it refuses it (LoRA on all-linear, which takes o_a_proj)."""
    from gpumem_gui.core.runtimes.inference import make_run as inference_run
    from gpumem_gui.trace.result import _analytic

    model = load_model(str(EXTRA / "configs" / "synthetic__deepseek_v4-tiny.json"))
    est, _ = _analytic(model, inference_run(seq=64, attn="eager"))
    assert est is not None and est.peak_bytes > 0
    assert _analytic(model, TrainingRun(seq=64, method="lora")) == (None, {})


def test_fp32_parameters_and_buffers_as_transformers_holds_them() -> None:
    """The parameters transformers keeps in fp32 (each listed tensor's dtype; the fp32 totals of the three
    counted configs), and parameters + buffers equal to the load phase of every traced point."""
    assert all(is_fp32(name) == (dtype == "float32") for name, _, dtype in LISTED["params"])
    for key, want in REF["parameters"].items():
        if key != "about":
            tensors = text_tensors(_spec(REF["configs"][key]))
            assert sum(t.numel for t in tensors if is_fp32(t.name)) == want["fp32"], key
    spec = _spec(TINY)
    inference = [p for p in TRACED if p["mode"] == "inference"]
    assert len(inference) >= 2
    for p in inference:
        assert p["phases"]["load"] == deepseek_v4_held_bytes(spec), p["run"]


def test_traced_cache_is_the_rule_of_the_length() -> None:
    """`gpumem trace` of the real model: the cache after the generation equals the kinds' cache."""
    spec = _spec(TINY)
    for p in (p for p in TRACED if p["mode"] == "inference"):
        r = p["run"]
        tokens = r["seq"] + r["new_tokens"]
        assert p["kv_cache_bytes"] == sum(kv_cache_bytes_transformers(spec, tokens, r["batch"])), r


def test_catalog_flagship_is_the_config_as_read() -> None:
    """`gpumem models` lists DeepSeek-V4-Flash-Base; its catalog spec is its shipped config.json read now."""
    from gpumem_gui.core.readers.catalog import catalog_config, find_model

    entry = find_model("deepseek-ai/DeepSeek-V4-Flash-Base")
    assert entry is not None and count_params(entry.spec).total == 284_332_230_231
    cfg = catalog_config(entry)
    assert cfg is not None
    skip = {"name", "provenance"}
    assert entry.spec.model_dump(exclude=skip) == _spec(cfg).model_dump(exclude=skip)
