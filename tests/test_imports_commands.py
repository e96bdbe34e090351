"""Bring your own command: every published launch command in tests/data/imports/commands.json (each with its
source) parses to the run the forms would build, options not modelled are named in warnings, and a malformed
command is one line naming the argument position (argument 0 is the program)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumem_gui.core import GpumemInputError, import_command, load_model
from gpumem_gui.core.imports import command_parsers, split_command

DATA = Path(__file__).parent / "data" / "imports"


# ---------------------------------------------------------------------------------------------- commands

# the published commands in commands.json (each with its source), and the fields each must set
PUBLISHED = {c["id"]: c for c in json.loads((DATA / "commands.json").read_text(encoding="utf-8"))}
EXPECT: dict[str, tuple[str, dict[str, object]]] = {
    "vllm-openai-tp4": ("facebook/opt-13b", {"engine": "vllm", "tp": 4}),
    "vllm-api-server-tp4": ("facebook/opt-13b", {"engine": "vllm", "tp": 4}),
    "vllm-serve-tp4": ("meta-llama/Llama-70B-Instruct", {"tp": 4}),
    "vllm-serve-tp16-pp1": ("meta-llama/Llama-405B-Instruct", {"tp": 16, "pp": 1}),
    "vllm-issue-13267": (
        "cognitivecomputations/DeepSeek-R1-AWQ",
        {
            "tp": 8,
            "max_model_len": 65536,
            "seq": 65536,
            "weights": "file",
            "kv_dtype": "fp8_e5m2",
            "gpu_memory_utilization": 0.97,
        },
    ),
    "vllm-issue-22177": (
        "/models/Qwen3-Coder-30B-A3B-Instruct",
        {"tp": 8, "ep": 8, "gpu_memory_utilization": 0.85},
    ),
    "vllm-issue-2248": (
        "/models/deepseek-coder-33b-instruct",
        {"tp": 2, "compute_dtype": "fp16", "dtype_weights": ("fp16", "--dtype float16")},
    ),
    "vllm-recipes-pr-12": (
        "/tmp/model/Qwen3-Coder-480B-A35B-Instruct-FP8",
        {"ep": 1, "gpu_memory_utilization": 0.95},
    ),
    "llama-server-quickstart": (
        "models/7B/ggml-model.gguf",
        {"engine": "llama.cpp", "seq": 2048, "batch": 1},
    ),
    "llama-server-windows": ("models\\7B\\ggml-model.gguf", {"engine": "llama.cpp", "seq": 2048}),
    "llama-server-parallel1": ("model.gguf", {"seq": 65536, "batch": 1, "n_gpu_layers": 99}),
    "llama-serve-hf": ("ggml-org/Qwen3.5-0.8B-GGUF", {"engine": "llama.cpp"}),
    "llama-bench-models": ("models/7B/ggml-model-q4_0.gguf", {"seq": 512, "new_tokens": 0}),
    "llama-completion-termux": (
        "/data/data/com.termux/files/home/storage/downloads/Qwen_Qwen3-4B-Instruct-2507-Q4_K_M.gguf",
        {"seq": 768, "flash_attn": True, "n_gpu_layers": 0, "n_batch": 512},
    ),
}


@pytest.mark.parametrize("ident", sorted(EXPECT))
def test_published_commands(ident: str) -> None:
    model, fields = EXPECT[ident]
    imp = import_command(PUBLISHED[ident]["command"])
    assert imp.model == model
    assert imp.mode == "inference"
    for name, value in fields.items():
        assert getattr(imp if name == "dtype_weights" else imp.run, name) == value, name


def test_every_published_command_parses_and_has_a_source() -> None:
    for ident, c in PUBLISHED.items():
        assert c["source"], ident
        import_command(c["command"])  # the other engines' entries too: no error


def test_a_full_vllm_command() -> None:
    imp = import_command(
        "vllm serve Qwen/Qwen3-8B -tp 2 --max-model-len 32768 --gpu-memory-utilization 0.85 --enforce-eager "
        "--kv-cache-dtype fp8 --max-num-seqs 128 --max-num-batched-tokens 4096 --dtype bfloat16"
    )
    expect = {
        "tp": 2, "max_model_len": 32768, "seq": 32768, "gpu_memory_utilization": 0.85, "enforce_eager": True,
        "kv_dtype": "fp8", "max_num_seqs": 128, "max_num_batched_tokens": 4096, "compute_dtype": "bf16",
    }  # fmt: skip
    for name, value in expect.items():
        assert getattr(imp.run, name) == value, name
    # --dtype is the weights' dtype once the checkpoint is known to be unquantized (test_imports_dtype.py)
    m = load_model("Qwen/Qwen3-8B")
    assert imp.with_model(m.spec, m.checkpoint_quantization).run.weights == "bf16"


def test_a_full_llama_server_command() -> None:
    imp = import_command(
        "llama-server -m m.gguf -c 16384 -np 4 -ngl 99 -fa off -ctk q8_0 -ctv q4_0 -b 4096 -ub 1024"
    )
    run = imp.run
    assert (run.seq, run.batch, run.n_gpu_layers, run.flash_attn) == (4096, 4, 99, False)
    assert (run.n_batch, run.n_ubatch) == (4096, 1024)
    assert (getattr(run, "cache_type_k", "q8_0"), getattr(run, "cache_type_v", "q4_0")) == ("q8_0", "q4_0")


def test_vllm_every_unmapped_option_is_named() -> None:
    imp = import_command(
        "vllm serve Qwen/Qwen3-8B --cpu-offload-gb 4 --speculative-config '{}' --frobnicate 3 --port 9000"
    )
    text = " | ".join(imp.warnings)
    for option in ("--cpu-offload-gb 4", "--speculative-config", "--frobnicate 3"):
        assert option in text
    assert "--port" not in text  # a server option: printed back as "no effect", not a warning
    assert any(w == "--port 9000" for w, _ in imp.read_as)


def test_config_format_mistral_is_named() -> None:
    """vLLM builds a --config-format mistral run from params.json (transformers_utils/configs/mistral.py),
    whose max_model_len default is not config.json's: a warning, not a silent 'no effect'."""
    imp = import_command(
        "vllm serve mistralai/Mistral-Small-3.1-24B-Instruct-2503 --tokenizer-mode mistral "
        "--config-format mistral --load-format mistral"
    )
    assert any(w.startswith("--config-format mistral: vLLM reads params.json") for w in imp.warnings)
    assert not any("--load-format" in w or "--tokenizer-mode" in w for w in imp.warnings)
    imp = import_command("vllm serve Qwen/Qwen3-8B --config-format hf")
    assert not imp.warnings
    assert ("--config-format hf", "loading option: no effect on GPU memory") in imp.read_as


def test_vllm_human_readable_length_and_model_default() -> None:
    assert import_command("vllm serve X --max-model-len 32k").run.max_model_len == 32000
    assert import_command("vllm serve X --max-model-len 32K").run.max_model_len == 32768
    imp = import_command("vllm serve Qwen/Qwen3-8B")
    assert imp.from_model  # no --max-model-len: vLLM's default is the model's own context length
    filled = imp.with_model(load_model("Qwen/Qwen3-8B").spec)
    assert filled.run.max_model_len == load_model("Qwen/Qwen3-8B").spec.max_position_embeddings
    assert any("max_position_embeddings" in meaning for _, meaning in filled.read_as)


def test_vllm_quantization_and_expert_parallel() -> None:
    imp = import_command("vllm serve Qwen/Qwen3-30B-A3B -tp 4 --enable-expert-parallel --quantization fp8")
    assert (imp.run.ep, imp.run.weights) == (4, "fp8")
    assert import_command("vllm serve x/y-AWQ --quantization awq").run.weights == "file"


def test_llamacpp_context_defaults_to_the_model() -> None:
    imp = import_command("llama-server -hf ggml-org/gemma-3-1b-it-GGUF -np 2")
    assert imp.model == "ggml-org/gemma-3-1b-it-GGUF"
    assert [f for f, *_ in imp.from_model] == ["seq"]
    spec = load_model("google/gemma-3-1b-it").spec
    assert imp.with_model(spec).run.seq == spec.max_position_embeddings // 2


def test_environment_assignments_and_continuations() -> None:
    words, env = split_command(
        "CUDA_VISIBLE_DEVICES=0,1 VLLM_USE_V1=1 \\\n  vllm serve m \\\n  -tp 2  # two GPUs"
    )
    assert words == ["vllm", "serve", "m", "-tp", "2"]
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1", "VLLM_USE_V1": "1"}
    imp = import_command("$ VLLM_USE_V1=1 vllm serve m -tp 2")
    assert imp.run.tp == 2 and imp.run.vllm_engine == "v1"  # read (--vllm-engine), not warned about
    assert not any("VLLM_USE_V1" in w for w in imp.warnings)
    assert any("VLLM_ENABLE_X=1" in w for w in import_command("VLLM_ENABLE_X=1 vllm serve m").warnings)


@pytest.mark.parametrize(
    ("text", "start"),
    [
        ("vllm serve Qwen/Qwen3-8B -tp 2 --max-model-len abc", "argument 5 '--max-model-len': "),
        ("vllm serve m -tp 0", "argument 3 '-tp': "),
        ("vllm serve m --gpu-memory-utilization 1.5", "argument 3 '--gpu-memory-utilization': "),
        ("vllm serve m --kv-cache-dtype int3", "argument 3 '--kv-cache-dtype': "),
        ("vllm serve m --max-num-seqs", "argument 3 '--max-num-seqs': needs a value"),
        ("llama-server -m x.gguf -c lots", "argument 3 '-c': "),
        ("llama-server -m x.gguf -ctk q3_z", "argument 3 '-ctk': "),
        ("llama-server -m x.gguf -b 256 -ub 512", "argument 5 '-ub': "),
        ("frobnicate --fast", "argument 0 'frobnicate': not a launch command"),
        ("vllm serve m | tee log", "argument 3 '|': "),
        ('vllm serve "m', "the command cannot be split"),
        ("", "the command is empty"),
    ],
)
def test_bad_commands_name_the_position(text: str, start: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        import_command(text)
    assert str(e.value).startswith(start), str(e.value)
    assert "\n" not in str(e.value)


def test_every_runtime_has_a_parser() -> None:
    names = {p.name for p in command_parsers()}
    assert {"vLLM", "llama.cpp"} <= names
