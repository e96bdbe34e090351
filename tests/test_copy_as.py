"""Which engine's own command can express a run (``Runtime.expresses``), and Edit > Copy as: an engine that
cannot load the model in the run's format is a disabled entry whose tooltip says why."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QMenu

from gpumem_gui.core.imports import import_command
from gpumem_gui.core.imports.ollama import import_modelfile
from gpumem_gui.core.readers.loader import load_model
from gpumem_gui.core.runtimes.inference import RUNTIMES, InferenceRun, estimate_inference, make_run, runtime
from gpumem_gui.ui.main_window import MainWindow

SPEC = load_model("meta-llama/Llama-3.1-8B").spec


def _why(engine: str, weights: str, source: str) -> str | None:
    return runtime(engine).expresses(SPEC, make_run(engine=engine, weights=weights), source)


@pytest.mark.parametrize(
    ("engine", "weights", "source", "ok"),
    [
        ("llama.cpp", "bf16", "meta-llama/Llama-3.1-8B", False),  # safetensors: no llama.cpp command
        # no GGUF repository: no file for llama-server to load (issue 33: -m meta-llama/Llama-3.1-8B.gguf)
        ("llama.cpp", "gguf-Q4_K_M", "meta-llama/Llama-3.1-8B", False),
        ("llama.cpp", "gguf-Q4_K_M", "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF", True),  # -hf <repo>:Q4_K_M
        ("llama.cpp", "gguf-Q4_K_M-pure", "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF", False),  # not a type
        ("llama.cpp", "gguf-Q4_K_M", "/models/llama-3.1-8b.Q8_0.gguf", False),  # the file holds its own types
        ("llama.cpp", "file", "/models/llama-3.1-8b.Q4_K_M.gguf", True),
        ("llama.cpp", "file", "/models/llama-3.1-8b", False),  # a safetensors folder
        ("ollama", "bf16", "meta-llama/Llama-3.1-8B", False),
        ("ollama", "gguf-Q4_K_M", "meta-llama/Llama-3.1-8B", True),  # llama3.1:8b
        ("ollama", "gguf-Q4_K_M", "someone/private-model", False),  # no tag, not a GGUF repository
        ("ollama", "gguf-Q4_K_M", "bartowski/Some-Model-GGUF", True),  # hf.co/<repo>:<type>
        ("ollama", "gguf-Q4_K_M", "/models/llama-3.1-8b", False),
        ("ollama", "file", "/models/llama-3.1-8b.Q4_K_M.gguf", True),  # FROM in a Modelfile
        ("vllm", "bf16", "meta-llama/Llama-3.1-8B", True),
        ("vllm", "gguf-Q4_K_M", "meta-llama/Llama-3.1-8B", False),
        ("vllm", "fp8", "meta-llama/Llama-3.1-8B", True),  # --quantization fp8 (online)
        ("vllm", "nf4", "meta-llama/Llama-3.1-8B", True),  # --quantization bitsandbytes (online)
        ("vllm", "fp32", "meta-llama/Llama-3.1-8B", False),  # cast to --dtype (bf16 here)
        ("vllm", "gptq-4", "meta-llama/Llama-3.1-8B", False),  # needs a GPTQ checkpoint
        ("sglang", "gguf-Q4_K_M", "meta-llama/Llama-3.1-8B", False),
        ("transformers", "file", "/models/llama-3.1-8b.Q4_K_M.gguf", False),
        ("transformers", "nf4", "meta-llama/Llama-3.1-8B", True),
    ],
)
def test_expresses(engine: str, weights: str, source: str, ok: bool) -> None:
    why = _why(engine, weights, source)
    assert (why is None) == ok, why
    if why is not None:
        assert "\n" not in why and len(why) < 200


def test_every_runtime_answers() -> None:
    for name, rt in RUNTIMES.items():
        fmt = rt.formats()[0].id
        compute = fmt if fmt in ("bf16", "fp16", "fp32") else "bf16"  # servers load float weights in --dtype
        run = make_run(engine=name, weights=fmt, compute_dtype=compute)
        # Ollama and llama.cpp pull GGUF files: this is no GGUF repository
        assert rt.expresses(SPEC, run, "meta-llama/Llama-3.1-8B") is None or name in ("ollama", "llama.cpp")


def test_ollama_gguf_file_command_reads_back() -> None:
    run = make_run(engine="ollama", weights="file", num_ctx=8192)
    est = estimate_inference(SPEC, make_run(engine="ollama", weights="gguf-Q4_K_M", num_ctx=8192))
    text = runtime("ollama").command("/models/My Llama.Q4_K_M.gguf", run, est)
    lines = text.splitlines()
    assert lines[1] == "printf 'FROM %s\\n' '/models/My Llama.Q4_K_M.gguf' > Modelfile"
    assert (
        lines[2] == "ollama create my-llama.q4_k_m -f Modelfile" and lines[3] == "ollama run my-llama.q4_k_m"
    )
    assert "OLLAMA_CONTEXT_LENGTH=8192" in lines[0]
    back = import_modelfile("FROM /models/llama.Q4_K_M.gguf")  # a Modelfile such a command writes
    assert back.run.weights == "file" and back.model == "/models/llama.Q4_K_M.gguf"


@pytest.mark.no_qt_log
@pytest.mark.usefixtures("qt_warnings_fail")
def test_copy_as_menu_disables_what_cannot_load(main_window: MainWindow, qtbot) -> None:
    w = main_window
    w.imports.apply_command("vllm serve Qwen/Qwen3-8B --max-model-len 8192")
    qtbot.waitUntil(lambda: w.model is not None and w.model.source == "Qwen/Qwen3-8B", timeout=5000)
    qtbot.waitUntil(lambda: w.estimate is not None, timeout=5000)
    w.recompute_now()
    w.flush_background()
    entries = {label: (text, why) for label, text, why in w.imports.commands()}
    llama = next(v for k, v in entries.items() if k.startswith("llama.cpp"))
    assert llama[0] is None and "GGUF" in llama[1]
    vllm = next(v for k, v in entries.items() if k.startswith("vLLM"))
    assert vllm[0] is not None
    menu = QMenu(w)
    w.imports.fill_copy_menu(menu)
    act = {a.text(): a for a in menu.actions()}
    llama_act = next(a for t, a in act.items() if t.startswith("llama.cpp"))
    assert not llama_act.isEnabled() and "GGUF" in llama_act.toolTip()
    ollama_act = next(a for t, a in act.items() if t.startswith("Ollama"))
    assert not ollama_act.isEnabled() and ollama_act.toolTip()
    assert next(a for t, a in act.items() if t.startswith("vLLM")).isEnabled()


@pytest.mark.no_qt_log
@pytest.mark.usefixtures("qt_warnings_fail")
def test_copy_as_vllm_reads_back_as_the_run_on_screen(main_window: MainWindow, qtbot) -> None:
    """Issue 33: the copied vLLM command kept --kv-cache-dtype but dropped --quantization and --dtype, so
    pasting it back changed the estimate; each entry is also that engine's own command for the run."""
    w = main_window
    w.imports.apply_command(
        "vllm serve Qwen/Qwen3-8B --max-model-len 8192 --quantization fp8 --dtype float16 "
        "--kv-cache-dtype fp8_e4m3"
    )
    qtbot.waitUntil(lambda: w.model is not None and w.model.source == "Qwen/Qwen3-8B", timeout=5000)
    qtbot.waitUntil(lambda: w.estimate is not None, timeout=5000)
    w.recompute_now()
    w.flush_background()
    entries = {label: text for label, text, _ in w.imports.commands()}
    text = next(t for k, t in entries.items() if k.startswith("vLLM"))
    assert text is not None
    back = import_command(text).run
    assert isinstance(w.run, InferenceRun)
    for field in ("weights", "compute_dtype", "kv_dtype", "max_model_len", "gpu_memory_utilization", "tp"):
        assert getattr(back, field) == getattr(w.run, field), field
    sglang = next(t for k, t in entries.items() if k.startswith("SGLang"))
    assert sglang is not None and "--quantization fp8" in sglang and "--dtype float16" in sglang
