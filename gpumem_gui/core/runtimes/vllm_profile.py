"""What vLLM's V1 worker measures before it sizes the KV cache, per rank: the profiled activation peak, the
memory outside torch's allocator, and the CUDA-graph pool; and vLLM's defaults that size them.

``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``: the KV cache gets
``gpu_memory_utilization x total - (weights + torch peak increase + non-torch increase)`` and, since v0.21
(``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``), minus the CUDA-graph pool too. The baseline snapshot is taken
after the CUDA context exists, so the context is not part of the non-torch increase.
"""

from __future__ import annotations

from math import ceil

from gpumem_gui.core.results.estimate import Component
from gpumem_gui.core.runtimes.base import component
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.runtimes.vllm_encoder import encoder_profile
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.units import GiB

# vllm/engine/arg_utils.py (_set_default_args): for the OpenAI server, GPUs of 70 GiB or more default to
# max_num_batched_tokens 8192 and max_num_seqs 1024, smaller GPUs to 2048 and 256.
LARGE_GPU_BYTES = 70 * GiB
DEFAULTS_LARGE_GPU = (8192, 1024)
DEFAULTS_SMALL_GPU = (2048, 256)
# without a GPU capacity: the defaults gpumem used before (8192 tokens, 256 sequences)
DEFAULTS_NO_GPU = (8192, 256)

# Non-torch increase of one worker over its start (cuBLAS/cuDNN workspaces, kernels loaded during the profile
# run): 0.11 GiB for Qwen2.5-0.5B and Qwen3.5-4B on an A100 (github.com/ovg-project/kvcached PR #448,
# measured table), 0.07 GiB (H100, vLLM 0.10) and 0.02 GiB (RTX 4090) in the published logs of
# validation/data/engine_logs/vllm.json.
NON_TORCH_BASE_BYTES = round(0.11 * GiB)
# Communicator buffers of one tensor-parallel rank outside torch (NCCL channels' P2P/NVLS buffers of the TP
# and world communicators, the custom all-reduce's 8 MiB IPC buffers, vllm/distributed/device_communicators/
# custom_all_reduce.py max_size): over NVLink/NVSwitch the published non-torch increase is 1.38 GiB
# (H200 TP2) and 0.95 GiB (B200 TP4), i.e. about 1.0 GiB above the single-GPU base; over PCIe (no custom
# all-reduce, NCCL through host memory) 0.21 GiB at TP8 on L40S, 0.1 GiB above the base
# (validation/data/engine_logs/vllm.json).
COMM_NVLINK_BYTES = round(1.0 * GiB)
COMM_PCIE_BYTES = round(0.1 * GiB)

# The sampler's dummy run holds, per logit (max_num_seqs x vocab): the gathered logits in the compute dtype,
# then fp32 logits 4 B, the top-k/top-p sort's values 4 B and int64 indices 8 B, the sorted softmax 4 B, the
# top-p mask 1 B, the logits scattered back 4 B, the probabilities 4 B, the exponential noise 4 B and the
# logprobs 4 B (vllm/v1/sample/sampler.py, ops/topk_topp_sampler.py): 37 B + the compute dtype.
SAMPLER_BYTES_PER_LOGIT = 37

# CUDA-graph pool: "took 0.65 GiB" for the 67 capture sizes of 34-layer gemma-3-4b (vLLM PR #21489 log), so
# about 0.29 MiB per layer and captured size.
CUDAGRAPH_BYTES_PER_LAYER_SIZE = round(0.65 * GiB / (34 * 67))
CUDAGRAPH_MAX_CAPTURE = 512  # vllm/config/compilation.py: max_cudagraph_capture_size <= 512 by default


# The V0 engine (vllm/engine/arg_utils.py EngineArgs of v0.2 to v0.10): max_num_seqs 256 on every GPU;
# vllm/config.py SchedulerConfig.__post_init__ (v0.6.6): max_num_batched_tokens = max(max_model_len, 2048),
# or 2048 with chunked prefill, which EngineArgs.create_engine_config turns on for max_model_len > 32K
# ("Chunked prefill is enabled by default for models with max_model_len > 32K") unless the model has a
# sliding window. (Before v0.6.6 the chunked default was 512 tokens; set --max-num-batched-tokens then.)
V0_MAX_NUM_SEQS = 256
V0_MIN_BATCHED_TOKENS = 2048
V0_CHUNKED_PREFILL_ABOVE = 32 * 1024
V0_CHUNKED_TOKENS = 2048
# vllm/worker/model_runner.py (v0.4 to v0.10): _BATCH_SIZES_TO_CAPTURE = [1, 2, 4] + [8 * i for i in
# range(1, 33)], captured up to _get_graph_batch_size(max_num_seqs) (max_num_seqs rounded up to 4, then 8)
V0_CAPTURE_SIZES = (1, 2, 4, *range(8, 257, 8))


def graphs_after_kv(run: InferenceRun) -> bool:
    """Whether the CUDA graphs are captured after the KV cache is allocated, outside the
    gpu_memory_utilization budget: always in V0 (vllm/worker/worker.py initialize_cache: _init_cache_engine,
    then _warm_up_model captures), in V1 unless VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS
    (profile_cudagraphs)."""
    return run.vllm_engine == "v0" or not run.profile_cudagraphs


def batch_defaults(
    run: InferenceRun, capacity: int | None, max_len: int = 0, windowed: bool = False
) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs): the run's own, else the engine's default: V1 by the GPU's
    size, V0 from max_model_len (chunked prefill above 32K tokens for a model without sliding windows)."""
    if run.vllm_engine == "v0":
        chunked = max_len > V0_CHUNKED_PREFILL_ABOVE and not windowed
        tokens = V0_CHUNKED_TOKENS if chunked else max(max_len or run.tokens, V0_MIN_BATCHED_TOKENS)
        return run.max_num_batched_tokens or tokens, run.max_num_seqs or V0_MAX_NUM_SEQS
    if capacity is None:
        tokens, seqs = DEFAULTS_NO_GPU
    else:
        tokens, seqs = DEFAULTS_LARGE_GPU if capacity >= LARGE_GPU_BYTES else DEFAULTS_SMALL_GPU
    return run.max_num_batched_tokens or tokens, run.max_num_seqs or seqs


def _v0_graph_batch(max_num_seqs: int) -> int:
    """vllm/worker/model_runner.py _get_graph_batch_size: 1, 2, 4, else rounded up to a multiple of 8."""
    if max_num_seqs <= 2:
        return max_num_seqs
    if max_num_seqs <= 4:
        return 4
    return -(-max_num_seqs // 8) * 8


def capture_sizes(run: InferenceRun, max_num_seqs: int) -> tuple[int, ...]:
    """The batch sizes vLLM captures: V1 1, 2, 4, every 8 below 256, every 16 from 256, up to the maximum
    (``--max-cudagraph-capture-size``, default min(2 x max_num_seqs, 512)); V0 its fixed list up to the
    padded max_num_seqs; none with --enforce-eager."""
    if run.enforce_eager:
        return ()
    if run.vllm_engine == "v0":
        top = _v0_graph_batch(max_num_seqs)
        return tuple(s for s in V0_CAPTURE_SIZES if s <= top)
    top = run.max_cudagraph_capture_size or min(2 * max_num_seqs, CUDAGRAPH_MAX_CAPTURE)
    sizes = [s for s in (1, 2, 4) if s <= top]
    sizes += list(range(8, min(top, 255) + 1, 8)) + list(range(256, top + 1, 16))
    return tuple(sizes)


def _forward_bytes(spec: ModelSpec, run: InferenceRun, tokens: int) -> int:
    """One dummy forward of ``tokens`` tokens on one TP rank: the residual stream and its norm (not split),
    and the largest split intermediate, the MLP's gate/up/act or attention's q/k/v + output."""
    tp, dt = run.tp, run.dt
    f = (
        spec.moe.expert_intermediate_size * spec.moe.experts_per_token
        + spec.moe.shared_expert_intermediate_size
        if spec.moe
        else spec.intermediate_size
    )
    qkv = spec.q_width + 2 * spec.kv_width
    per_token = 2 * spec.hidden_size * dt + max(3 * f * dt // tp, (qkv + spec.q_width) * dt // tp)
    return tokens * per_token


def activation(
    spec: ModelSpec, run: InferenceRun, tokens: int, seqs: int, last_stage: bool, max_len: int = 0
) -> Component:
    """The profiled torch peak of one rank: the larger of the dummy forward and (on the last pipeline stage)
    the sampler's dummy run over ``min(max_num_seqs, max_num_batched_tokens)`` requests of the full vocabulary
    (logits are gathered to every TP rank, so the sampler is not split); for a vision model, the encoder
    profile before them (first stage, :mod:`.vllm_encoder`): the tower's own peak, and its inputs and outputs
    held through both runs."""
    forward = _forward_bytes(spec, run, tokens)
    reqs = min(seqs, tokens)
    sampler = reqs * spec.vocab_size * (run.dt + SAMPLER_BYTES_PER_LOGIT) if last_stage else 0
    enc = encoder_profile(spec, run, tokens, seqs, max_len or run.tokens)
    if enc is None:
        return component(
            "activations",
            "profiled activation peak",
            max(forward, sampler),
            "max(T x (2h + max(3F, qkv + q) / tp) x dt, min(max_num_seqs, T) x vocab x (dt + 37 B)): the "
            "dummy forward of max_num_batched_tokens, or the sampler's dummy run (last pipeline stage)",
            "vllm/v1/worker/gpu_model_runner.py profile_run, _dummy_run, _dummy_sampler_run",
            T=tokens,
            max_num_seqs=seqs,
            forward_bytes=forward,
            sampler_bytes=sampler,
            vocab=spec.vocab_size,
        )
    # pp 1: one rank runs the encoder, the forward and the sampler; pp > 1: the first stage the encoder and
    # the forward, the last the sampler (the estimate takes the fuller)
    lm = max(forward, sampler) if run.pp == 1 else forward
    peak = max(enc.tower_peak, enc.held + lm, sampler)
    return component(
        "activations",
        "profiled activation peak (with the vision encoder's profile)",
        peak,
        "max(tower peak, pixel inputs + encoder outputs + max(dummy forward, sampler run)): images = "
        "min(max(T, tokens per image) // tokens per image, max_num_seqs x images per prompt) of the largest "
        "image the processor passes, run through the tower at once (the transformers tower's replay for "
        "vLLM's kernels; unsharded with tp > 1, an upper side); their inputs and "
        "outputs stay allocated through the text model's dummy forward and the sampler run (first pipeline "
        "stage; the sampler runs on the last)",
        "vllm/v1/worker/gpu_model_runner.py profile_run (batched_dummy_mm_inputs, embed_multimodal, "
        "encoder_cache tmp_i until after the sampler run); vllm/multimodal/encoder_budget.py _get_max_items",
        T=tokens,
        max_num_seqs=seqs,
        forward_bytes=forward,
        sampler_bytes=sampler,
        vocab=spec.vocab_size,
        images=enc.items,
        image_tokens=enc.item_tokens,
        image_side=enc.image_side,
        pixel_input_bytes=enc.inputs,
        encoder_cache_bytes=enc.outputs,
        tower_peak_bytes=enc.tower_peak,
        tower_peak_at=enc.tower_where or "not modelled",
    )


def tp_link(run: InferenceRun, capacity: int | None) -> str:
    """The run's interconnect; ``auto``: NVLink for GPUs of 70 GiB or more (the SXM/NVSwitch parts)."""
    if run.tp_link != "auto":
        return run.tp_link
    return "nvlink" if capacity is not None and capacity >= LARGE_GPU_BYTES else "pcie"


def non_torch(run: InferenceRun, capacity: int | None) -> Component:
    """Memory one worker adds outside torch's allocator: the base of one GPU, plus the communicators'
    buffers when the rank has tensor-parallel peers."""
    link = tp_link(run, capacity) if run.tp > 1 else "none"
    comm = {"nvlink": COMM_NVLINK_BYTES, "pcie": COMM_PCIE_BYTES}.get(link, 0)
    return component(
        "non_torch",
        "non-torch memory (cuBLAS workspaces, NCCL and all-reduce buffers)",
        NON_TORCH_BASE_BYTES + comm,
        "0.11 GiB per worker + communicator buffers with TP peers (1.0 GiB over NVLink, 0.1 GiB over "
        "PCIe); the CUDA context is in vLLM's baseline, not in this increase",
        "vllm/v1/worker/gpu_worker.py determine_available_memory (non_torch_increase); calibrated on "
        "published logs (validation/data/engine_logs/vllm.json)",
        tp=run.tp,
        link=link,
    )


def cudagraphs(spec: ModelSpec, run: InferenceRun, seqs: int, layers: int) -> Component:
    """The CUDA-graph pool of one rank: per layer and captured batch size."""
    sizes = capture_sizes(run, seqs)
    return component(
        "cudagraph",
        "CUDA graphs",
        layers * len(sizes) * CUDAGRAPH_BYTES_PER_LAYER_SIZE,
        "layers x captured sizes x 0.29 MiB (0 with --enforce-eager)",
        "vllm/v1/worker/gpu_model_runner.py capture_model; vLLM PR #21489 log (gemma-3-4b: 0.65 GiB for "
        "67 sizes x 34 layers)",
        layers=layers,
        capture_sizes=len(sizes),
        largest=max(sizes, default=0),
        enforce_eager=run.enforce_eager,
    )


def stage_layers(spec: ModelSpec, pp: int) -> int:
    """Layers of the fullest pipeline stage (an even split; a remainder makes some stages one layer
    fuller, and the estimate takes the fullest)."""
    return ceil(spec.num_layers / pp)
