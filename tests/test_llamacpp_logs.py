"""Published llama.cpp KV lines (validation/data/engine_logs/llamacpp.json, and the llama.cpp KV buffer
lines of validation/data/published_inference.json) against our llama.cpp estimate; and the cache knobs
-ctk/-ctv, --no-kv-offload and partial -ngl, whose buffers follow from the per-layer row."""

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


def _kv_lines() -> list:
    """Section (b)'s rows of the llama.cpp KV buffer lines of validation/data/published_inference.json."""
    entries = json.loads((reference_dir() / "published" / "published.json").read_text())
    ids = [m.id for m in PUBLISHED if m.run.get("engine") == "llama.cpp"]
    rows, _ = published_rows(entries, ids)
    return [r for r in rows if r.metric.startswith("KV self size")]


@pytest.mark.parametrize("row", ROWS, ids=[f"{r.point}:{r.metric}" for r in ROWS])
def test_kv_row_widths_match_the_log(row: LogRow) -> None:
    assert row.ours == row.published, f"{row.point} {row.metric}: log {row.published}, ours {row.ours}"


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
