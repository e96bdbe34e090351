"""The serving engines' recurrent-state pools of hybrid models (linear-attention, Mamba and short-conv
layers beside attention layers): what one sequence slot holds in each engine, from the engines' own code.

llama.cpp (``src/llama-model.cpp`` ``create_memory``: a hybrid model gets ``llama_memory_hybrid``, a KV
cache of ``n_ctx`` cells for the attention layers only, ``filter_attn = !is_recurrent(il)``, plus
``llama_memory_recurrent`` for the recurrent layers, ``filter_recr = is_recurrent(il)``; an MLP-only layer
of Nemotron-H has neither): ``src/llama-memory-recurrent.cpp`` gives each recurrent layer an ``r`` tensor
of ``n_embd_r()`` and an ``s`` tensor of ``n_embd_s()`` elements per cell, ``mem_size = max(1,
n_seq_max)`` cells, both ``GGML_TYPE_F32`` (``recurrent_type_k/v``), on the layer's device when
``offload_kqv``. The widths are ``src/llama-hparams.cpp``'s: ``n_embd_r = (ssm_d_conv - 1) x (ssm_d_inner
+ 2 x ssm_n_group x ssm_d_state)`` (the conv's last ``kernel - 1`` inputs; LFM2: ``n_embd x (L_cache -
1)``) and ``n_embd_s = ssm_d_state x ssm_d_inner``; for the gated DeltaNet ``convert_hf_to_gguf.py``
writes ``ssm_d_inner`` = value heads x value dim, ``ssm_n_group`` = key heads, ``ssm_d_state`` = key dim
(the qwen35 GGUF metadata: ssm.inner_size, ssm.group_count, ssm.state_size, ssm.conv_kernel), so ``r`` is
the conv over q, k, v and ``s`` the ``[v_heads, k_dim, v_dim]`` state.

vLLM V1 (``vllm/model_executor/layers/mamba/mamba_utils.py`` ``MambaStateShapeCalculator``,
``MambaStateDtypeCalculator``): each state layer keeps one page per request (``MambaSpec``, ``block_size
= max_model_len`` without prefix caching, which vLLM turns off for hybrids) holding its conv state
``(kernel - 1, conv_dim / tp)`` in the ``mamba_cache_dtype`` (auto: the model dtype) and its temporal
state in the ``mamba_ssm_cache_dtype`` (auto: the conv state's dtype; KDA: fp32; float32 where the
model's config hook says so: Nemotron-H, ``NemotronHForCausalLMConfig``, and a config's own
``mamba_ssm_dtype``, ArchTraits.vllm_ssm_state_fp32). :func:`vllm_attention_block_size` is
``HybridAttentionMambaModelConfig.verify_and_update_config`` (``platforms/interface.py``
``_align_hybrid_block_size`` in newer releases); the groups and what one request takes:
:func:`gpumem_gui.core.runtimes.vllm_kv.state_layout`.
"""

from __future__ import annotations

from collections.abc import Iterable
from math import ceil
from typing import TYPE_CHECKING

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.spec.kinds import RecurrentState
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.mamba import Mamba1Spec
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.state import has_state

if TYPE_CHECKING:
    from gpumem_gui.core.runtimes.base import Runtime

# llama-model.cpp create_memory: recurrent_type_k / recurrent_type_v = GGML_TYPE_F32
LLAMACPP_STATE_BYTES = 4
# FlashAttentionBackend.get_supported_kernel_block_sizes: MultipleOf(16), the floor of the aligned block size
VLLM_KERNEL_BLOCK_ALIGNMENT = 16
# HybridAttentionMambaModelConfig.verify_and_update_config (vllm/model_executor/models/config.py): MLA
# backends align the raised block size to 64 (CUTLASS_MLA to 128, not modelled)
VLLM_MLA_KERNEL_BLOCK_ALIGNMENT = 64
# MambaStateDtypeCalculator.kda_state_dtype: the KDA recurrent state is always fp32
FP32_BYTES = 4


def state_layer_indices(spec: ModelSpec) -> tuple[int, ...]:
    """The layers that keep a fixed state per sequence (linear attention, Mamba, short conv): the layers of
    the model's RecurrentState kinds."""
    return tuple(sorted(i for kind in model_kinds(spec).state for i in kind.layers))


def attention_layer_indices(spec: ModelSpec) -> tuple[int, ...]:
    """The layers with a per-token KV cache (the attention kinds'; not a state layer, nor Nemotron-H's
    MLP; a Falcon-H1 layer is attention and Mamba)."""
    return tuple(sorted(i for kind in model_kinds(spec).attention for i in kind.layers))


def attention_layer_count(spec: ModelSpec) -> int:
    """How many layers have a per-token KV cache (:func:`attention_layer_indices`)."""
    return len(attention_layer_indices(spec))


def check_engine_state(spec: ModelSpec, rt: Runtime, pp: int, engines: Iterable[Runtime]) -> None:
    """The hybrids an engine's profile models (one-line error otherwise), asked of the engine's capabilities
    (:meth:`Runtime.supports` on each state kind, :meth:`Runtime.state_refusal` for the error,
    :meth:`Runtime.check_state` for its own limits): llama.cpp's recurrent cells for the gated DeltaNet,
    Mamba-1/2 and short convolutions (Ollama v0.12.10's llama runner: Mamba-1/2 and short convolutions);
    vLLM's hybrid allocator; ``engines``: every runtime, to name those that size some state."""
    if not has_state(spec):
        return
    unsupported = [k for k in model_kinds(spec).state if not rt.supports(k)]
    if unsupported and rt.state_mixers:
        raise GpumemInputError(rt.state_refusal(unsupported[0]), field="engine")
    rt.check_state(spec, pp)
    if unsupported:
        names = [r.name for r in engines if r.state_mixers]
        raise GpumemInputError(
            f"{rt.name}: the recurrent-state pool of a hybrid model (linear-attention layers) is not "
            f"modelled for this engine yet; use the {', '.join(names[:-1])} or {names[-1]} engine",
            field="engine",
        )


def llamacpp_state_widths(spec: ModelSpec, kind: RecurrentState) -> tuple[int, int]:
    """(``n_embd_r``, ``n_embd_s``) of one layer of a state kind (Falcon-H1's layers too: filter_recr takes
    every layer). KDA (Kimi-Linear, llama.cpp PR #18755, January 2026: ``LLM_ARCH_KIMI_LINEAR``) and
    lightning attention (MiniMax-Text-01 / M1, PR #27018, August 2026: ``LLM_ARCH_MINIMAX_01``, whose
    ``load_arch_hparams`` sets ``n_embd_head_la`` and reads no ``ssm_d_conv``) have their own branches in
    ``llama_hparams::n_embd_r`` / ``n_embd_s``; their ``n_head()`` is the model's head count, which equals
    the linear layers' heads in both configs (Kimi-Linear 32 x 128, MiniMax-Text-01 64 x 128)."""
    la, sc, mb = spec.linear_attention, spec.short_conv, spec.mamba
    if kind.mixer == "short_conv" and sc is not None:
        return spec.hidden_size * (sc.kernel - 1), 0
    if kind.mixer == "mamba1" and isinstance(mb, Mamba1Spec):  # ssm_n_group 0
        return (mb.conv_kernel - 1) * mb.inner, mb.state_size * mb.inner
    if kind.mixer == "mamba2" and mb is not None:
        return (mb.conv_kernel - 1) * mb.conv_dim, mb.state_size * mb.inner
    assert la is not None
    if kind.mixer == "kda":  # n_embd_head_kda: r = 3 x (ssm_d_conv - 1) x n_head x head_dim (q, k, v convs)
        return 3 * (la.conv_kernel - 1) * la.value_dim, la.value_head_dim * la.value_dim
    if kind.mixer == "lightning":  # n_embd_head_la: no conv, r 0 (ssm_d_conv unset); s = head_dim^2 x n_head
        return 0, la.value_head_dim * la.value_dim
    return (la.conv_kernel - 1) * la.conv_dim, la.key_head_dim * la.value_dim  # gated DeltaNet


def llamacpp_state_buffers(spec: ModelSpec, n_seq: int, first_gpu: int, offload: bool) -> dict[str, int]:
    """llama_memory_recurrent's buffers: ``r`` and ``s`` bytes over the recurrent layers, and how much of them
    sits on the GPU (layers from ``first_gpu`` on, when ``offload``) and in host memory."""
    cells = max(1, n_seq)
    out = {"r_bytes": 0, "s_bytes": 0, "gpu_bytes": 0, "host_bytes": 0}
    for kind in model_kinds(spec).state:
        r, s = llamacpp_state_widths(spec, kind)
        r_b, s_b = r * cells * LLAMACPP_STATE_BYTES, s * cells * LLAMACPP_STATE_BYTES
        for i in kind.layers:
            out["r_bytes"] += r_b
            out["s_bytes"] += s_b
            out["gpu_bytes" if offload and i >= first_gpu else "host_bytes"] += r_b + s_b
    out["cells"] = cells
    return out


def vllm_ssm_bytes(spec: ModelSpec, conv_bytes: int) -> int:
    """Bytes of one temporal-state element: ``mamba_ssm_cache_dtype`` auto is the conv state's dtype, except
    KDA (fp32) and architectures whose vLLM config hook defaults it to float32 (Nemotron-H)."""
    la = spec.linear_attention
    if (la is not None and la.kind == "kda") or spec.traits.vllm_ssm_state_fp32:
        return FP32_BYTES
    return conv_bytes


def vllm_state_page(spec: ModelSpec, tp: int, conv_bytes: int) -> int:
    """Bytes of one state layer's page on one TP rank (``MambaSpec.page_size_bytes``, unpadded): the conv
    state ``(kernel - 1) x conv_dim / tp`` in the model dtype and the temporal state ``/ tp`` in the SSM
    dtype; the largest over the model's state layer types."""
    la, sc, mb = spec.linear_attention, spec.short_conv, spec.mamba
    ssm = vllm_ssm_bytes(spec, conv_bytes)
    pages = [0]
    if la is not None and la.kind == "lightning":  # linear_attention_state_shape: (heads / tp, d, d)
        pages.append(la.recurrent_state_elems // tp * conv_bytes)
    elif la is not None:  # gated_delta_net_state_shape, kda_state_shape
        pages.append(
            (la.conv_kernel - 1) * la.conv_dim // tp * conv_bytes + la.recurrent_state_elems // tp * ssm
        )
    if sc is not None:  # short_conv_state_shape: (L_cache - 1, hidden / tp)
        pages.append((sc.kernel - 1) * spec.hidden_size // tp * conv_bytes)
    if isinstance(mb, Mamba1Spec):  # mamba1_state_shape
        pages.append(
            (mb.conv_kernel - 1) * mb.inner // tp * conv_bytes + mb.inner // tp * mb.state_size * ssm
        )
    elif mb is not None:  # mamba2_state_shape: groups replicated up to tp when tp does not divide them
        groups = mb.groups if mb.groups % tp == 0 else tp
        conv_dim = mb.inner + 2 * groups * mb.state_size
        pages.append(
            (mb.conv_kernel - 1) * conv_dim // tp * conv_bytes
            + mb.heads // tp * mb.head_dim * mb.state_size * ssm
        )
    return max(pages)


def vllm_attention_block_size(
    mamba_page: int, attn_page_1_token: int, block_size: int, kernel_align: int = VLLM_KERNEL_BLOCK_ALIGNMENT
) -> int:
    """The attention block size vLLM sets so that one attention page (all tokens of a block, one layer) is at
    least one state page: ``align x cdiv(mamba_page, align x attn_page_1_token)`` with ``align`` the
    backend's kernel block alignment or the user's block size if larger; the user's when already enough."""
    if not mamba_page or not attn_page_1_token:
        return block_size
    align = max(kernel_align, block_size)
    return max(block_size, align * ceil(mamba_page / (align * attn_page_1_token)))
