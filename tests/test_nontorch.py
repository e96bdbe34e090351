"""Issue 31 item 2: non-torch memory as a model (core/results/nontorch.py, core/training/comms.py): the CUDA
context by GPU generation, cuBLAS workspaces by the threads and streams that run matmuls, NCCL buffers by the
communicators of the parallel layout; each term at the byte its source defines it."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.cli import main
from gpumem_gui.core import (
    GpumemInputError,
    estimate_inference,
    gpu_target_from_text,
    load_gpu_catalog,
    load_model,
    make_run,
    with_target_arch,
)
from gpumem_gui.core.results.nontorch import (
    CONTEXT_MIB,
    CommGroup,
    arch_of,
    connection_bytes,
    context_bytes,
    cublas_workspace_bytes,
    nccl_bytes,
    outside_allocator_bytes,
    p2p_channels_per_peer,
)
from gpumem_gui.core.training import estimate_training, make_training_run
from gpumem_gui.core.units import MiB
from tests.conftest import reference_dir

QWEN = str(reference_dir() / "configs" / "Qwen__Qwen2.5-0.5B.json")
PER_CHANNEL = (
    12 * MiB
)  # one ring channel or one point-to-point channel and peer (see test_nccl_connection...)


@pytest.fixture(scope="module")
def qwen():
    return load_model(QWEN).spec


def _train(qwen, **kw):
    return estimate_training(qwen, make_training_run(seq=256, **kw))


def _nccl(est) -> int:
    c = est.component("nccl_buffers")
    return 0 if c is None else c.bytes


# ---- CUDA context --------------------------------------------------------------------------------------


def test_context_is_the_generations_published_figure_and_auto_is_hopper() -> None:
    assert context_bytes("ampere", None) == 256 * MiB  # RTX 3090 idle process, InvokeAI#9413
    assert context_bytes("ada", None) == 426 * MiB  # RTX 6000 Ada after mem_get_info, unsloth-zoo#1053
    # SGLang H100 TP1 before the weights: 79.19 GiB CUDA total - 78.81 GiB free = 0.38 GiB
    assert context_bytes("hopper", None) == round(0.38 * 1024) * MiB
    assert context_bytes("blackwell", None) == (389 + round((0.79 - 0.76) * 1024)) * MiB
    assert context_bytes("auto", None) == context_bytes("hopper", None)
    assert context_bytes("ampere", 700) == 700 * MiB  # the override wins
    assert context_bytes("hopper", 0) == 0


@pytest.mark.parametrize(
    "cc, arch",
    [
        ("7.0", "volta"),
        ("7.5", "turing"),
        ("8.0", "ampere"),
        ("8.6", "ampere"),
        ("8.9", "ada"),
        ("9.0", "hopper"),
        ("10.0", "blackwell"),
        ("10.3", "blackwell"),
        ("12.0", "blackwell"),
        ("6.1", None),
    ],
)
def test_compute_capability_maps_onto_its_generation(cc: str, arch: str | None) -> None:
    assert arch_of(cc) == arch


def test_every_catalog_nvidia_gpu_has_a_generation_with_a_context() -> None:
    for g in load_gpu_catalog():
        if g.vendor == "nvidia":
            assert g.compute_capability is not None
            assert arch_of(g.compute_capability) in CONTEXT_MIB, g.id


def test_training_context_follows_the_run_generation_and_the_override_wins(qwen) -> None:
    assert _train(qwen).component("cuda_context").bytes == 389 * MiB
    assert _train(qwen, gpu_arch="ampere").component("cuda_context").bytes == 256 * MiB
    assert _train(qwen, gpu_arch="ampere", cuda_context_mib=900).component("cuda_context").bytes == 900 * MiB


def test_llamacpp_context_uses_the_same_rule(qwen) -> None:
    run = make_run(engine="llama.cpp", gpu_arch="ada")
    assert estimate_inference(qwen, run).component("cuda_context").bytes == 426 * MiB
    run = make_run(engine="llama.cpp", cuda_context_mib=500)
    assert estimate_inference(qwen, run).component("cuda_context").bytes == 500 * MiB


# ---- the target GPU's generation -----------------------------------------------------------------------


def test_auto_takes_the_catalog_targets_generation() -> None:
    run = make_training_run()
    assert with_target_arch(run, gpu_target_from_text("A100:2")).gpu_arch == "ampere"
    assert with_target_arch(run, gpu_target_from_text("RTX-4090")).gpu_arch == "ada"
    assert with_target_arch(run, gpu_target_from_text("B200")).gpu_arch == "blackwell"
    # a capacity names no generation; an AMD GPU is none of NVIDIA's; a run that names one keeps it
    assert with_target_arch(run, gpu_target_from_text("24GiB")).gpu_arch == "auto"
    assert with_target_arch(run, gpu_target_from_text("MI300X")).gpu_arch == "auto"
    named = make_training_run(gpu_arch="volta")
    assert with_target_arch(named, gpu_target_from_text("H100")).gpu_arch == "volta"
    assert with_target_arch(run, None) is run


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _components(out: str) -> dict[str, int]:
    return {c["key"]: c["bytes"] for c in json.loads(out)["components"]}


def test_cli_estimate_sizes_for_the_gpu_and_the_flag_still_wins(capsys) -> None:
    rc, out, _ = _cli(capsys, "estimate", QWEN, "--mode", "train", "--seq", "256", "--gpu", "A100", "--json")
    assert rc == 0
    comps = _components(out)
    assert comps["cuda_context"] == 256 * MiB and comps["workspace"] == 2 * 8_519_680
    argv = ("estimate", QWEN, "--seq", "256", "--gpu", "A100", "--cuda-context-mib", "700", "--json")
    rc, out, _ = _cli(capsys, *argv)
    assert rc == 0 and _components(out)["cuda_context"] == 700 * MiB


@pytest.mark.parametrize(
    "flag, value, field",
    [
        ("--gpu-arch", "pascal", "gpu-arch"),
        ("--nccl-channels", "0", "nccl_channels"),
        ("--nccl-channels", "65", "nccl_channels"),
    ],
)
def test_bad_values_are_one_line_and_exit_2(capsys, flag: str, value: str, field: str) -> None:
    rc, _, err = _cli(capsys, "estimate", QWEN, "--mode", "train", flag, value)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert field in err and "Traceback" not in err


def test_run_models_reject_bad_values() -> None:
    with pytest.raises(GpumemInputError, match="nccl_channels"):
        make_training_run(nccl_channels=0)
    with pytest.raises(GpumemInputError, match="gpu_arch"):
        make_training_run(gpu_arch="pascal")


# ---- cuBLAS workspaces ---------------------------------------------------------------------------------


def test_workspace_size_by_generation() -> None:
    # CublasHandlePool.cpp: ":4096:2:16:8" = 2 x 4096 KiB + 8 x 16 KiB, what pytorch/pytorch#95668 found left
    # allocated (8519680) after one nn.Linear on an A10G (Ampere); ":4096:8" = 32 MiB on Hopper and Blackwell
    assert cublas_workspace_bytes("ampere") == 8_519_680
    for arch in ("volta", "turing", "ada"):
        assert cublas_workspace_bytes(arch) == 8_519_680
    assert cublas_workspace_bytes("hopper") == cublas_workspace_bytes("blackwell") == 32 * MiB


def test_training_holds_two_workspaces_inference_one(qwen) -> None:
    # forward on the main thread, backward on the autograd device thread: two handles on the default stream
    assert _train(qwen).component("workspace").bytes == 2 * 32 * MiB
    assert _train(qwen, gpu_arch="ampere").component("workspace").bytes == 2 * 8_519_680
    est = estimate_inference(qwen, make_run(seq=128, new_tokens=4, gpu_arch="ada"))
    assert est.component("workspace").bytes == 8_519_680


# ---- NCCL buffers --------------------------------------------------------------------------------------


def test_nccl_connection_is_ten_plus_two_mib() -> None:
    # init.cc defaults: LL 8 x 512 x 8 x 16, LL128 120 x 640 x 8 x 8, Simple 4 MiB; p2p.cc rounds the receive
    # end (its ncclRecvMem + the three buffers) and the send end (ncclSendMem) up to CUDA_IPC_MIN (2 MiB):
    # the 10485760 and 2097152 allocations NVIDIA/nccl#1685 logged per channel and peer on 8 x H100
    assert 524_288 + 4_915_200 + 4 * MiB == 9_633_792
    assert connection_bytes() == 10_485_760 + 2_097_152 == PER_CHANNEL


def test_p2p_channels_per_peer_round_to_a_power_of_two() -> None:
    # 24 coll channels and 32 p2p channels per peer in the 8 x H100 log
    assert [p2p_channels_per_peer(c) for c in (1, 2, 3, 24, 32)] == [1, 2, 4, 32, 32]


def test_nccl_bytes_adds_rings_and_peers() -> None:
    groups = (CommGroup(name="dp", ranks=4), CommGroup(name="pp", ranks=3, peers=2))
    assert nccl_bytes(groups, 24) == (24 + 2 * 32) * PER_CHANNEL
    assert nccl_bytes(groups, 2) == (2 + 2 * 2) * PER_CHANNEL
    assert nccl_bytes((), 24) == 0


def test_one_rank_has_no_nccl_buffers(qwen) -> None:
    for kw in ({}, {"fsdp": "full_shard"}, {"zero": 2}):
        assert _train(qwen, **kw).component("nccl_buffers") is None


@pytest.mark.parametrize(
    "kw, rings",
    [
        ({"dp": 4}, 1),  # DDP: one data-parallel communicator
        ({"dp": 4, "fsdp": "full_shard"}, 1),
        ({"dp": 4, "zero": 3}, 1),
        ({"dp": 4, "tp": 2}, 2),  # two communicators: data and tensor parallel
        ({"dp": 2, "tp": 2, "cp": 2, "fsdp": "full_shard"}, 3),  # FSDP over dp x cp, tp, cp
        ({"dp": 16, "fsdp": "hybrid_shard", "gpus_per_node": 8}, 2),  # shard in a node + replicate across
        ({"dp": 8, "fsdp": "hybrid_shard", "gpus_per_node": 8}, 1),  # one node: no replicate group
    ],
)
def test_ring_communicators_scale_with_the_layout(qwen, kw: dict, rings: int) -> None:
    assert _nccl(_train(qwen, **kw)) == rings * 24 * PER_CHANNEL
    assert _nccl(_train(qwen, nccl_channels=2, **kw)) == rings * 2 * PER_CHANNEL


def test_pipeline_stages_connect_to_their_neighbours(qwen) -> None:
    est = _train(qwen, pp=3, grad_accum=3)
    by_stage = {r.stage: next(c.bytes for c in r.components if c.key == "nccl_buffers") for r in est.ranks}
    # first and last stage: one peer; the middle one: two; 32 p2p channels per peer with 24 coll channels
    assert by_stage == {0: 32 * PER_CHANNEL, 1: 2 * 32 * PER_CHANNEL, 2: 32 * PER_CHANNEL}


def test_nccl_component_explains_its_communicators(qwen) -> None:
    c = _train(qwen, dp=4, tp=2).component("nccl_buffers")
    assert c.explain.inputs["dp_ranks"] == 4 and c.explain.inputs["tp_ranks"] == 2
    assert (
        c.explain.inputs["nccl_channels"] == 24
        and c.explain.inputs["bytes_per_channel_and_peer"] == PER_CHANNEL
    )
    assert "p2p.cc" in c.explain.source


def test_rank_total_adds_the_nccl_buffers(qwen) -> None:
    one, four = _train(qwen), _train(qwen, dp=4)
    assert four.total_bytes - four.component("nccl_buffers").bytes - four.component(
        "allocator_reserve"
    ).bytes == (four.peak_bytes + four.component("cuda_context").bytes + four.component("workspace").bytes)
    assert one.component("nccl_buffers") is None


def test_transformers_tensor_parallel_inference_has_one_communicator(qwen) -> None:
    tp = estimate_inference(qwen, make_run(seq=128, new_tokens=4, tp=2))
    assert tp.component("nccl_buffers").bytes == 24 * PER_CHANNEL
    # pipeline stages are device_map layers of one process: no NCCL
    pp = estimate_inference(qwen, make_run(seq=128, new_tokens=4, pp=2))
    assert pp.component("nccl_buffers") is None


def test_reserved_leaves_out_the_context_and_nccl_but_keeps_the_workspaces(qwen) -> None:
    """torch.cuda.max_memory_reserved counts the cuBLAS workspaces (setWorkspaceForHandle allocates them from
    the caching allocator) but not the CUDA context or NCCL's buffers (cudaMalloc / cuMem of their own)."""
    est = _train(qwen, dp=4)
    outside = outside_allocator_bytes(est.components)
    assert outside == est.component("cuda_context").bytes + est.component("nccl_buffers").bytes
    reserved = est.total_bytes - outside
    assert (
        reserved
        == est.peak_bytes + est.component("workspace").bytes + est.component("allocator_reserve").bytes
    )


def test_window_sizes_for_its_target_gpu() -> None:
    """The window's target (ui/plan.py resolve_for) resolves gpu_arch auto as the CLI's --gpu does."""
    from gpumem_gui.core import SizeUnit
    from gpumem_gui.ui.plan import resolve_for
    from gpumem_gui.ui.target_form import GpuChoice

    run = make_training_run()
    _, err, resolved = resolve_for(run, GpuChoice(kind="catalog", gpu_id="A100"), None, SizeUnit.GIB)
    assert err is None and resolved.gpu_arch == "ampere"
    custom = GpuChoice(kind="custom", capacity="24GiB")
    assert resolve_for(run, custom, None, SizeUnit.GIB)[2].gpu_arch == "auto"
    named = make_training_run(gpu_arch="turing")
    assert resolve_for(named, GpuChoice(kind="catalog", gpu_id="H100"), None, SizeUnit.GIB)[2] is named


def test_window_estimate_is_sized_for_the_picked_gpu_and_its_command_stays_auto(main_window) -> None:
    """The window's default plan (Llama-3.1-8B on transformers): an RTX 4090 target sizes it for Ada, an A100
    for Ampere; the copied command keeps gpu_arch at auto (the CLI's --gpu resolves it the same way)."""
    from gpumem_gui.ui.target_form import GpuChoice

    w = main_window
    w.run_form.set_value(make_run(seq=128, new_tokens=4))
    for gpu, ctx, ws in (
        ("RTX-4090", 426, 8_519_680),
        ("A100-80GB", 256, 8_519_680),
        ("H100-SXM-80GB", 389, 32 * MiB),
    ):
        w.target_form.set_value(GpuChoice(gpu_id=gpu))
        w.recompute_now()
        assert w.estimate.component("cuda_context").bytes == ctx * MiB, gpu
        assert w.estimate.component("workspace").bytes == ws, gpu
    assert "--gpu-arch" not in w.command_line()


def test_diagnosis_sizes_its_estimate_for_the_gpu_the_report_names(qwen) -> None:
    """gpumem diagnose: a report naming an RTX 4090 in NVML's spelling compares against an Ada-sized
    estimate; without a name, --gpu's generation; with neither, the stated default (Hopper)."""
    from gpumem_gui.core import GpuTarget, ObservedMemory, diagnose

    run = make_run(seq=256, new_tokens=4)
    figures = dict(total_bytes=24_000 * MiB, allocated_bytes=2_000 * MiB, requested_bytes=100 * MiB)
    named = ObservedMemory(source_format="torch_oom", gpu_name="NVIDIA GeForce RTX 4090", **figures)
    assert diagnose(named, spec=qwen, run=run).estimate.component("cuda_context").bytes == 426 * MiB
    unnamed = ObservedMemory(source_format="torch_oom", **figures)
    a100 = GpuTarget(name="A100-80GB", capacity_bytes=80 << 30)
    assert diagnose(unnamed, spec=qwen, run=run, target=a100).estimate.component("cuda_context").bytes == (
        256 * MiB
    )
    assert diagnose(unnamed, spec=qwen, run=run).estimate.component("cuda_context").bytes == 389 * MiB
