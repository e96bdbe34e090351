"""llama.cpp's compute buffer on the GPU: what ggml's graph allocator keeps live at the largest point of the
worst-case graph that ``llama_context`` reserves (``src/llama-context.cpp`` ``graph_reserve``: one micro-batch
of ``n_ubatch`` tokens, every token an output, every KV cell visible).

``ggml/src/ggml-alloc.c`` (``ggml_gallocr_alloc_graph``) frees a tensor after its last consumer and reuses
the memory, so the buffer is the largest stage, not a sum. Each stage counts f32 tensors of ``n_ubatch``
rows (``row`` = one hidden state, ``n_ubatch x hidden x 4 B``):

- attention without flash attention: the scores ``kq`` (``n_kv x n_ubatch x n_head``, f32:
  ``llama-graph.cpp`` ``build_attn_mha`` sets ``GGML_PREC_F32``) and their softmax in the same memory
  (``ggml_op_can_inplace`` lists ``GGML_OP_SOFT_MAX``, and ``kq`` has one consumer), the KQ masks (f32
  ``n_kv x pad(n_ubatch, GGML_KQ_MASK_PAD)``, one per KV cache, live from the first layer to the last) and
  four rows that do not grow with the context. A published Ollama (llama runner) log of Llama 3.2 3B at
  ``n_ctx`` 8192 without flash attention: ``CUDA0 compute buffer size = 424.00 MiB`` = 384 (kq) + 16 (mask)
  + 4 x 6 MiB; the scores and a separate softmax would be 808 MiB;
- with flash attention: per-head tiles only, plus the four rows;
- the FFN: gate and up (x the experts used per token) and two rows;
- the output: the logits of every token (``n_ubatch x vocab``) and the normed hidden state.

Partial offload (the output layer in host memory): ``ggml_backend_sched`` runs an op whose weight is in host
memory on the GPU when the GPU backend asks for it (``ggml-backend.c``
``ggml_backend_sched_backend_id_from_cur``, "1.off"; CUDA's ``offload_op``: a batch of at least 32), copying
the weight into the GPU's compute buffer (llama.cpp PR #6083: "the weights are now copied to VRAM in the
compute buffer"). The output stage then also holds the output weight, and a layer left in host memory its
weights; below 32 tokens the output stage runs on the CPU (its host compute buffer) and not on the GPU.
"""

from __future__ import annotations

from math import ceil

from gpumem_gui.core.results.estimate import Component
from gpumem_gui.core.runtimes.base import component
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.model import ModelSpec

# ggml/include/ggml.h GGML_KQ_MASK_PAD: the KQ mask's token rows are padded to it (llama-graph.cpp
# build_attn_inp_kv: ggml_new_tensor_4d(F32, n_kv, GGML_PAD(n_tokens, GGML_KQ_MASK_PAD), 1, n_stream))
KQ_MASK_PAD = 64
# ggml/src/ggml-cuda/ggml-cuda.cu ggml_backend_cuda_device_offload_op: min_batch_size = 32; a batch that
# large runs its host-weight ops on the GPU (ggml_backend_sched op_offload, on by default)
OP_OFFLOAD_MIN_BATCH = 32


def compute_buffer(
    spec: ModelSpec,
    run: InferenceRun,
    caches: tuple[int, ...],
    output: bool = True,
    output_weight: int = 0,
    host_layer: int = 0,
) -> Component:
    """The GPU's compute buffer: its largest graph stage (see the module docstring).

    ``caches``: the cells of each KV cache the attention layers read (the full-attention cache, and the
    sliding-window cache of llama_kv_cache_iswa), one KQ mask each. ``output`` False: the GPU does not run
    the output stage (a GPU of a layer split without the output layer, or the output layer in host memory
    below the op-offload batch). ``output_weight``: the output weight (and norm) copied to the GPU for the
    output stage (output layer in host memory, op offload); ``host_layer``: the weights of the largest
    layer left in host memory, copied to the GPU while that layer runs there (0: none)."""
    n_ctx = run.batch * run.tokens
    ub = min(run.n_ubatch, n_ctx)
    h = spec.hidden_size
    f = spec.moe.expert_intermediate_size * spec.moe.experts_per_token if spec.moe else spec.intermediate_size
    row = ub * h * 4  # one hidden-state tensor
    n_kv = max(caches, default=n_ctx)
    masks = 0 if run.flash_attn else sum(cells * ceil(ub / KQ_MASK_PAD) * KQ_MASK_PAD * 4 for cells in caches)
    kq = 0 if run.flash_attn else n_kv * ub * spec.num_attention_heads * 4
    layer = max(2 * ub * f * 4 + 2 * row, kq + 4 * row) + masks
    stages = {
        # logits of the micro-batch and the normed hidden state feeding them (+ the copied output weight)
        "output": ub * spec.vocab_size * 4 + row + output_weight,
        # gate and up projections (x experts used per token) and their product, the masks still live
        "ffn": 2 * ub * f * 4 + 2 * row + masks,
        # kq (its softmax in place) + masks + q/k/v/out rows; with flash attention only the rows
        "attention": kq + masks + 4 * row,
    }
    if host_layer:
        stages["host_layer"] = host_layer + layer  # a host layer's weights copied in, then its stages
    if not output:
        del stages["output"]
    stage = max(stages, key=lambda k: stages[k])
    return component(
        "compute_buffer",
        "compute buffer",
        stages[stage],
        "largest graph stage of one micro-batch, f32: output (n_ubatch x vocab + row, + the output weight "
        "copied in when it stays in host memory), FFN (2 x n_ubatch x F_used + 2 rows), attention (4 rows; "
        "without flash attention + n_kv x n_ubatch x heads with the softmax in place, + the KQ masks "
        "n_kv x pad(n_ubatch, 64) per cache); row = n_ubatch x hidden x 4 B",
        "ggml/src/ggml-alloc.c (buffers reused between stages, GGML_OP_SOFT_MAX in place); "
        "src/llama-graph.cpp build_attn_mha / build_attn_inp_kv; ggml-backend.c op offload; checked against "
        "published llama.cpp logs (docs/validation.md)",
        n_ubatch=ub,
        flash_attn=run.flash_attn,
        stage=stage,
    )
