"""The geometry of linear-attention (recurrent) token mixers: what their weights are and what fixed state one
sequence keeps in the cache, whatever its length.

Only the gated DeltaNet of Qwen3-Next / Qwen3.5 is described so far
(``models/qwen3_next/modeling_qwen3_next.py``
``Qwen3NextGatedDeltaNet``, transformers 5.24); :mod:`gpumem_gui.core.spec.state` turns it into bytes.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_Size = Annotated[int, Field(gt=0, le=1 << 31)]


class LinearAttentionSpec(BaseModel):
    """A gated DeltaNet layer (``Qwen3NextGatedDeltaNet.__init__``): q/k heads of ``key_head_dim``, v heads of
    ``value_head_dim``, a depthwise causal conv of ``conv_kernel`` taps over q, k and v, a recurrent state of
    ``value_heads x key_head_dim x value_head_dim`` per sequence."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["gated_deltanet", "lightning", "kda"] = Field(
        "gated_deltanet",
        description="gated_deltanet: Qwen3NextGatedDeltaNet; lightning: MiniMaxLightningAttention "
        "(models/minimax/modeling_minimax.py): qkv_proj, SiLU, blockwise linear attention with a per-head "
        "decay, no conv (conv_kernel 0), a [heads, head_dim, head_dim] state in the activation dtype; kda: "
        "Kimi Delta Attention (models/kimi_linear/modeling_kimi_linear.py KimiLinearDeltaAttention, "
        "BailingHybridDeltaAttention): q/k/v projections of equal heads, a per-channel decay, an fp32 state",
    )
    key_heads: _Size = Field(description="linear_num_key_heads (Qwen3NextConfig default 16)")
    value_heads: _Size = Field(description="linear_num_value_heads (Qwen3NextConfig default 32)")
    key_head_dim: _Size = Field(description="linear_key_head_dim (Qwen3NextConfig default 128)")
    value_head_dim: _Size = Field(description="linear_value_head_dim (Qwen3NextConfig default 128)")
    conv_kernel: Annotated[int, Field(ge=0, le=1 << 31)] = Field(
        description="linear_conv_kernel_dim (Qwen3NextConfig default 4); 0: no conv (lightning)"
    )
    chunk_size: _Size = Field(
        64, description="torch_chunk_gated_delta_rule(chunk_size=64): the prefill pads to a multiple of it"
    )
    split_projections: bool = Field(
        False,
        description="separate in_proj_qkv / in_proj_z / in_proj_b / in_proj_a (Qwen3_5GatedDeltaNet) instead "
        "of the fused, head-interleaved in_proj_qkvz / in_proj_ba (Qwen3NextGatedDeltaNet)",
    )

    kda_gates: Literal["low_rank", "full", "full_safe"] = Field(
        "low_rank",
        description="KDA only: low_rank: forget and output gates through a head_dim bottleneck (KimiLinear"
        "ForgetGate f_a_proj/f_b_proj, g_a_proj/g_b_proj, fp32 decay); full: one hidden -> heads x head_dim "
        "projection each (BailingHybridForgetGate f_proj, g_proj; the decay cast to the activation dtype); "
        "full_safe: the same, bounded (kda_safe_gate: lower_bound * sigmoid)",
    )

    @model_validator(mode="after")
    def _check(self) -> LinearAttentionSpec:
        if self.kind in ("gated_deltanet", "kda") and self.conv_kernel < 1:
            raise ValueError(f"a {self.kind} layer needs a conv kernel of at least 1")
        if self.kind == "kda" and (
            self.key_heads != self.value_heads or self.key_head_dim != self.value_head_dim
        ):
            raise ValueError("KDA has equal q/k/v heads and widths (linear_num_heads x linear_head_dim)")
        if self.kind == "lightning" and (
            self.key_heads != self.value_heads or self.key_head_dim != self.value_head_dim or self.conv_kernel
        ):
            raise ValueError("lightning attention has equal q/k/v heads and widths and no conv")
        if self.value_heads % self.key_heads:
            raise ValueError(
                f"linear value heads ({self.value_heads}) must be a multiple of linear key heads "
                f"({self.key_heads})"
            )
        return self

    @property
    def key_dim(self) -> int:
        return self.key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise conv: q, k and v concatenated (``key_dim * 2 + value_dim``)."""
        return 2 * self.key_dim + self.value_dim

    @property
    def groups(self) -> int:
        """Value heads per key head (the GVA ratio ``num_v_heads // num_k_heads``)."""
        return self.value_heads // self.key_heads

    @property
    def conv_state_elems(self) -> int:
        """``LinearAttentionLayer.lazy_initialization``: zeros ``(batch, conv_dim, kernel)`` per sequence."""
        return self.conv_dim * self.conv_kernel

    @property
    def recurrent_state_fp32(self) -> bool:
        """The gated delta rule returns an fp32 state; lightning attention keeps its ``K^T V`` sums in the
        dtype of the values (``torch.zeros(..., dtype=value_states.dtype)``); KDA's cache keeps
        ``last_recurrent_state.to(torch.float32)`` (KimiLinearDeltaAttention.forward)."""
        return self.kind != "lightning"

    @property
    def recurrent_state_elems(self) -> int:
        """The recurrent state ``(batch, num_v_heads, k_head_dim, v_head_dim)`` per sequence."""
        return self.value_heads * self.key_head_dim * self.value_head_dim


class ShortConvSpec(BaseModel):
    """LFM2's gated short convolution (``models/lfm2/modeling_lfm2.py`` ``Lfm2ShortConv``): ``in_proj`` to
    B, C, x (3 x hidden), a depthwise causal conv of ``kernel`` taps over ``B * x``, ``C *`` its output,
    ``out_proj``; its cache layer keeps a conv state ``(batch, hidden, kernel)`` and no recurrent state."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kernel: _Size = Field(description="conv_L_cache (Lfm2Config default 3)")
    bias: bool = Field(False, description="conv_bias: the conv, in_proj and out_proj carry biases")


# the layer types that keep no per-token keys and values: a fixed state per sequence instead (transformers
# cache_utils.py: LinearAttentionLayer for the gated DeltaNet, the short conv and Mamba-2), or nothing (an
# MLP-only layer of NemotronHBlock, whose cache layer stays empty; a cross-attention layer, which a text-only
# forward skips and whose cache layer stays empty too: MllamaTextModel.forward, spec/cross_attention.py)
STATE_LAYER_TYPES = frozenset({"linear_attention", "conv", "mamba", "mlp", "cross_attention"})
