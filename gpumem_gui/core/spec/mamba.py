"""The geometry of a Mamba-2 token mixer (``models/nemotron_h/modeling_nemotron_h.py``
``NemotronHMamba2Mixer``, transformers 5.24): its weights and the fixed state one sequence keeps in the
cache, whatever its length; and the parameter tensors of a model whose layers hold one sub-layer each
(``NemotronHBlock``: one pre-norm, then a Mamba-2 mixer, attention or an MLP).

:mod:`gpumem_gui.core.spec.state` turns the state into bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from gpumem_gui.core.spec.model import ModelSpec
    from gpumem_gui.core.spec.params import Tensor

_Size = Annotated[int, Field(gt=0, le=1 << 31)]


class Mamba2Spec(BaseModel):
    """``NemotronHMamba2Mixer.__init__``: ``heads`` x ``head_dim`` channels (the intermediate size), B and C
    of ``groups`` x ``state_size`` each, a depthwise causal conv of ``conv_kernel`` taps over x, B and C,
    ``in_proj`` to (gate, x B C, dt), per-head ``dt_bias`` / ``A_log`` / ``D``, a grouped gated RMSNorm,
    ``out_proj``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["mamba2"] = "mamba2"
    heads: _Size = Field(description="mamba_num_heads (NemotronHConfig default 128)")
    head_dim: _Size = Field(description="mamba_head_dim (NemotronHConfig default 64)")
    state_size: _Size = Field(description="ssm_state_size (NemotronHConfig default 128)")
    groups: _Size = Field(description="n_groups (NemotronHConfig default 8)")
    conv_kernel: _Size = Field(description="conv_kernel (NemotronHConfig default 4)")
    chunk_size: _Size = Field(
        description="chunk_size (NemotronHConfig default 128): mamba2_chunk_scan pads the prompt to a "
        "multiple of it"
    )
    conv_bias: bool = Field(description="use_conv_bias (NemotronHConfig default True)")
    proj_bias: bool = Field(description="use_bias (NemotronHConfig default False): in_proj and out_proj")
    gated_norm: bool = Field(
        True,
        description="the grouped gated RMSNorm (and its weight); without it the scan output is multiplied by "
        "silu(gate) (FalconH1Mixer with mamba_rms_norm false)",
    )
    mup: bool = Field(
        False,
        description="FalconH1Mixer: the input times ssm_in_multiplier and in_proj's output times the "
        "mup_vector buffer (projection-wide, the weights' dtype), each a new tensor",
    )

    @model_validator(mode="after")
    def _check(self) -> Mamba2Spec:
        if self.heads % self.groups:
            raise ValueError(f"mamba heads ({self.heads}) must be a multiple of n_groups ({self.groups})")
        return self

    @property
    def inner(self) -> int:
        """``intermediate_size = mamba_num_heads * mamba_head_dim``."""
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """``intermediate_size + 2 * n_groups * ssm_state_size``: the conv's channels (x, B, C)."""
        return self.inner + 2 * self.groups * self.state_size

    @property
    def projection(self) -> int:
        """``in_proj`` outputs: gate, x B C and dt (one per head)."""
        return self.inner + self.conv_dim + self.heads

    @property
    def conv_state_elems(self) -> int:
        """``update_conv_state``: the conv's last ``conv_kernel`` inputs, ``(batch, conv_dim, kernel)``."""
        return self.conv_dim * self.conv_kernel

    @property
    def recurrent_state_elems(self) -> int:
        """``mamba2_chunk_scan``'s fp32 final state ``(batch, heads, head_dim, state_size)``."""
        return self.heads * self.head_dim * self.state_size


class Mamba1Spec(BaseModel):
    """A Mamba-1 mixer with norms on dt, B and C (``models/jamba/modeling_jamba.py`` ``JambaMambaMixer``):
    ``in_proj`` to x and the gate (2 x ``inner``), a depthwise causal conv over x, ``x_proj`` to (dt, B, C),
    RMSNorms on each, ``dt_proj`` back to ``inner``, ``A_log`` (inner x state) and ``D``, ``out_proj``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["mamba1"] = "mamba1"
    inner: _Size = Field(description="mamba_expand x hidden_size (JambaConfig default 2 x 4096)")
    state_size: _Size = Field(description="mamba_d_state (JambaConfig default 16)")
    conv_kernel: _Size = Field(description="mamba_d_conv (JambaConfig default 4)")
    dt_rank: _Size = Field(description="mamba_dt_rank ('auto': ceil(hidden_size / 16), JambaConfig)")
    conv_bias: bool = Field(description="mamba_conv_bias (JambaConfig default True)")
    proj_bias: bool = Field(description="mamba_proj_bias (JambaConfig default False): in_proj and out_proj")

    @property
    def conv_state_elems(self) -> int:
        """``update_conv_state``: ``(batch, inner, kernel)``."""
        return self.inner * self.conv_kernel

    @property
    def recurrent_state_elems(self) -> int:
        """The scan's last ``ssm_state`` ``(batch, inner, state_size)``, fp32 after the first step."""
        return self.inner * self.state_size


def mamba_tensors(spec: ModelSpec, i: int) -> Iterator[Tensor]:
    """The mixer of a mamba layer: Mamba-2 (NemotronHMamba2Mixer) or Mamba-1 (JambaMambaMixer)."""
    if isinstance(spec.mamba, Mamba1Spec):
        yield from mamba1_tensors(spec, i)
    else:
        yield from mamba2_tensors(spec, i)


def mamba1_tensors(spec: ModelSpec, i: int) -> Iterator[Tensor]:
    """JambaMambaMixer.__init__: conv1d (+ bias), in_proj, x_proj, dt_proj (bias), A_log, D, out_proj, the
    three RMSNorms (dt, B, C)."""
    from gpumem_gui.core.spec.params import Tensor, _linear

    mb, h, p = spec.mamba, spec.hidden_size, f"layers.{i}.mamba"
    assert isinstance(mb, Mamba1Spec)
    d, n = mb.inner, mb.state_size
    yield Tensor(f"{p}.conv1d.weight", (d, 1, mb.conv_kernel), "attention", i)
    if mb.conv_bias:
        yield Tensor(f"{p}.conv1d.bias", (d,), "attention", i)
    yield from _linear(f"{p}.in_proj", h, 2 * d, mb.proj_bias, "attention", i)
    yield from _linear(f"{p}.x_proj", d, mb.dt_rank + 2 * n, False, "attention", i)
    yield from _linear(f"{p}.dt_proj", mb.dt_rank, d, True, "attention", i)
    yield Tensor(f"{p}.A_log", (d, n), "attention", i)
    yield Tensor(f"{p}.D", (d,), "attention", i)
    yield from _linear(f"{p}.out_proj", d, h, mb.proj_bias, "attention", i)
    yield Tensor(f"{p}.dt_layernorm.weight", (mb.dt_rank,), "norms", i)
    yield Tensor(f"{p}.b_layernorm.weight", (n,), "norms", i)
    yield Tensor(f"{p}.c_layernorm.weight", (n,), "norms", i)


def mamba2_tensors(spec: ModelSpec, i: int) -> Iterator[Tensor]:
    """NemotronHMamba2Mixer.__init__: conv1d (bias with use_conv_bias), in_proj, dt_bias, A_log, the gated
    norm's weight over the intermediate size, D, out_proj (biases with use_bias)."""
    from gpumem_gui.core.spec.params import Tensor, _linear

    mb, h, p = spec.mamba, spec.hidden_size, f"layers.{i}.mixer"
    assert isinstance(mb, Mamba2Spec)
    yield Tensor(f"{p}.conv1d.weight", (mb.conv_dim, 1, mb.conv_kernel), "attention", i)
    if mb.conv_bias:
        yield Tensor(f"{p}.conv1d.bias", (mb.conv_dim,), "attention", i)
    yield from _linear(f"{p}.in_proj", h, mb.projection, mb.proj_bias, "attention", i)
    yield Tensor(f"{p}.dt_bias", (mb.heads,), "attention", i)
    yield Tensor(f"{p}.A_log", (mb.heads,), "attention", i)
    if mb.gated_norm:
        yield Tensor(f"{p}.norm.weight", (mb.inner,), "norms", i)
    yield Tensor(f"{p}.D", (mb.heads,), "attention", i)
    yield from _linear(f"{p}.out_proj", mb.inner, h, mb.proj_bias, "attention", i)


def single_layer_tensors(spec: ModelSpec, i: int) -> Iterator[Tensor]:
    """NemotronHBlock.__init__: one norm, then the one mixer of the layer's type: the Mamba-2 mixer, the
    attention (NemotronHAttention: q/k/v/o, no rotary) or the MLP (NemotronHMLP, or the MoE)."""
    from gpumem_gui.core.spec.params import _attention, _feed_forward, _norm_tensors

    yield from _norm_tensors(spec, f"layers.{i}.norm0", spec.hidden_size, i)
    kind = spec.resolved_layer_types[i]
    if kind == "mamba":
        yield from mamba_tensors(spec, i)
    elif kind == "mlp":
        yield from _feed_forward(spec, i)
    else:
        yield from _attention(spec, i)
