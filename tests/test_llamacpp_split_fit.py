"""llama.cpp's ``--fit`` of a MoE model over several GPUs (common/fit.cpp ``common_params_fit_impl`` steps 3
and 4, read at ggml-org/llama.cpp 08033df0): dense-only layers back to front, then full layers front to back;
worked examples derived by hand from the source, the searches against a transcription of llama.cpp's method
of false position, the order of the placements it tries against a published log, and the estimate of Ollama
v0.30+ on two GPUs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpumem_gui.core.readers.loader import load_model
from gpumem_gui.core.results.nontorch import context_bytes
from gpumem_gui.core.runtimes.base import run_weight_bytes
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run, runtime
from gpumem_gui.core.runtimes.llamacpp import _experts_bytes
from gpumem_gui.core.runtimes.llamacpp_fit_search import (
    Device,
    convert_front_to_back,
    fill_back_to_front,
    fit_devices,
    override_blocks,
)
from gpumem_gui.core.units import GiB, MiB

QWEN30 = load_model("Qwen/Qwen3-30B-A3B").spec


def _toy(n: int, dense: list[int], experts: list[int], output: int, compute: int, copy: int):
    """A device's projected use: ``compute`` (+ ``copy``, one layer's experts, on device 0 when any experts
    are in host memory: op offload), each block's dense bytes plus its experts unless overridden, the output
    layer's bytes on the last device."""

    def use(devs: tuple[Device, ...]) -> list[int]:
        cpu = override_blocks(devs, n)
        il0 = n + 1 - sum(d.n_layer for d in devs)
        out = []
        for g, d in enumerate(devs):
            blocks = range(il0, il0 + d.n_layer)
            il0 += d.n_layer
            mem = compute + (copy if g == 0 and cpu else 0)
            mem += sum(output if i == n else dense[i] + (0 if i in cpu else experts[i]) for i in blocks)
            out.append(mem)
        return out

    return use


def _step(delta: int, target: int, mem: int, mem_high: int) -> int:
    """common_params_fit_impl's step of the method of false position, clamped to [1, delta - 1]."""
    headroom = mem_high - mem
    step = delta * (target - mem) // headroom if headroom > 0 else delta - 1
    return min(max(step, 1), delta - 1)


def _llama_fit(nd: int, n: int, target: int, use, surplus: int) -> tuple[Device, ...]:
    """common_params_fit_impl steps 3 and 4 for a MoE model as written there, with [n_layer, n_part] pairs
    (the extra split layer, LAYER_FRACTION_*, left out as gpumem leaves it out)."""

    def mem_of(s: list[list[int]]) -> list[int]:
        return use(tuple(Device(a, b) for a, b in s))

    def full(x: list[int]) -> int:
        return x[0] - x[1]

    ngl = [[0, 0] for _ in range(nd)]
    mem = mem_of(ngl)
    for d in reversed(range(nd)):  # step 3: dense-only layers back to front
        left = n + 1 - sum(ngl[j][0] for j in range(d + 1, nd))
        high = [list(x) for x in ngl]
        high[d] = [left, left if d < nd - 1 else left - 1]
        if left == 0:
            continue
        mem_high = mem_of(high)
        if mem_high[d] <= target:
            ngl, mem = high, mem_high
            continue
        delta = high[d][0] - ngl[d][0]
        while delta > 1:
            step = _step(delta, target, mem[d], mem_high[d])
            test = [list(x) for x in ngl]
            test[d][0] += step
            test[d][1] += step - 1 if d == nd - 1 and test[d][1] == 0 else step
            mem_test = mem_of(test)
            if mem_test[d] <= target:
                ngl, mem = test, mem_test
            else:
                high, mem_high = test, mem_test
            delta = high[d][0] - ngl[d][0]
    if surplus <= 0:
        return tuple(Device(a, b) for a, b in ngl)
    start = nd  # step 4: full layers front to back
    for d in reversed(range(nd)):
        if ngl[d][0] == 0:
            break
        start = d
    d = 0
    while d <= start and start < nd:
        high = [list(x) for x in ngl]
        for j in range(start, nd):
            move = high[j][0] if j < nd - 1 else high[j][0] - 1
            high[d][0] += move
            high[j][0] -= move
            high[j][1] = 0
        mem_high = mem_of(high)
        if mem_high[d] > target:
            delta = full(high[d]) - full(ngl[d])
            while delta > 1:
                step = _step(delta, target, mem[d], mem_high[d])
                test = [list(x) for x in ngl]
                start_test, done = start, 0
                while start_test < nd:
                    k = min(step - done, test[start_test][1])
                    test[start_test][0] -= k
                    test[start_test][1] -= k
                    test[d][0] += k
                    done += k
                    if test[start_test][1] > 0:
                        break
                    start_test += 1
                mem_test = mem_of(test)
                if mem_test[d] <= target:
                    ngl, mem, start = test, mem_test, start_test
                else:
                    high, mem_high = test, mem_test
                delta = full(high[d]) - full(ngl[d])
        else:
            ngl, mem, start = high, mem_high, nd - 1
        d += 1
    return tuple(Device(a, b) for a, b in ngl)


def test_worked_examples_by_hand() -> None:
    """8 blocks (1 dense + 4 experts each) + output (2), compute 1, two devices.

    Target 12. Step 3, device 1 (last): all 9 layers as dense-only cost 1 + 5 (block 0 keeps its experts:
    the first of the range is full) + 7 + 2 = 15 > 12; k layers cost k + 6, so 6 (blocks 3..7 + output,
    block 3 full). Device 0: the 3 left (blocks 0..2) dense-only, 4. Step 4, device 0: all moved to it as full
    layers is 41 > 12; converting c of its own dense-only layers costs 4 + 4c, so c = 2; it still has
    dense-only layers, so device 1 is not reached: experts of blocks 2, 4, 5, 6, 7 in host memory.

    Target 20. Step 3: device 1 takes all 9 (15); device 0 none. Step 4, device 0 takes c full layers from
    device 1 at 1 + 5c: c = 3 (16); device 1 (6 layers, 5 dense-only) then converts its own at 12 + 4c: c =
    2 (20): blocks 6 and 7 keep their experts in host memory.

    Target 30. Device 0 takes 5 full layers (26); device 1's remaining 3 blocks + output all full fit (18)."""
    use = _toy(8, [1] * 8, [4] * 8, 2, 1, 0)
    cases = {
        12: ((Device(3, 1), Device(6, 5)), {2, 4, 5, 6, 7}, [12, 12]),
        20: ((Device(3, 0), Device(6, 3)), {6, 7}, [16, 20]),
        30: ((Device(5, 0), Device(4, 0)), set(), [26, 18]),
    }
    for target, (devs, cpu, mem) in cases.items():
        got = fit_devices(2, 8, True, target, use, 1)
        assert got == devs and override_blocks(got, 8) == cpu and use(got) == mem
    # no surplus with every expert in host memory: step 3's dense-only layers stay (no step 4)
    assert fit_devices(2, 8, True, 12, use, 0) == (Device(3, 3), Device(6, 5))
    # as a dense model: whole layers back to front (device 1: output + k - 1 blocks, 5k - 2 <= 20, k = 4;
    # device 0: 1 + 5k <= 20, k = 3), no overrides, two blocks left in host memory
    assert fit_devices(2, 8, False, 20, use, 0) == (Device(3, 0), Device(4, 0))


@settings(max_examples=150, deadline=None)
@given(
    st.integers(2, 4),
    st.integers(1, 24),
    st.lists(st.integers(1, 40), min_size=24, max_size=24),
    st.lists(st.integers(0, 200), min_size=24, max_size=24),
    st.integers(1, 300),
    st.integers(0, 50),
    st.integers(0, 100),
    st.integers(10, 3000),
    st.booleans(),
)
def test_the_searches_equal_llamas_false_position(
    nd: int,
    n: int,
    dense: list[int],
    experts: list[int],
    output: int,
    compute: int,
    copy: int,
    target: int,
    surplus: bool,
) -> None:
    """For any monotone use (each block its own dense and expert bytes), gpumem's bisections end at the
    placement llama.cpp's false position ends at, in both steps, on 2 to 4 devices."""
    use = _toy(n, dense, experts, output, compute, copy)
    want = _llama_fit(nd, n, target, use, 1 if surplus else 0)
    assert fit_devices(nd, n, True, target, use, 1 if surplus else 0) == want


def test_the_order_of_placements_matches_a_published_log() -> None:
    """https://github.com/ggml-org/llama.cpp/issues/22319 (a DeepSeek-V4 fit on two GPUs, 43 blocks): step 3
    ends with "CUDA1 ...: 44 layers" (``id=1, n_layer=44, n_part=43``) and CUDA0 with 0 layers; step 4's first
    placement for device 0 is ``id=0, n_layer=43, n_part= 0`` with device 1 keeping one layer (the output
    layer). Device 1's memory in that log is what fits; device 0's target is below the 43 full layers."""
    toy = _toy(43, [1] * 43, [10] * 43, 5, 1, 0)
    step3 = fill_back_to_front(2, 43, True, 200, toy)
    assert step3 == (Device(0, 0), Device(44, 43))
    tried: list[tuple[Device, ...]] = []

    def use(devs: tuple[Device, ...]) -> list[int]:
        tried.append(devs)
        return toy(devs)

    convert_front_to_back(step3, 200, use)
    assert tried[0] == (Device(43, 0), Device(1, 0))


def _qwen(gpu: int, pp: int, ctx: int):
    run = make_run(
        engine="ollama", ollama_version="0.30+", weights="gguf-Q4_K_M", pp=pp, num_ctx=ctx, sched_spread=True
    )
    return estimate_inference(QWEN30, run, gpu * GiB)


def test_ollama_places_a_moe_model_over_two_gpus() -> None:
    """Qwen3-30B-A3B Q4_K_M, 32768 tokens on two 8 GiB GPUs (Ollama v0.30+: llama-server's --fit): every
    layer on the GPUs, the routed experts of some blocks in host memory, each GPU within its target; the
    host holds those experts; not a fit (experts in host memory)."""
    est = _qwen(8, 2, 32768)
    split = [int(k) for k in est.facts["llama_split"].split(",")]
    assert sum(split) == 49 and est.facts["offloaded"] == "49/49"
    n_cpu = est.facts["fit_cpu_expert_layers"]
    assert 0 < n_cpu < 48
    free = 8 * GiB - context_bytes("auto", None)
    assert all(s.peak_bytes <= free - 1024 * MiB for s in est.per_gpu)
    wb = run_weight_bytes(QWEN30, make_run(engine="llama.cpp", weights="gguf-Q4_K_M"), True)
    host = _experts_bytes(QWEN30, wb, frozenset(range(n_cpu)))
    blocks = [
        c.explain.inputs.get("blocks_experts_in_host_memory", 0)
        for s in est.per_gpu
        for c in s.components
        if c.key == "weights"
    ]
    assert sum(blocks) == n_cpu and est.facts["cpu_bytes"] > host
    assert not runtime("ollama").admits(est)
    # a larger GPU pair keeps more experts on the GPUs
    assert _qwen(12, 2, 32768).facts.get("fit_cpu_expert_layers", 0) < n_cpu
    # three GPUs: the experts of fewer blocks stay in host memory
    assert _qwen(8, 3, 32768).facts.get("fit_cpu_expert_layers", 0) < n_cpu
