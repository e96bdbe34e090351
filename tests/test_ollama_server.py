"""Ollama v0.30+ (``ollama_version`` 0.30+): upstream llama-server under Ollama v0.33's arguments, defaults.

Each rule is checked against Ollama's own arithmetic (github.com/ollama/ollama v0.33.0-rc2): server/routes.go
Serve (num_ctx by total VRAM), server/sched.go (numParallel 1 for some families, automaticGenerationBatch,
selectLlamaServerPlacement), llm/llama_server.go (startLlamaServer's arguments, PredictServerVRAM); the bytes
are the llama.cpp profile's for the llama-server command Ollama starts."""

from __future__ import annotations

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.fields import UI
from gpumem_gui.core.readers.loader import load_model
from gpumem_gui.core.results.nontorch import context_bytes
from gpumem_gui.core.runtimes.base import run_weight_bytes
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run, runtime
from gpumem_gui.core.runtimes.ollama_server import auto_num_batch, default_num_ctx, predict_server_vram
from gpumem_gui.core.runtimes.ollama_split import gpu_share, head_bytes
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.units import GiB, MiB

LLAMA8 = load_model("meta-llama/Llama-3.1-8B").spec
QWEN35 = load_model("Qwen/Qwen3.5-9B").spec
QWEN30 = load_model("Qwen/Qwen3-30B-A3B").spec
NEW = "0.30+"


def _est(spec=LLAMA8, gpu=None, **kw):
    run = make_run(engine="ollama", ollama_version=NEW, weights="gguf-Q4_K_M", **kw)
    return estimate_inference(spec, run, gpu)


@pytest.mark.parametrize(
    ("vram", "ctx"),
    [(0, 4096), (23 * GiB - 1, 4096), (23 * GiB, 32768), (47 * GiB - 1, 32768), (47 * GiB, 262144)],
)
def test_default_num_ctx_by_total_vram(vram: int, ctx: int) -> None:
    """server/routes.go: >= 47 GiB -> 262144, >= 23 GiB -> 32768, else 4096."""
    assert default_num_ctx(vram) == ctx


def test_the_estimate_uses_the_tier_of_all_gpus_less_the_overhead() -> None:
    assert _est(gpu=24 * GiB).facts["num_ctx"] == 32768
    over = _est(gpu=24 * GiB, gpu_overhead_mib=2048)
    assert over.facts["num_ctx"] == 4096  # 22 GiB after the overhead
    assert any("OLLAMA_GPU_OVERHEAD off the VRAM behind the default num_ctx only" in w for w in over.warnings)
    assert _est(gpu=80 * GiB).facts["num_ctx"] == 131072  # 262144 clamped to the training context
    assert _est(gpu=80 * GiB, num_ctx=8192).facts["num_ctx"] == 8192  # num_ctx / OLLAMA_CONTEXT_LENGTH set
    assert _est().facts["num_ctx"] == 4096  # no GPU memory: no VRAM found


def test_predict_server_vram_is_ollamas() -> None:
    """llm/llama_server.go PredictServerVRAM: weights + 2 x blocks x kv heads x (hidden / heads) x ctx x 2."""
    wb = run_weight_bytes(LLAMA8, make_run(engine="ollama", weights="gguf-Q4_K_M"), True)
    assert predict_server_vram(LLAMA8, wb, 8192) == wb.total_bytes + 2 * 32 * 8 * 128 * 8192 * 2


@pytest.mark.parametrize(
    ("ctx", "predicted", "free", "flash", "gpu", "batch"),
    [
        (4096, 5 * GiB, 24 * GiB, "auto", 24 * GiB, 512),  # generationBatchForContext: <= 4096
        (8192, 5 * GiB, 24 * GiB, "auto", 24 * GiB, 1024),  # > 4096, within 75 %, 768 MiB fits below 80 %
        (40000, 5 * GiB, 24 * GiB, "auto", 24 * GiB, 2048),  # > 32768, within 60 %, 2 GiB below 80 %
        (40000, 16 * GiB, 24 * GiB, "auto", 24 * GiB, 1024),  # 2048 over 60 % (14.4 GiB): lowered
        (40000, 19 * GiB, 24 * GiB, "auto", 24 * GiB, 512),  # over 75 % too
        (40000, 5 * GiB, 0, "auto", 0, 2048),  # no free memory known: no check (generationBatchFits)
        (8192, 5 * GiB, 8 * GiB, "off", 8 * GiB, 256),  # CUDA, no flash attention, <= 8 GiB, > 4096
        (8192, 5 * GiB, 24 * GiB, "off", 24 * GiB, 512),
        (4096, 5 * GiB, 8 * GiB, "off", 8 * GiB, 512),
    ],
)
def test_automatic_num_batch_is_ollamas(
    ctx: int, predicted: int, free: int, flash: str, gpu: int, batch: int
) -> None:
    """server/sched.go automaticGenerationBatch with its thresholds."""
    assert auto_num_batch(ctx, predicted, free, flash, gpu) == batch


def test_the_bytes_are_llama_cpps_for_the_command_ollama_starts() -> None:
    """-c num_ctx x parallel -np parallel -b/-ub num_batch --flash-attn auto (on), f16 KV, --fit: the
    llama.cpp profile's estimate of that command, byte for byte; the KV buffer 32 x 32768 x (K + V) x 8 x 128
    x 2 B."""
    est = _est(gpu=24 * GiB, num_parallel=2, num_ctx=16384)
    f = est.facts
    assert (f["num_ctx"], f["num_parallel"], f["kv_cells"], f["flash_attention"]) == (16384, 2, 32768, True)
    lrun = make_run(
        engine="llama.cpp",
        weights="gguf-Q4_K_M",
        batch=2,
        seq=16384,
        n_batch=f["num_batch"],
        n_ubatch=f["num_batch"],
        flash_attn=True,
        fit="on",
    )
    ref = estimate_inference(LLAMA8, lrun, 24 * GiB)
    assert [(c.key, c.bytes) for c in est.components] == [(c.key, c.bytes) for c in ref.components]
    assert next(c.bytes for c in est.components if c.key == "kv_cache") == 32 * 32768 * 2 * 8 * 128 * 2
    assert est.engine == "ollama" and f["llama_cpp_build"] == "b10488"


def test_num_gpu_is_passed_as_ngl_and_fit_places_the_rest() -> None:
    """llm/llama_server.go: -ngl only when num_gpu is set; otherwise llama-server's --fit."""
    set_ = _est(gpu=6 * GiB, num_gpu=10, num_ctx=8192)
    assert set_.facts["offloaded"] == "10/33" and set_.facts["layers_requested"] == 10
    # llama-server -ngl 10 holds the output layer and the last 9 blocks (src/llama-model.cpp load_tensors:
    # i_gpu_start = n_layer + 1 - n_gpu_layers); Ollama v0.12.10's own createGPULayers the last 10 blocks
    assert "9/32 layers + output" in set_.component("weights").label
    old = estimate_inference(
        LLAMA8, make_run(engine="ollama", ollama_version="0.12.10", weights="gguf-Q4_K_M", num_gpu=10)
    )
    assert "10/32 layers on GPU" in old.component("weights").label
    fit = _est(gpu=6 * GiB, num_ctx=8192)
    assert (
        10 < fit.facts["fit_n_gpu_layers"] < 33
        and fit.facts["offloaded"] == f"{fit.facts['fit_n_gpu_layers']}/33"
    )
    assert not runtime("ollama").admits(fit)  # layers on the CPU: not a fit
    assert runtime("ollama").admits(_est(gpu=24 * GiB))
    moe = _est(QWEN30, gpu=12 * GiB, num_ctx=4096)
    assert moe.facts["offloaded"] == "49/49" and moe.facts["fit_cpu_expert_layers"] > 0
    assert not runtime("ollama").admits(moe)  # experts in host memory: not a fit


def test_families_ollama_serves_one_request_at_a_time() -> None:
    """server/sched.go Scheduler.load: qwen35 (and lfm2, nemotron_h, qwen3next, ...) get numParallel 1."""
    est = _est(QWEN35, gpu=24 * GiB, num_parallel=4)
    assert est.facts["num_parallel"] == 1
    assert any("one request at a time" in w for w in est.warnings)
    assert _est(gpu=24 * GiB, num_parallel=4).facts["num_parallel"] == 4


def test_several_gpus() -> None:
    """server/sched.go selectLlamaServerPlacement: a model predicted within 80 % of one GPU loads there; one
    that needs several goes to all of them, where llama-server splits the layers (by free memory, equal on
    equal GPUs) or, when that leaves a GPU short of its target, its --fit fills them back to front."""
    one = _est(gpu=24 * GiB, pp=2, num_ctx=4096)
    assert any("on one of the 2 GPUs" in w for w in one.warnings) and len(one.per_gpu) == 1
    both = _est(gpu=24 * GiB, pp=2, num_ctx=4096, sched_spread=True)
    assert [s.index for s in both.per_gpu] == [0, 1] and both.facts["llama_split"] == "1,1"
    assert sum(s.peak_bytes for s in both.per_gpu) > one.peak_bytes  # a compute buffer on each
    big = load_model("meta-llama/Llama-3.1-70B-Instruct").spec
    fit = _est(big, gpu=24 * GiB, pp=2)  # 131072 tokens: 40 GiB of KV, so not every layer fits
    counts = [int(k) for k in fit.facts["llama_split"].split(",")]
    layers = sum(counts)
    assert fit.facts["offloaded"] == f"{layers}/81" and 0 < layers < 81
    free = 24 * GiB - context_bytes("auto", None)
    assert all(s.peak_bytes <= free - 1024 * MiB for s in fit.per_gpu)
    # one more layer on the last GPU (the first filled) would leave less than the target free there
    lrun = make_run(
        engine="llama.cpp",
        weights="gguf-Q4_K_M",
        seq=fit.facts["num_ctx"],
        n_batch=fit.facts["num_batch"],
        n_ubatch=fit.facts["num_batch"],
        n_gpu_layers=counts[1] + 1,
    )
    wb = run_weight_bytes(big, lrun, True)
    head = head_bytes(big, lrun, wb)
    # llama.cpp's layout (output layer counted first): the output layer and the counts[1] blocks before it
    last = gpu_share(big, lrun, wb, 1, range(80 - counts[1], 81), head, True)
    assert last.peak_bytes > free - 1024 * MiB
    # a MoE model whose experts must leave the GPUs: --fit's steps 3 and 4 (tests/test_llamacpp_split_fit.py)
    moe = _est(QWEN30, gpu=12 * GiB, pp=2, num_ctx=65536)
    assert moe.facts["offloaded"] == "49/49" and moe.facts["fit_cpu_expert_layers"] > 0
    assert all(s.peak_bytes <= free - 1024 * MiB for s in moe.per_gpu)


def test_the_command_and_the_fit_target() -> None:
    run = make_run(engine="ollama", ollama_version=NEW, weights="gguf-Q4_K_M", fit_target_mib=2048)
    cmd = runtime("ollama").command("meta-llama/Llama-3.1-8B", run, _est(fit_target_mib=2048))
    assert "LLAMA_ARG_FIT_TARGET=2048" in cmd and "ollama_version" not in cmd  # the default release
    old = make_run(engine="ollama", ollama_version="0.12.10", weights="gguf-Q4_K_M", fit_target_mib=2048)
    text = runtime("ollama").command("meta-llama/Llama-3.1-8B", old, _est())
    assert "LLAMA_ARG_FIT_TARGET" not in text and "ollama_version" in text.splitlines()[0]


def test_the_default_version_is_v0_30() -> None:
    """The releases users run (v0.30 and later launch llama-server) are the default; the help says so and
    why; v0.12.10 is named where a run means it (its command says the release is not in the command)."""
    assert InferenceRun().ollama_version == NEW
    assert make_run(engine="ollama").ollama_version == NEW
    ui = next(m for m in InferenceRun.model_fields["ollama_version"].metadata if isinstance(m, UI))
    assert ui.help.startswith("0.30+ (the default: ") and "0.12.10: an older Ollama" in ui.help
    assert "ollama_version" not in runtime("ollama").command(
        "meta-llama/Llama-3.1-8B", make_run(engine="ollama", weights="gguf-Q4_K_M"), _est()
    )


def test_kv_type_is_passed_on() -> None:
    q8 = _est(gpu=24 * GiB, kv_dtype="q8_0", num_ctx=8192)
    f16 = _est(gpu=24 * GiB, num_ctx=8192)
    kv = [next(c.bytes for c in e.components if c.key == "kv_cache") for e in (q8, f16)]
    assert kv[0] * 2 * 32 == kv[1] * 34  # q8_0: 34 B per 32 elements
    assert q8.facts["kv_cache_type"] == "q8_0"
    assert (
        runtime("ollama").kv_cache_dtype(
            LLAMA8, make_run(engine="ollama", ollama_version=NEW, kv_dtype="q8_0")
        )
        == "q8_0"
    )
    off = _est(gpu=24 * GiB, kv_dtype="q8_0", flash_attention="off")
    assert any("quantized V cache" in w for w in off.warnings)


HYBRIDS = [
    "Qwen/Qwen3-Next-80B-A3B-Instruct",
    "Qwen/Qwen3.5-9B",
    "Qwen/Qwen3.5-35B-A3B",
    "Qwen/Qwen3.6-35B-A3B",
    "LiquidAI/LFM2-700M",
    "LiquidAI/LFM2-8B-A1B",
    "ibm-granite/granite-4.0-h-small",
    "ibm-granite/granite-4.0-h-tiny",
    "nvidia/Nemotron-H-8B-Base-8K",
    "nvidia/NVIDIA-Nemotron-Nano-9B-v2",
    "tiiuae/Falcon-H1-7B-Instruct",
    "ai21labs/Jamba-v0.1",
    "moonshotai/Kimi-Linear-48B-A3B-Instruct",
    "MiniMaxAI/MiniMax-Text-01-hf",
]


@pytest.mark.parametrize("model", HYBRIDS)
def test_every_hybrid_is_sized_with_llama_cpps_recurrent_memory(model: str) -> None:
    """The hybrids Ollama v0.30+ runs through llama-server: the RS buffer (R and S, f32, one cell per slot)
    and the KV of the attention layers are the llama.cpp profile's for the same llama-server command."""
    spec = load_model(model).spec
    est = _est(spec, gpu=80 * GiB, num_ctx=8192)
    f = est.facts
    lrun = make_run(
        engine="llama.cpp",
        weights="gguf-Q4_K_M",
        seq=8192,
        n_batch=f["num_batch"],
        n_ubatch=f["num_batch"],
        fit="on",
        mla_cache="full" if spec.mla else "latent",
    )
    ref = estimate_inference(spec, lrun, 80 * GiB)
    assert f["rs_cells"] == 1 and (f["rs_r_bytes"], f["rs_s_bytes"]) == (
        ref.facts["rs_r_bytes"],
        ref.facts["rs_s_bytes"],
    )
    assert [(c.key, c.bytes) for c in est.components] == [(c.key, c.bytes) for c in ref.components]


def test_refusals_are_worded_per_version() -> None:
    mllama = load_model("meta-llama/Llama-3.2-11B-Vision-Instruct").spec
    with pytest.raises(GpumemInputError, match=r"ollama v0\.30\+: .*no mllama architecture") as e:
        _est(mllama)
    assert "\n" not in str(e.value)
    with pytest.raises(GpumemInputError, match=r"ollama v0\.12\.10: .*Go engine"):
        estimate_inference(mllama, make_run(engine="ollama", ollama_version="0.12.10", weights="gguf-Q4_K_M"))
    with pytest.raises(GpumemInputError, match=r"v0\.12\.10.*use ollama_version 0\.30\+"):
        estimate_inference(QWEN35, make_run(engine="ollama", ollama_version="0.12.10", weights="gguf-Q4_K_M"))
    minimax = load_model("MiniMaxAI/MiniMax-Text-01-hf").spec
    warns = _est(minimax, gpu=80 * GiB, num_ctx=4096).warnings
    assert any("b10488" in w and "not verified" in w for w in warns)


def test_the_fit_target_env_imports_the_llama_server_era() -> None:
    """LLAMA_ARG_FIT_TARGET is passed on to llama-server (llm/llama_server.go extraEnvsForStart): v0.30+."""
    from gpumem_gui.core.imports import import_command

    run = import_command("LLAMA_ARG_FIT_TARGET=3000 OLLAMA_CONTEXT_LENGTH=8192 ollama run llama3.1:8b").run
    assert (run.fit_target_mib, run.ollama_version, run.num_ctx) == (3000, "0.30+", 8192)
