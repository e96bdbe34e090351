"""The Ollama engine: defaults, OLLAMA_NUM_PARALLEL x num_ctx, flash attention, the KV type, layer placement
when the model does not fit, Ollama names -> models, the command/Modelfile import, and bad input. The
estimates are v0.12.10's (``ollama_version`` 0.12.10: its llama runner and its own placement, no longer the
default); v0.30+'s llama-server is tests/test_ollama_server.py's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.imports import import_command
from gpumem_gui.core.imports.ollama import import_modelfile
from gpumem_gui.core.readers.loader import load_model
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run, runtime
from gpumem_gui.core.runtimes.ollama_models import OLLAMA_FAMILIES, resolve_ollama_model
from gpumem_gui.core.runtimes.ollama_predict import MINIMUM_MEMORY
from gpumem_gui.core.units import GiB, MiB
from tests.fuzz_strategies import fuzz_settings

LLAMA8 = load_model("meta-llama/Llama-3.1-8B").spec
QWEN3 = load_model("Qwen/Qwen3-8B").spec
OLD = "0.12.10"


def _est(spec=LLAMA8, capacity=None, **kw):
    run = make_run(engine="ollama", ollama_version=OLD, weights="gguf-Q4_K_M", **kw)
    return estimate_inference(spec, run, capacity)


def _kv(est) -> int:
    return next(c.bytes for c in est.components if c.key == "kv_cache")


def test_defaults_are_ollamas() -> None:
    """num_ctx 4096, one slot, f16 KV, llama without flash attention, num_batch 512, every layer + output."""
    est = _est()
    f = est.facts
    assert (f["num_ctx"], f["num_parallel"], f["kv_cells"], f["num_batch"]) == (4096, 1, 4096, 512)
    assert (f["flash_attention"], f["kv_cache_type"], f["offloaded"]) == (False, "f16", "33/33")
    assert _kv(est) == 32 * 4096 * 2 * 8 * 128 * 2  # layers x cells x (K+V) x heads x head_dim x f16
    assert f["ollama_graph_full"] == 4 * 512 * (1 + 4 * 4096 + 4096 * 33)  # llama case of GraphSize
    assert est.engine == "ollama"


def test_num_parallel_multiplies_the_context() -> None:
    one, four = _est(num_ctx=8192), _est(num_ctx=8192, num_parallel=4)
    assert four.facts["kv_cells"] == 4 * 8192
    assert _kv(four) == 4 * _kv(one)
    assert four.facts["ollama_kv"] == 4 * one.facts["ollama_kv"]


def test_flash_attention_default_per_architecture_and_its_graph() -> None:
    assert _est(QWEN3).facts["flash_attention"] is True  # qwen3 is on by default (ggml.go FlashAttention)
    off, on = _est(num_ctx=32768), _est(num_ctx=32768, flash_attention="on")
    compute = [next(c.bytes for c in e.components if c.key == "compute_buffer") for e in (on, off)]
    assert compute[0] < compute[1]  # no n_ctx x n_ubatch x heads score matrix
    assert _est(QWEN3, flash_attention="off").facts["flash_attention"] is False


def test_kv_type_needs_flash_attention() -> None:
    q8 = _est(num_ctx=8192, flash_attention="on", kv_dtype="q8_0")
    f16 = _est(num_ctx=8192, flash_attention="on")
    assert q8.facts["kv_cache_type"] == "q8_0"
    assert _kv(q8) == round(_kv(f16) * 34 / 64)  # ggml q8_0: 34 bytes per 32 elements vs 2 B
    assert q8.facts["ollama_kv"] == f16.facts["ollama_kv"] // 2  # Ollama's own estimate: 1 byte
    no_fa = _est(num_ctx=8192, kv_dtype="q4_0")
    assert no_fa.facts["kv_cache_type"] == "f16" and _kv(no_fa) == _kv(f16)
    assert any("needs flash attention" in w for w in no_fa.warnings)


def test_layers_go_to_the_cpu_when_the_gpu_is_small() -> None:
    """Blocks go last first while they fit; the rest and the output layer stay in host memory."""
    big = _est(capacity=24 * GiB, num_ctx=131072)
    small = _est(capacity=8 * GiB, num_ctx=131072)
    n_big, n_small = (int(str(e.facts["offloaded"]).split("/")[0]) for e in (big, small))
    assert n_small < n_big < 33
    assert small.facts["ollama_required_partial"] < 8 * GiB  # Ollama keeps under the free memory
    assert small.facts["cpu_bytes"] > big.facts["cpu_bytes"]
    weights = next(c for c in small.components if c.key == "weights")
    assert f"{n_small}/32 layers" in weights.label
    assert any("Ollama offloads" in w for w in small.warnings)
    # too small for the minimum, the graph and two spare layers: nothing on the GPU
    tiny = _est(capacity=MINIMUM_MEMORY, num_ctx=131072)
    assert tiny.facts["offloaded"] == "0/33"


def test_num_gpu_and_overhead_limit_the_layers() -> None:
    assert _est(num_gpu=10).facts["offloaded"] == "10/33"
    roomy, tight = _est(capacity=6 * GiB), _est(capacity=6 * GiB, gpu_overhead_mib=2048)
    assert int(str(tight.facts["offloaded"])[:2].rstrip("/")) < int(str(roomy.facts["offloaded"])[:2])


def test_num_gpu_goes_to_llama_cpp_as_set_and_fit_offers_it() -> None:
    """A num_gpu above Ollama's prediction is loaded anyway (warned); fit's lever is the most that fit."""
    auto = _est(capacity=8 * GiB, num_ctx=131072)
    forced = _est(capacity=8 * GiB, num_ctx=131072, num_gpu=33)
    assert (
        forced.facts["offloaded"] == "33/33" and forced.facts["ollama_layers"] == auto.facts["ollama_layers"]
    )
    assert any("may run out of memory" in w for w in forced.warnings)
    assert not runtime("ollama").admits(auto) and runtime("ollama").admits(forced)
    run = make_run(engine="ollama", ollama_version=OLD, weights="gguf-Q4_K_M", num_ctx=32768)
    levers = runtime("ollama").fit_levers(
        LLAMA8,
        run,
        lambda **u: estimate_inference(LLAMA8, run.model_copy(update=u), 8 * GiB).total_bytes < 8 * GiB,
    )
    kinds = {kind: upd for _, kind, _, upd in levers}
    assert kinds["flash"] == {"flash_attention": "on", "kv_dtype": "q8_0"}
    assert 0 < kinds["offload"]["num_gpu"] < 33


def test_context_beyond_training_is_clamped() -> None:
    spec = load_model("meta-llama/Llama-2-7b-hf").spec  # 4096 training context
    est = _est(spec, num_ctx=16384)
    assert est.facts["num_ctx"] == 4096
    assert any("training context" in w for w in est.warnings)


def test_tensor_parallel_is_one_line_error() -> None:
    with pytest.raises(GpumemInputError, match="no tensor or expert"):
        _est(tp=2)


def test_copied_command_reads_back() -> None:
    run = make_run(engine="ollama", weights="gguf-Q8_0", num_ctx=16384, num_parallel=2, flash_attention="on",
                   kv_dtype="q8_0", num_gpu=20)  # fmt: skip
    est = estimate_inference(LLAMA8, run)
    text = runtime("ollama").command("meta-llama/Llama-3.1-8B", run, est)
    assert "ollama run llama3.1:8b-q8_0" in text and "OLLAMA_NUM_PARALLEL=2" in text
    back = import_command(text).run
    for field in ("engine", "weights", "num_ctx", "num_parallel", "flash_attention", "kv_dtype", "num_gpu"):
        assert getattr(back, field) == getattr(run, field), field


# ---- names -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "hf", "weights"),
    [
        ("llama3.1:8b-instruct-q4_K_M", "meta-llama/Llama-3.1-8B", "gguf-Q4_K_M"),
        ("llama3.1", "meta-llama/Llama-3.1-8B", "gguf-Q4_K_M"),
        ("llama3.2:1b", "meta-llama/Llama-3.2-1B", "gguf-Q8_0"),
        ("llama3:70b", "meta-llama/Meta-Llama-3-70B", "gguf-Q4_0"),
        ("qwen2.5:7b", "Qwen/Qwen2.5-7B", "gguf-Q4_K_M"),
        ("qwen3:30b", "Qwen/Qwen3-30B-A3B", "gguf-Q4_K_M"),
        ("gemma3:27b-it-fp16", "google/gemma-3-27b-it", "gguf-F16"),
        ("mistral:7b-instruct-v0.3-q8_0", "mistralai/Mistral-7B-Instruct-v0.3", "gguf-Q8_0"),
        ("phi3:mini", "microsoft/Phi-3-mini-4k-instruct", "gguf-Q4_0"),
        ("deepseek-r1:14b", "Qwen/Qwen2.5-14B", "gguf-Q4_K_M"),
        ("gpt-oss:20b", "openai/gpt-oss-20b", "gguf-MXFP4_MOE"),
        ("registry.ollama.ai/library/phi4:latest", "microsoft/phi-4", "gguf-Q4_K_M"),
    ],
)
def test_names_map_to_models_and_types(name: str, hf: str, weights: str) -> None:
    m = resolve_ollama_model(name)
    assert (m.hf, m.weights) == (hf, weights)
    assert m.source.startswith("https://ollama.com/library/")


def test_every_catalog_target_loads() -> None:
    """Each size names a model gpumem has (gpt-oss: from the hub, not the built-in catalog)."""
    from gpumem_gui.core.readers.catalog import find_model

    missing = [hf for f in OLLAMA_FAMILIES.values() for hf in f.sizes.values() if find_model(hf) is None]
    assert set(missing) <= {"openai/gpt-oss-20b", "openai/gpt-oss-120b"}


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("foo:7b", "unknown Ollama model 'foo:7b'; known: llama3.1"),
        ("llama3.1:13b", "no size '13b'; sizes: 8b"),
        ("qwen3:8b-q9_X", "unknown GGUF quantization 'q9_X'"),
    ],
)
def test_bad_names_are_one_line(name: str, says: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        resolve_ollama_model(name)
    assert says in str(e.value) and "\n" not in str(e.value)


# ---- import -----------------------------------------------------------------------------------------------


def test_serve_environment_and_set_parameter() -> None:
    r = import_command(
        "OLLAMA_NUM_PARALLEL=4 OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE=q8_0 ollama serve\n"
        "ollama run qwen3:8b --verbose\n/set parameter num_ctx 8192\n/set parameter temperature 0.2"
    )
    assert r.model == "Qwen/Qwen3-8B"
    run = r.run
    assert (run.engine, run.num_parallel, run.flash_attention, run.kv_dtype, run.num_ctx) == (
        "ollama", 4, "on", "q8_0", 8192
    )  # fmt: skip
    assert any("--verbose" in w for w in r.warnings) and any("temperature" in w for w in r.warnings)


def test_environment_given_separately() -> None:
    env = {"OLLAMA_CONTEXT_LENGTH": "32768", "OLLAMA_GPU_OVERHEAD": str(512 * MiB), "OLLAMA_HOST": "0.0.0.0",
           "PATH": "/usr/bin", "OLLAMA_SCHED_SPREAD": "1"}  # fmt: skip
    r = import_command("ollama run llama3.1:70b", env)
    assert (r.run.num_ctx, r.run.gpu_overhead_mib) == (32768, 512)
    assert any("OLLAMA_HOST" in w for w in r.warnings) and r.run.sched_spread
    assert not any("PATH" in w for w in r.warnings)


def test_modelfile() -> None:
    text = (
        "# my model\nFROM llama3.1:8b\nPARAMETER num_ctx 16384\nPARAMETER num_gpu 20\n"
        'PARAMETER stop "<|eot_id|>"\n'
        'TEMPLATE """{{ .System }}\n{{ .Prompt }}"""\nADAPTER ./lora.gguf\n'
    )
    r = import_modelfile(text)
    assert (r.model, r.run.num_ctx, r.run.num_gpu, r.run.engine) == (
        "meta-llama/Llama-3.1-8B",
        16384,
        20,
        "ollama",
    )
    assert any("ADAPTER" in w for w in r.warnings) and any("stop" in w for w in r.warnings)
    pasted = import_command("FROM qwen2.5:14b\nPARAMETER num_ctx 8192")
    assert (pasted.model, pasted.run.num_ctx) == ("Qwen/Qwen2.5-14B", 8192)
    local = import_modelfile("FROM ./models/mine.gguf")
    assert (local.model, local.run.weights) == ("./models/mine.gguf", "file")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ollama run foo:7b", "argument 2 'foo:7b': unknown Ollama model"),
        ("ollama run llama3.1\n/set parameter num_ctx abc", "argument 6 'num_ctx': expected a whole number"),
        ("ollama run llama3.1\n/set parameter num_ctx 0", "out of range"),
        ("OLLAMA_NUM_PARALLEL=x ollama serve", "environment OLLAMA_NUM_PARALLEL: expected a whole number"),
        ("ollama serve", "no model named"),
        ("ollama run", "needs a model"),
    ],
)
def test_bad_commands_are_one_line(text: str, says: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        import_command(text)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_bad_modelfile_line() -> None:
    with pytest.raises(GpumemInputError, match=r"line 2 'FORM': not a Modelfile instruction"):
        import_modelfile("FROM llama3.1\nFORM x")


_WORDS = st.sampled_from(
    [
        "ollama",
        "run",
        "serve",
        "llama3.1:8b",
        "qwen3",
        "/set",
        "parameter",
        "num_ctx",
        "num_gpu",
        "8192",
        "-1",
        "--verbose",
        "--format",
        "json",
        "FROM",
        "PARAMETER",
        "x",
        "q8_0",
        "OLLAMA_NUM_PARALLEL=2",
        '"',
        "é",
    ]
)


@fuzz_settings(200)
@given(st.lists(st.one_of(_WORDS, st.text(max_size=12)), max_size=12))
def test_fuzz_commands_read_or_fail_in_one_line(words: list[str]) -> None:
    text = " ".join(words)
    try:
        r = import_command(text)
    except GpumemInputError as e:
        assert "\n" not in str(e)
        return
    assert r.run.engine in ("ollama", "llama.cpp", "vllm", "sglang")


@fuzz_settings(200)
@given(st.text(max_size=200))
def test_fuzz_modelfiles_and_names(text: str) -> None:
    for call in (lambda: import_modelfile(text), lambda: resolve_ollama_model(text)):
        try:
            call()
        except GpumemInputError as e:
            assert "\n" not in str(e)
