"""What SGLang reserves for a multimodal model's vision path (gpumem_gui/core/runtimes/sglang_mm.py): no
profiling forward, its default mem_fraction_static times adjust_mem_fraction_for_vlm's factor
(python/sglang/srt/server_args.py, sgl-project/sglang PR #6881; issue #18010 names the reserve "space for the
vlm encoder"), at the byte."""

from __future__ import annotations

import pytest

from gpumem_gui.core.readers.catalog import find_gpu, find_model
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run
from gpumem_gui.core.runtimes.sglang_defaults import server_defaults
from gpumem_gui.core.runtimes.sglang_mm import vlm_fraction_factor
from gpumem_gui.core.spec.model import ModelSpec

H100 = find_gpu("H100-SXM-80GB").gpu_memory


def _spec(name: str) -> ModelSpec:
    entry = find_model(name)
    assert entry is not None, name
    return entry.spec


def _factor(layers: int, hidden: int) -> float:
    """server_args.py adjust_mem_fraction_for_vlm, written out: 0.95 x clamp(1 - 0.1 x (ratio - 1))."""
    ratio = layers * hidden * hidden / (24 * 1024 * 1024)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


@pytest.mark.parametrize(
    ("model", "layers", "hidden"),
    [
        # Qwen2_5_VLVisionConfig / Qwen3VLVisionConfig name their depth "depth": SGLang's getattr default, 24
        ("Qwen/Qwen2.5-VL-7B-Instruct", 24, 1280),
        ("Qwen/Qwen3-VL-8B-Instruct", 24, 1152),
        # SiglipVisionConfig (Gemma 3): 27 x 1152; PixtralVisionConfig: 24 x 1024 (the baseline);
        # Llama4VisionConfig: 34 x 1408
        ("google/gemma-3-27b-it", 27, 1152),
        ("mistralai/Mistral-Small-3.1-24B-Instruct-2503", 24, 1024),
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 34, 1408),
    ],
)
def test_factor_of_each_tower(model: str, layers: int, hidden: int) -> None:
    assert vlm_fraction_factor(_spec(model)) == pytest.approx(_factor(layers, hidden), rel=1e-12)


def test_worked_values_and_the_clamp() -> None:
    """Qwen2.5-VL: 1280^2 / 1024^2 = 1.5625, 0.95 x (1 - 0.05625) = 0.8965625; Pixtral's ViT-L size: 0.95; a
    tower four times Llama 4's clamps at 0.95 x 0.8 = 0.76; a text model: 1."""
    assert vlm_fraction_factor(_spec("Qwen/Qwen2.5-VL-7B-Instruct")) == pytest.approx(0.8965625, abs=1e-12)
    assert vlm_fraction_factor(_spec("mistralai/Mistral-Small-3.1-24B-Instruct-2503")) == 0.95
    scout = _spec("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    assert scout.vision is not None and scout.vision.tower is not None
    big = scout.vision.tower.model_copy(update={"config_layers": 4 * 34})
    huge = scout.model_copy(update={"vision": scout.vision.model_copy(update={"tower": big})})
    assert vlm_fraction_factor(huge) == pytest.approx(0.76, abs=1e-12)
    assert vlm_fraction_factor(_spec("Qwen/Qwen3-8B")) == 1.0


def test_the_default_fraction_only() -> None:
    """SGLang lowers only its own default (server_args.py: inside ``if self.mem_fraction_static is None``):
    on an H100 the default is round((gpu - reserved) / gpu, 3) x factor, and the KV pool shrinks with it; a
    fraction set by the run is kept as it is."""
    spec = _spec("Qwen/Qwen2.5-VL-7B-Instruct")
    run = make_run(engine="sglang", seq=4096)
    text = server_defaults(run, H100.driver_bytes)
    vlm = server_defaults(run, H100.driver_bytes, 0.8965625)
    assert vlm.mem_fraction_static == text.mem_fraction_static * 0.8965625
    assert "adjust_mem_fraction_for_vlm" in vlm.explain()
    est = estimate_inference(spec, run, capacity=H100)
    assert est.facts["mem_fraction_static"] == pytest.approx(vlm.mem_fraction_static)
    fixed = estimate_inference(spec, make_run(engine="sglang", seq=4096, mem_fraction_static=0.8), H100)
    assert fixed.facts["mem_fraction_static"] == 0.8


def test_a_tower_whose_sizes_are_not_read_warns() -> None:
    """Llama 3.2 Vision's tower is not replayed (its vision config's sizes are not kept): the default is not
    lowered, and the estimate says so; with the fraction set by the run nothing is missing."""
    spec = _spec("meta-llama/Llama-3.2-11B-Vision-Instruct")
    assert vlm_fraction_factor(spec) is None
    est = estimate_inference(spec, make_run(engine="sglang", seq=4096), capacity=H100)
    assert any("adjust_mem_fraction_for_vlm" in w for w in est.warnings)
    fixed = estimate_inference(spec, make_run(engine="sglang", seq=4096, mem_fraction_static=0.8), H100)
    assert not any("adjust_mem_fraction_for_vlm" in w for w in fixed.warnings)
