"""Published llama.cpp KV and compute-buffer lines (validation/data/engine_logs/llamacpp.json, and the
llama.cpp buffer lines of validation/data/published_inference.json) against our llama.cpp estimate; and the
cache knobs -ctk/-ctv, --no-kv-offload, --swa-full and partial -ngl, whose buffers follow from the per-layer
row."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.catalog import find_model
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run
from gpumem_gui.core.runtimes.llamacpp import kv_buffers
from tests.conftest import reference_dir
from validation.validate_report.engine_logs import LogRow, engine_rows
from validation.validate_report.published import PUBLISHED, published_rows

MiB = 1 << 20
ROWS = engine_rows("llama.cpp")  # the comparison section (i) of docs/validation.md shows


def _lines(prefix: str) -> list:
    """Section (b)'s rows of the llama.cpp lines of validation/data/published_inference.json starting with
    ``prefix``."""
    entries = json.loads((reference_dir() / "published" / "published.json").read_text())
    ids = [m.id for m in PUBLISHED if m.run.get("engine") == "llama.cpp"]
    rows, _ = published_rows(entries, ids)
    return [r for r in rows if r.metric.startswith(prefix)]


def _kv_lines() -> list:
    return _lines("KV self size")


@pytest.mark.parametrize("row", ROWS, ids=[f"{r.point}:{r.metric}" for r in ROWS])
def test_published_llamacpp_lines_match(row: LogRow) -> None:
    """Widths exactly; buffer lines to the log's two decimals of MiB."""
    tol = 0 if row.unit == "elements" else 0.005
    msg = f"{row.point} {row.metric}: log {row.published}, ours {row.ours}"
    assert abs(row.ours - row.published) <= tol, msg


def test_published_kv_buffers_stay_exact() -> None:
    lines = _kv_lines()
    assert len(lines) == 4, [r.source for r in lines]  # open_llama 7B, Llama-2-7B, Mixtral-8x7B, DeepSeek-V3
    for r in lines:
        assert r.ours == pytest.approx(r.measured, rel=1e-4), f"{r.source}: log {r.measured}, ours {r.ours}"


def _kv(**run: object) -> tuple[int, int]:
    spec = find_model("meta-llama/Llama-2-7b-hf").spec
    r = make_run(engine="llama.cpp", weights="gguf-Q4_K_M", seq=2048, **run)
    n = spec.num_layers if r.n_gpu_layers < 0 else r.n_gpu_layers
    return kv_buffers(spec, r, n)


def test_separate_k_and_v_types() -> None:
    """-ctk q8_0 -ctv f16: K rows at 34/32 B per element, V at 2 B (1024 MiB for f16/f16 at n_ctx 2048)."""
    gpu, host = _kv(cache_type_k="q8_0", cache_type_v="f16")
    assert host == 0
    assert gpu == 32 * 2048 * 4096 * (34 / 32 + 2)
    assert _kv(kv_dtype="f16")[0] == 1024 * MiB


def test_layers_left_on_the_cpu_keep_their_kv_in_host_memory() -> None:
    gpu, host = _kv(n_gpu_layers=20)
    assert (gpu, host) == (20 * 32 * MiB, 12 * 32 * MiB)
    assert _kv(kv_offload=False) == (0, 1024 * MiB)


def test_quantized_v_needs_flash_attention() -> None:
    spec = find_model("meta-llama/Llama-2-7b-hf").spec
    run = make_run(engine="llama.cpp", weights="gguf-Q4_K_M", cache_type_v="q4_0", flash_attn=False)
    assert any(w.startswith("cache_type_v:") for w in estimate_inference(spec, run).warnings)
    fa = make_run(engine="llama.cpp", weights="gguf-Q4_K_M", cache_type_v="q4_0")
    assert not any(w.startswith("cache_type_v:") for w in estimate_inference(spec, fa).warnings)
    with pytest.raises(GpumemInputError, match="cache_type_k"):
        estimate_inference(spec, make_run(engine="llama.cpp", weights="gguf-Q4_K_M", cache_type_k="int3"))


def test_command_spells_k_and_v_types_and_nkvo() -> None:
    from gpumem_gui.core.runtimes.inference import runtime

    spec = find_model("meta-llama/Llama-2-7b-hf").spec
    run = make_run(engine="llama.cpp", weights="gguf-Q4_K_M", cache_type_k="q8_0", kv_offload=False)
    cmd = runtime("llama.cpp").command("llama-2-7b", run, estimate_inference(spec, run))
    assert "-ctk q8_0 -ctv f16" in cmd  # -ctv: the KV cache field (auto = llama.cpp's own f16)
    assert cmd.endswith("-nkvo")


# ---- the compute buffer (runtimes/llamacpp_compute.py) -----------------------------------------------------


def _estimate(model: str, **run: object):
    spec = find_model(model).spec
    return spec, estimate_inference(spec, make_run(engine="llama.cpp", **run))


def _compute(est) -> int:
    return est.component("compute_buffer").bytes


def test_without_flash_attention_the_scores_share_their_softmax_and_the_masks_stay() -> None:
    """llama.cpp without -fa over 8192 cells (published Ollama #8310 log, llama.cpp's context): kq 8192 x
    512 x 24 heads x 4 B = 384 MiB (the softmax in place: ggml-alloc.c ggml_op_can_inplace(GGML_OP_SOFT_MAX)),
    the f32 mask 8192 x pad(512, 64) x 4 B = 16 MiB and 4 rows of 512 x 3072 x 4 B: 424.00 MiB."""
    _, est = _estimate(
        "meta-llama/Llama-3.2-3B", weights="gguf-Q4_K_M", seq=2048, batch=4, flash_attn=False, n_batch=512
    )
    assert _compute(est) == (384 + 16 + 4 * 6) * MiB
    assert est.component("compute_buffer").explain.inputs["stage"] == "attention"


def test_the_open_llama_compute_line_is_exact() -> None:
    """open_llama 7B F16, n_ctx 2048, no flash attention: CUDA0 compute buffer size = 164.00 MiB = kq 128 +
    mask 4 + 4 rows of 8 MiB (published_inference.json, inf-llamacpp-openllama7b-f16)."""
    (row,) = [r for r in _lines("CUDA0 compute buffer size") if "openllama" in r.source]
    assert row.ours == row.measured == 164 * MiB


def test_with_flash_attention_no_scores_nor_masks() -> None:
    _, est = _estimate("meta-llama/Llama-3.2-3B", weights="gguf-Q4_K_M", seq=8192)
    assert _compute(est) == 512 * 128256 * 4 + 512 * 3072 * 4  # the output stage, as the 256.50 MiB log


# the output weight of Llama-3.1-8B in a Q4_K_M GGUF: token_embd's shape in Q6_K (210 B per 256 elements,
# ggml-common.h block_q6_K; llama-quantize keeps output.weight at Q6_K) and the f32 output norm
_Q6K_OUTPUT = 128256 * 4096 // 256 * 210 + 4096 * 4


def test_output_layer_in_host_memory_is_copied_to_the_gpu_for_a_large_batch() -> None:
    """-ngl counts the output layer first (src/llama-model.cpp load_tensors: i_gpu_start = n_layer + 1 -
    n_gpu_layers): -ngl 20 of 32 holds the output layer and the last 19 blocks, so the GPU runs the logits
    from its own output weight; -ngl 0 leaves the output layer in host memory, and ggml_backend_sched runs its
    matmul on the GPU for a micro-batch of at least 32 tokens (op offload, llama.cpp PR #6083): the GPU's
    compute buffer holds the copied output weight, the logits and a row."""
    logits = 512 * 128256 * 4 + 512 * 4096 * 4
    _, part = _estimate("meta-llama/Llama-3.1-8B", weights="gguf-Q4_K_M", seq=4096, n_gpu_layers=20)
    assert part.facts["offloaded_layers"] == 19 and "19/32 layers + output" in part.component("weights").label
    assert _compute(part) == logits
    _, none = _estimate("meta-llama/Llama-3.1-8B", weights="gguf-Q4_K_M", seq=4096, n_gpu_layers=0)
    assert none.facts["offloaded_layers"] == 0 and none.component("weights").bytes == 0
    assert _compute(none) == _Q6K_OUTPUT + logits
    _, full = _estimate("meta-llama/Llama-3.1-8B", weights="gguf-Q4_K_M", seq=4096)
    assert _compute(full) == logits  # every layer on the GPU: the output weight is in the model buffer


def test_output_layer_in_host_memory_below_the_op_offload_batch_runs_on_the_cpu() -> None:
    """-ngl 0, -ub 16 (< 32, ggml-cuda.cu offload_op): the output stage runs on the CPU, in the host compute
    buffer; the GPU's is the largest of its own stages (FFN: 2 x 16 x 14336 x 4 B + 2 rows)."""
    _, est = _estimate(
        "meta-llama/Llama-3.1-8B", weights="gguf-Q4_K_M", seq=4096, n_gpu_layers=0, n_ubatch=16
    )
    assert _compute(est) == 2 * 16 * 14336 * 4 + 2 * 16 * 4096 * 4
    assert est.component("compute_buffer").explain.inputs["stage"] == "ffn"


# ---- --swa-full ------------------------------------------------------------------------------------------


def test_swa_full_gives_sliding_layers_the_whole_context() -> None:
    """Gemma 3 27B at n_ctx 32768: 52 sliding layers (window 1024) keep pad(1024 + 512, 256) = 1536 cells,
    10 full layers 32768, at 16 KV heads x 128 x 2 (K, V) x 2 B per cell and layer; --swa-full gives the
    sliding layers n_ctx cells too (src/llama-kv-cache-iswa.cpp: size_swa = size_base)."""
    spec = find_model("google/gemma-3-27b-it").spec
    row = 16 * 128 * 2 * 2
    run = make_run(engine="llama.cpp", weights="gguf-Q4_K_M", seq=32768, kv_dtype="f16")
    assert kv_buffers(spec, run, spec.num_layers) == ((52 * 1536 + 10 * 32768) * row, 0)
    full = run.model_copy(update={"swa_full": True})
    assert kv_buffers(spec, full, spec.num_layers) == (62 * 32768 * row, 0)
    assert estimate_inference(spec, full).kv_cache_bytes == 62 * 32768 * row


def test_swa_full_is_read_from_a_launch_command_and_written_back() -> None:
    from gpumem_gui.core import import_command
    from gpumem_gui.core.runtimes.inference import runtime

    imp = import_command("llama-server -m gemma-3-27b-it-Q4_K_M.gguf -c 32768 --swa-full")
    assert imp.run.swa_full is True
    assert not any("--swa-full" in w for w in imp.warnings)
    spec = find_model("google/gemma-3-27b-it").spec
    cmd = runtime("llama.cpp").command("gemma-3-27b-it", imp.run, estimate_inference(spec, imp.run))
    assert cmd.endswith("--swa-full")
    assert import_command(cmd).run.swa_full is True


# ---- a tied embedding --------------------------------------------------------------------------------------

_TOKEN_EMBD = 128256 * 3072 // 256 * 210  # Llama 3.2 3B's token_embd in Q6_K: the published 308.23 MiB


def test_tied_output_is_a_gpu_copy_only_with_the_output_layer() -> None:
    """Llama 3.2 3B (tied): every layer offloaded, the output layer is token_embd's duplicate on the GPU and
    token_embd stays in host memory (published: CPU 308.23 MiB, CUDA0 1918.35 MiB, the llama.cpp data's
    Llama 3.2 3B point). -ngl 28 of 28 blocks keeps the output layer (counted first: i_gpu_start = n_layer +
    1 - n_gpu_layers) and its copy on the GPU and leaves block 0 in host memory; -ngl 0 leaves the output
    layer in host memory too, where the duplicate maps token_embd's file range: the host holds the file once
    (src/llama-model.cpp load_tensors: output = create_tensor(tok_embd's name, TENSOR_DUPLICATED))."""
    _, full = _estimate("meta-llama/Llama-3.2-3B", weights="gguf-Q4_K_M", seq=2048)
    _, part = _estimate("meta-llama/Llama-3.2-3B", weights="gguf-Q4_K_M", seq=2048, n_gpu_layers=28)
    _, none = _estimate("meta-llama/Llama-3.2-3B", weights="gguf-Q4_K_M", seq=2048, n_gpu_layers=0)
    w_full, w_part = full.component("weights").bytes, part.component("weights").bytes
    assert full.facts["cpu_bytes"] == _TOKEN_EMBD
    assert part.facts["offloaded_layers"] == 27 and 0 < w_full - w_part < _TOKEN_EMBD
    assert part.facts["cpu_bytes"] == _TOKEN_EMBD + (w_full - w_part)  # block 0
    assert none.component("weights").bytes == 0
    assert none.facts["cpu_bytes"] == w_full  # the file: the GPU's copy gone, token_embd once
