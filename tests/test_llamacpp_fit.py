"""llama.cpp's automatic placement (``-ngl auto --fit on``, common/fit.cpp ``common_params_fit_impl``) on one
GPU: no change when the projection leaves the target free, the most whole layers that fit for a dense model,
routed experts in host memory first for a MoE model, ``-ngl 0`` when nothing fits; the search equals
llama.cpp's method of false position; the estimate's bytes are the llama.cpp profile's at its layers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpumem_gui.core.monotone import largest
from gpumem_gui.core.readers.loader import load_model
from gpumem_gui.core.results.nontorch import context_bytes
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run, runtime
from gpumem_gui.core.runtimes.llamacpp_fit import fit_single_gpu
from gpumem_gui.core.runtimes.llamacpp_fit_search import Device, override_blocks
from gpumem_gui.core.runtimes.ollama_split import gpu_layers
from gpumem_gui.core.units import GiB, MiB
from tests.test_llamacpp_split_fit import _llama_fit

LLAMA8 = load_model("meta-llama/Llama-3.1-8B").spec
QWEN30 = load_model("Qwen/Qwen3-30B-A3B").spec


def cpu_expert_blocks(n_layer: int, n_part: int, hp_ngl: int) -> frozenset[int]:
    """The overridden blocks of one device (common/fit.cpp set_ngl_tensor_split_tbo)."""
    return override_blocks((Device(n_layer, n_part),), hp_ngl)


def _run(**kw):
    return make_run(engine="llama.cpp", weights="gguf-Q4_K_M", seq=8192, **kw)


def _est(spec, gpu, **kw):
    return estimate_inference(spec, _run(**kw), gpu)


def _false_position(total: int, target: int, used) -> int:
    """common/fit.cpp step 3 for one dense device, as written there: low = 0 layers, high = all unassigned,
    step_size = delta x (target - mem) / (mem_high - mem), clamped to [1, delta - 1], until delta is 1."""
    low, mem = 0, used(0)
    high, mem_high = total, used(total)
    if mem_high <= target:
        return total
    delta = high - low
    while delta > 1:
        headroom = mem_high - mem
        step = delta * (target - mem) // headroom if headroom > 0 else delta - 1
        step = min(max(step, 1), delta - 1)
        test = low + step
        mem_test = used(test)
        if mem_test <= target:
            low, mem = test, mem_test
        else:
            high, mem_high = test, mem_test
        delta = high - low
    return low


@given(
    st.integers(1, 120),
    st.lists(st.integers(1, 900), min_size=121, max_size=121),
    st.integers(0, 50_000),
    st.integers(0, 4096),
)
def test_the_search_equals_llamas_false_position(
    n_layer: int, sizes: list[int], base: int, target: int
) -> None:
    """For any monotone memory use (a base plus a layer of its own size each), the bisection gpumem runs ends
    at the layer count llama.cpp's false position ends at."""
    total = n_layer + 1

    def used(k: int, _cpu: frozenset[int] = frozenset()) -> int:
        return base + sum(sizes[: total if k < 0 else k]) * MiB

    free = base + target * MiB
    plc = fit_single_gpu(n_layer, frozenset(), free, 0, used)
    want = _false_position(total, free, used)
    if used(-1) <= free:
        assert plc.n_gpu_layers == -1  # "no changes needed"
    elif used(0) > free:
        assert plc.n_gpu_layers == 0
    else:
        assert plc.n_gpu_layers == want


def _first_dense(n: int, first: int, dense: int, experts: int, output: int, compute: int):
    """A DeepSeek-like model on one GPU (``first_k_dense_replace`` = ``first``): each block ``dense`` bytes,
    plus ``experts`` from block ``first`` on unless overridden; the output layer; a compute buffer. ``-ngl
    k`` holds the output layer and the last k - 1 blocks (src/llama-model.cpp load_tensors)."""

    def used(k: int, cpu: frozenset[int]) -> int:
        k = n + 1 if k < 0 else k
        blocks = range(n + 1 - k, n) if k else range(0)
        moe = sum(experts for i in blocks if i >= first and i not in cpu)
        return compute + (output if k else 0) + dense * len(blocks) + moe

    return used


def test_dense_first_blocks_one_gpu_by_hand() -> None:
    """8 blocks, the first 3 without experts (dense 1 each, experts 10 from block 3 on), output 2, compute 1.

    Target 10. Step 1: every layer and expert is 1 + 2 + 8 + 50 = 61. Step 3, dense-only (the range's first
    block full): k layers start at block j = 9 - k, so k = 2..6 cost 3 + (k - 1) + 10 (block j has experts),
    14..18, but k = 7, 8, 9 start at a dense block: 9, 10, 11. llama.cpp's false position: low 0 (1), high 9
    (11), step = 9 x (10 - 1) / (11 - 1) = 8; k = 8 costs 10 <= 10: the search ends at 8 layers, blocks 2..7
    overridden (block 1 full). A bisection would stop at 1 (k = 4 costs 16). No step 4: every expert in host
    memory costs 11, no surplus over 10.

    Target 12. Step 3 takes all 9 layers (11); the surplus is 1, so step 4 converts from the front: c full
    layers cost 11 while they are the dense blocks 0..2 (c = 1..3), 21 from block 3 on; the search (low c = 1,
    high 9 at 61) steps by 1 to c = 3: blocks 3..7 keep their experts in host memory."""
    used = _first_dense(8, 3, 1, 10, 2, 1)
    plc = fit_single_gpu(8, frozenset(range(3, 8)), 10, 0, used)
    # blocks 2..7 overridden; block 2 has no ffn_*_exps tensors to move
    assert (plc.n_gpu_layers, plc.cpu_experts) == (8, frozenset(range(3, 8)))
    assert used(8, plc.cpu_experts) == 10 and plc.projected == 61
    assert largest(lambda k: used(k, cpu_expert_blocks(k, max(k - 1, 0), 8)) <= 10, 0, 9) == 1
    plc = fit_single_gpu(8, frozenset(range(3, 8)), 12, 0, used)
    assert (plc.n_gpu_layers, plc.cpu_experts) == (9, frozenset(range(3, 8)))
    assert used(9, plc.cpu_experts) == 11


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 30),
    st.integers(0, 5),
    st.integers(1, 40),
    st.integers(0, 200),
    st.integers(1, 300),
    st.integers(0, 50),
    st.integers(1, 3000),
)
def test_one_gpu_follows_llamas_loops_with_dense_first_blocks(
    n: int, first: int, dense: int, experts: int, output: int, compute: int, target: int
) -> None:
    """For a MoE model whose first blocks have no experts (a use that does not grow with each layer), the
    one-GPU fit ends where a transcription of common_params_fit_impl's steps 3 and 4 ends
    (tests/test_llamacpp_split_fit.py ``_llama_fit`` with one device)."""
    used = _first_dense(n, first, dense, experts, output, compute)

    def use(devs: tuple[Device, ...]) -> list[int]:
        return [used(devs[0].n_layer, override_blocks(devs, n))]

    moe = frozenset(range(first, n))
    plc = fit_single_gpu(n, moe, target, 0, used)
    if used(-1, frozenset()) <= target:
        assert plc.n_gpu_layers == -1
        return
    surplus = target - used(-1, moe) if moe else 0
    (want,) = _llama_fit(1, n, target, use, surplus)  # without experts its n_part moves no byte
    assert (plc.n_gpu_layers, plc.cpu_experts) == (want.n_layer, override_blocks((want,), n) & moe)


def test_llama_cpp_lays_ngl_out_output_layer_first() -> None:
    """Two equal GPUs, 8 blocks, -ngl 5: llama.cpp (i_gpu_start = 8 + 1 - 5 = 4, split points 0.5 and 1,
    (il - 4) / 5 = 0, 0.2, 0.4 | 0.6, 0.8) puts blocks 4..6 on GPU 0, block 7 and the output layer on GPU 1;
    Ollama v0.12.10's createGPULayers (start 8 - 5 = 3) blocks 3..5 and 6..7, the output layer in host
    memory. With every layer both agree."""
    assert gpu_layers((1, 1), 8, 5, output_first=True) == [range(4, 7), range(7, 9)]
    assert gpu_layers((1, 1), 8, 5) == [range(3, 6), range(6, 8)]
    assert gpu_layers((1, 1), 8, 9, True) == gpu_layers((1, 1), 8, 9) == [range(0, 5), range(5, 9)]


def test_no_change_when_the_target_is_left_free() -> None:
    """8B Q4_K_M on 24 GiB: the estimate with --fit on equals the one with every layer (-ngl all)."""
    on, off = _est(LLAMA8, 24 * GiB, fit="on"), _est(LLAMA8, 24 * GiB)
    assert on.peak_bytes == off.peak_bytes and on.components == off.components
    assert on.facts["fit_n_gpu_layers"] == -1
    assert any("no changes needed" in w for w in on.warnings)


def test_dense_model_keeps_the_most_whole_layers_that_fit() -> None:
    """8B Q4_K_M, 8192 tokens on 6 GiB: the layers --fit picks leave the 1024 MiB target free and one more
    layer would not; the bytes are the llama.cpp profile's at that -ngl."""
    gpu = 6 * GiB
    est = _est(LLAMA8, gpu, fit="on")
    k = est.facts["fit_n_gpu_layers"]
    assert 0 < k <= LLAMA8.num_layers
    free = gpu - context_bytes("auto", None)
    target = free - 1024 * MiB
    at_k, above = _est(LLAMA8, None, n_gpu_layers=k), _est(LLAMA8, None, n_gpu_layers=k + 1)
    assert at_k.peak_bytes <= target < above.peak_bytes
    # -ngl k holds the output layer and the last k - 1 blocks (src/llama-model.cpp load_tensors)
    assert est.peak_bytes == at_k.peak_bytes and est.facts["offloaded_layers"] == k - 1
    # a larger fit target keeps fewer layers on the GPU
    assert _est(LLAMA8, gpu, fit="on", fit_target_mib=2048).facts["fit_n_gpu_layers"] < k


def test_moe_model_moves_routed_experts_to_host_memory_first() -> None:
    """Qwen3-30B-A3B Q4_K_M on 8 GiB: every layer stays on the GPU, the routed experts of some blocks go to
    host memory (the ffn_*_exps overrides), as few as leave the target free."""
    gpu = 8 * GiB
    est = _est(QWEN30, gpu, fit="on")
    n_cpu = est.facts["fit_cpu_expert_layers"]
    assert est.facts["fit_n_gpu_layers"] == QWEN30.num_layers + 1 and 0 < n_cpu < QWEN30.num_layers
    full = _est(QWEN30, None)
    w_fit, w_full = (next(c.bytes for c in e.components if c.key == "weights") for e in (est, full))
    wb_experts = w_full - w_fit
    assert wb_experts > 0 and wb_experts % n_cpu == 0  # whole layers' experts, an equal share each
    free = gpu - context_bytes("auto", None)
    assert est.peak_bytes <= free - 1024 * MiB


def test_cpu_expert_blocks_follow_set_ngl_tensor_split_tbo() -> None:
    """One device, 48 blocks + output: all dense-only (n_part 48) keeps block 0's experts; 10 converted back
    to full layers leave blocks 11..47; the output index (48) has no block."""
    assert cpu_expert_blocks(49, 48, 48) == frozenset(range(1, 48))
    assert cpu_expert_blocks(49, 38, 48) == frozenset(range(11, 48))
    assert cpu_expert_blocks(20, 19, 48) == frozenset(range(30, 48))
    assert cpu_expert_blocks(49, 0, 48) == frozenset()


def test_nothing_fits_keeps_every_layer_in_host_memory() -> None:
    est = _est(LLAMA8, 1 * GiB, fit="on")
    assert est.facts["fit_n_gpu_layers"] == 0 and est.facts["offloaded_layers"] == 0
    assert any("-ngl 0" in w for w in est.warnings)


def test_a_set_ngl_is_left_alone_and_the_command_says_fit() -> None:
    est = _est(LLAMA8, 6 * GiB, fit="on", n_gpu_layers=10)
    # -ngl 10: the output layer and the last 9 blocks (i_gpu_start = n_layer + 1 - n_gpu_layers)
    assert est.facts["offloaded_layers"] == 9 and "fit_n_gpu_layers" not in est.facts
    assert any("n_gpu_layers already set by user" in w for w in est.warnings)
    run = _run(fit="on", fit_target_mib=2048)
    cmd = runtime("llama.cpp").command("model.gguf", run, _est(LLAMA8, None, fit="on", fit_target_mib=2048))
    assert "-ngl auto" in cmd and "--fit on --fit-target 2048" in cmd
    off = runtime("llama.cpp").command("model.gguf", _run(), _est(LLAMA8, None))
    assert "-ngl all" in off and "--fit" not in off


def test_no_gpu_memory_given_keeps_every_layer() -> None:
    est = _est(LLAMA8, None, fit="on")
    assert est.facts["offloaded_layers"] == LLAMA8.num_layers
    assert any("no GPU memory given" in w for w in est.warnings)


def test_llama_server_commands_import_the_fit() -> None:
    """-ngl auto turns --fit on (llama.cpp's default); --fit off keeps it off; -fitt takes the first GPU's."""
    from gpumem_gui.core.imports import import_command

    auto = import_command("llama-server -m m.gguf -ngl auto -c 8192").run
    assert (auto.n_gpu_layers, auto.fit) == (-1, "on")
    off = import_command("llama-server -m m.gguf -ngl auto --fit off").run
    assert off.fit == "off"
    target = import_command("llama-server -m m.gguf --fit on -fitt 2048,1024").run
    assert (target.fit, target.fit_target_mib) == ("on", 2048)
    assert import_command("llama-server -m m.gguf -ngl all").run.fit == "off"


def test_the_fit_verdict_needs_the_whole_projection() -> None:
    """With --fit on, a GPU fits the run when llama.cpp's fit changes nothing: a verdict needs its first
    projection (every layer and expert on the GPU) plus the CUDA context; with nothing moved, the total."""
    rt = runtime("llama.cpp")
    small = _est(LLAMA8, 6 * GiB, fit="on")
    full = _est(LLAMA8, None)
    assert rt.needed_bytes(small, small.per_gpu[0]) == full.total_bytes > small.total_bytes
    big = _est(LLAMA8, 24 * GiB, fit="on")
    assert rt.needed_bytes(big, big.per_gpu[0]) == big.total_bytes


def test_the_offload_lever_counts_the_output_layer() -> None:
    """-ngl runs from 0 to n_layer + 1 (the output layer counted first): the lever offers the most layers
    that fit; -ngl 32 of Llama 3.1 8B's 33 still leaves block 0 in host memory."""
    rt, run = runtime("llama.cpp"), _run()
    assert rt.fit_levers(LLAMA8, run, lambda n_gpu_layers: n_gpu_layers <= 20) == [
        (6, "offload", "offload 13 layers to the CPU (-ngl 20)", {"n_gpu_layers": 20})
    ]
    assert rt.fit_levers(LLAMA8, run, lambda n_gpu_layers: n_gpu_layers <= 32)[0][3] == {"n_gpu_layers": 32}
    assert rt.fit_levers(LLAMA8, run, lambda n_gpu_layers: True) == []
