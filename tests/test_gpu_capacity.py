"""Issue 33 item 5: each catalog GPU has two totals, nvidia-smi's and CUDA's, each with its source, and each
engine reads the one its own code reads (vLLM's budget, SGLang's pool and Ollama's placement: CUDA's; SGLang's
GPU-size defaults: nvidia-smi's; fit verdicts: CUDA's, what a process can allocate). ``--local`` and the
cluster derive CUDA's total from NVML / DCGM (the total less the driver's reserve)."""

from __future__ import annotations

import json
import re

import pytest

from gpumem_gui.cli import main
from gpumem_gui.core import GpuMemory, GpuTarget, driver_gpu_memory, fit_report, gpu_target_from_text
from gpumem_gui.core.fit import verdicts
from gpumem_gui.core.readers.catalog import (
    derived_cuda_bytes,
    find_gpu,
    load_gpu_catalog,
    published_reserve_shares,
)
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run
from gpumem_gui.core.runtimes.sglang_pool import SGLANG_PRELOAD_BYTES
from gpumem_gui.core.units import GiB, MiB
from gpumem_gui.hardware.cluster import cluster_gpus
from gpumem_gui.hardware.snapshot import GpuDevice, GpuSnapshot
from validation.validate_report.common import spec_for

LLAMA = "meta-llama/Llama-3.1-8B"
H100 = find_gpu("H100-SXM-80GB")


# ---- the catalog -------------------------------------------------------------------------------------------


def test_every_catalog_gpu_has_both_totals_with_their_sources() -> None:
    for g in load_gpu_catalog():
        assert 0.95 * g.memory_bytes <= g.cuda_memory_bytes <= g.memory_bytes, g.id
        assert g.cuda_memory_bytes % MiB == 0, g.id  # whole MiB, as torch and the rule give them
        if g.cuda_memory_kind == "published":  # a figure found in public files, named by its index ids
            assert re.search(r"\bids? \d{6,}", g.cuda_memory_source), g.id
        if g.vendor == "nvidia":  # the driver always keeps a reserve on NVIDIA cards
            assert g.cuda_memory_bytes < g.memory_bytes, g.id


def test_published_cuda_totals() -> None:
    # torch.cuda.get_device_properties total_memory (MiB) or torch's OOM "total capacity of X GiB"
    assert (H100.memory_bytes, H100.cuda_memory_bytes) == (81559 * MiB, 81089 * MiB)
    assert find_gpu("H200").cuda_memory_bytes == 143156 * MiB
    assert find_gpu("A100-80GB").cuda_memory_bytes == round(79.15 * GiB / MiB) * MiB
    assert find_gpu("RTX-4090").cuda_memory_bytes == round(23.64 * GiB / MiB) * MiB
    assert find_gpu("T4").cuda_memory_bytes == 15102 * MiB
    published = {g.id for g in load_gpu_catalog() if g.cuda_memory_kind == "published"}
    assert {"H100-SXM-80GB", "H100-PCIe-80GB", "H200-SXM-141GB", "A100-80GB", "A100-40GB", "L40S", "RTX-4090",
            "RTX-3090", "A10G", "T4", "V100-16GB", "MI300X"} <= published  # fmt: skip


def test_derived_entries_follow_the_rule_and_say_so() -> None:
    shares = published_reserve_shares()
    derived = [g for g in load_gpu_catalog() if g.cuda_memory_kind == "derived"]
    assert derived  # L4, H100 NVL, B300, ... have no published CUDA total
    for g in derived:
        assert g.cuda_memory_bytes == derived_cuda_bytes(g.memory_bytes, g.arch, shares)[0], g.id
        assert g.cuda_memory_source.startswith("derived: "), g.id
    # the Hopper share is the median of H100 SXM, H100 PCIe and H200's reserves
    nvl = find_gpu("H100-NVL-94GB")
    hopper = sorted(1 - find_gpu(i).cuda_memory_bytes / find_gpu(i).memory_bytes
                    for i in ("H100-SXM-80GB", "H100-PCIe-80GB", "H200-SXM-141GB"))  # fmt: skip
    assert nvl.cuda_memory_bytes == int(nvl.memory_bytes * (1 - hopper[1])) // MiB * MiB


def test_a_catalog_target_carries_both_totals_and_a_custom_one_is_taken_as_is() -> None:
    t = gpu_target_from_text("H100:2")
    assert (t.capacity_bytes, t.cuda_bytes, t.count) == (H100.memory_bytes, H100.cuda_memory_bytes, 2)
    assert t.memory == GpuMemory(driver_bytes=H100.memory_bytes, cuda_bytes=H100.cuda_memory_bytes)
    custom = gpu_target_from_text("24GiB")
    assert custom.cuda_capacity == custom.capacity_bytes == 24 * GiB
    with pytest.raises(ValueError, match="cuda_bytes"):
        GpuTarget(name="x", capacity_bytes=GiB, cuda_bytes=2 * GiB)


# ---- each engine reads its own figure ----------------------------------------------------------------------


def test_vllm_budgets_on_cudas_total() -> None:
    """vllm/v1/worker/gpu_worker.py: requested_memory = MemorySnapshot().total_memory
    (torch.cuda.mem_get_info()[1]) x gpu_memory_utilization; a published vLLM log on an 80 GB card prints
    'Free memory on device (78.66/79.19 GiB) on startup. Desired GPU memory utilization is (0.9, 71.27 GiB)'
    (code index id 34680831065)."""
    run = make_run(engine="vllm", max_model_len=8192)
    est = estimate_inference(spec_for(LLAMA), run, gpu_target_from_text("H100").memory)
    assert est.facts["budget_bytes"] == int(H100.cuda_memory_bytes * 0.9)
    assert est.facts["gpu_cuda_total_bytes"] == H100.cuda_memory_bytes
    assert round(est.facts["budget_bytes"] / GiB, 2) == 71.27
    # nvidia-smi's figure would give the pool 0.41 GiB more than vLLM has
    smi = estimate_inference(spec_for(LLAMA), run, H100.memory_bytes)
    assert smi.facts["kv_pool_bytes"] - est.facts["kv_pool_bytes"] == pytest.approx(0.9 * 470 * MiB, abs=2)


def test_sglang_defaults_read_nvidia_smi_and_its_pool_reads_cuda() -> None:
    run = make_run(engine="sglang")
    est = estimate_inference(spec_for(LLAMA), run, H100.gpu_memory)
    # server_args.py get_device_memory_capacity: nvidia-smi's MiB pick the default fraction (0.835 on an H100,
    # as SGLang's docs print it); the pool starts from torch's free memory before loading (CUDA's total)
    assert est.facts["mem_fraction_static"] == 0.835
    assert est.facts["pre_load_free_bytes"] == H100.cuda_memory_bytes - SGLANG_PRELOAD_BYTES
    # with CUDA's total the published H100 free memory at load (78.59 GiB, sglang PR #4760) is reproduced
    assert round(est.facts["pre_load_free_bytes"] / GiB, 2) == 78.59
    # a GPU given by one figure gets that figure for both
    one = estimate_inference(spec_for(LLAMA), run, H100.cuda_memory_bytes)
    assert one.facts["pre_load_free_bytes"] == est.facts["pre_load_free_bytes"]


def test_ollama_places_layers_in_cudas_total() -> None:
    """Ollama's discovery reports NVML's (or cudaMemGetInfo's) free memory, which leaves out the driver's
    reserve (ml/backend/ggml/ggml/src/mem_nvml.cpp ggml_nvml_get_device_memory): on an idle card, CUDA's
    total."""
    spec, run = spec_for(LLAMA), make_run(engine="ollama", weights="gguf-Q4_K_M", num_ctx=131072)
    two = GpuMemory(driver_bytes=12 * GiB, cuda_bytes=10 * GiB)
    assert estimate_inference(spec, run, two).facts == estimate_inference(spec, run, 10 * GiB).facts
    assert estimate_inference(spec, run, two).facts != estimate_inference(spec, run, 12 * GiB).facts


def test_a_verdict_compares_with_cudas_total() -> None:
    """What PyTorch (and every engine) can allocate is CUDA's total: a run needing more than that but less
    than nvidia-smi's total does not fit."""
    t = gpu_target_from_text("H100")
    est = estimate_inference(spec_for(LLAMA), make_run(batch=1, seq=2048), t.memory)
    margin = t.cuda_capacity - est.total_bytes + 200 * MiB  # leaves 200 MiB too little of CUDA's total
    (v,) = verdicts(est, t, margin)
    assert v.available_bytes == H100.cuda_memory_bytes and not v.fits
    (v,) = verdicts(est, t.model_copy(update={"cuda_bytes": None}), margin)
    assert v.fits  # nvidia-smi's total would have passed it


# ---- local and cluster GPUs: NVML / DCGM totals less the reserve -------------------------------------------


def test_nvml_total_less_reserved_is_cudas_total() -> None:
    # nvidia-smi -q on an H100: Total 81559 MiB, Reserved 454 MiB (code index id 32796783472)
    assert driver_gpu_memory(81559 * MiB, 454 * MiB).cuda_bytes == 81105 * MiB
    # memory info v1 (no reserve): the catalog's rule over every published card
    v1 = driver_gpu_memory(81559 * MiB, None)
    assert v1.cuda_bytes == derived_cuda_bytes(81559 * MiB, None)[0] < 81559 * MiB


def test_local_fit_uses_cudas_total(capsys: pytest.CaptureFixture[str]) -> None:
    # the scenario's RTX 4090: total 24564 MiB, reserved 318 MiB
    assert main(["fit", LLAMA, "--fake-gpus", "rtx4090_browser", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["capacity_bytes"] == 24564 * MiB and doc["cuda_capacity_bytes"] == (24564 - 318) * MiB


def test_cluster_gpus_carry_cudas_total() -> None:
    dev = GpuDevice(index=0, name="NVIDIA H100 80GB HBM3", total_bytes=81559 * MiB, free_bytes=80000 * MiB,
                    used_bytes=1 * MiB, reserved_bytes=454 * MiB, host="node-a")  # fmt: skip
    (g,) = cluster_gpus(GpuSnapshot(taken_at=0.0, backend="prometheus:test", devices=(dev,)))
    assert g.memory == GpuMemory(driver_bytes=81559 * MiB, cuda_bytes=81105 * MiB)


# ---- display -----------------------------------------------------------------------------------------------


def test_catalog_table_and_fit_header_name_the_figure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "--catalog"]) == 0
    out = capsys.readouterr().out
    assert "nvidia-smi GiB" in out and "CUDA GiB" in out
    row = next(line for line in out.splitlines() if line.startswith("H100-SXM-80GB "))
    assert "79.65" in row and "79.19" in row
    assert main(["fit", LLAMA, "--gpu", "H100"]) == 0
    out = capsys.readouterr().out
    assert "(79.19 GiB each as CUDA reports it, 79.65 GiB in nvidia-smi;" in out


def test_fit_json_gives_both_totals(capsys: pytest.CaptureFixture[str]) -> None:
    rep = fit_report(spec_for(LLAMA), make_run(), gpu_target_from_text("A100-80GB"))
    assert rep.verdicts[0].available_bytes == find_gpu("A100-80GB").cuda_memory_bytes
    assert main(["fit", LLAMA, "--gpu", "A100-80GB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["capacity_bytes"] == 80 * GiB
    assert doc["cuda_capacity_bytes"] == find_gpu("A100-80GB").cuda_memory_bytes


def test_the_window_names_the_figure_of_a_catalog_and_a_local_target() -> None:
    from gpumem_gui.core import SizeUnit
    from gpumem_gui.ui.target_form import GpuChoice, resolve_target

    r = resolve_target(GpuChoice(kind="catalog", gpu_id="H100-SXM-80GB", count=1), None, SizeUnit.GIB)
    assert r.target.cuda_bytes == H100.cuda_memory_bytes
    assert r.text.endswith("(79.19 GiB each as CUDA reports it, 79.65 GiB in nvidia-smi)")
    dev = GpuDevice(index=0, name="NVIDIA GeForce RTX 4090", total_bytes=24564 * MiB, free_bytes=24000 * MiB,
                    used_bytes=246 * MiB, reserved_bytes=318 * MiB)  # fmt: skip
    snap = GpuSnapshot(taken_at=0.0, backend="fake:test", devices=(dev,))
    r = resolve_target(GpuChoice(kind="local", device="0", basis="total"), snap, SizeUnit.GIB)
    assert (r.target.capacity_bytes, r.target.cuda_bytes) == (24564 * MiB, (24564 - 318) * MiB)
    assert (
        "23.68 GiB each as CUDA reports it, 23.99 GiB in nvidia-smi; checked against CUDA's total" in r.text
    )


@pytest.mark.no_qt_log
@pytest.mark.usefixtures("qt_warnings_fail")
def test_the_gpu_panel_names_the_figure_and_checks_totals_against_cudas(qtbot, fake_snapshots) -> None:
    from gpumem_gui.core import Verdict
    from gpumem_gui.ui.gpu_panel import GpuPanel

    panel = GpuPanel()
    qtbot.addWidget(panel)
    seen: list[int] = []

    def evaluator(d: GpuDevice, available: int) -> Verdict:
        seen.append(available)
        return Verdict(gpu_index=0, role="GPU 0", needed_bytes=0, available_bytes=available, margin_bytes=0,
                       fits=True, headroom_bytes=available)  # fmt: skip

    panel.set_evaluator(evaluator)
    (snap,) = fake_snapshots("rtx4090_browser", steps=1)
    panel.set_basis("total")
    panel.show_snapshot(snap)
    d = snap.devices[0]  # total 24564 MiB, reserved 318 MiB
    assert seen[-1] == d.cuda_total_bytes == (24564 - 318) * MiB
    assert panel.cards[d.key].memory.text().endswith("of 24.0 GiB (nvidia-smi; CUDA 23.7)")
    assert panel.verdict_text(d.key).endswith("(CUDA's total)")
