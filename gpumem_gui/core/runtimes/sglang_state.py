"""SGLang's recurrent-state ("mamba") pool of hybrid models: attention layers beside gated DeltaNet
(Qwen3-Next, Qwen3.5), Mamba-2 (Nemotron-H, Granite-4.0-H, Falcon-H1), LFM2's short convolutions or KDA
(Kimi-Linear).

What one request slot holds on one attention-TP rank (``python/sglang/srt/configs/mamba_utils.py``
``BaseLinearStateParams.mamba_cache_per_req``): per state layer, a conv state of ``conv_dim / tp x (kernel -
1)`` elements in bf16 (``mamba2_state_dtype``: ``SGLANG_MAMBA_CONV_DTYPE``, default bfloat16, whatever the
model's dtype) and a temporal state ``heads / tp x head_dim x state_size`` in the SSM dtype (float32 unless
the config's ``mamba_ssm_dtype`` or ``--mamba-ssm-dtype`` says otherwise), summed over the state layers.
Shapes (``Mamba2StateShape.create``, ``KimiLinearStateShape.create``): the gated DeltaNet is a Mamba-2
of ``n_groups`` = key heads, ``state_size`` = key dim (``configs/qwen3_next.py`` ``mamba2_cache_params``);
Mamba-2 groups are padded up to ``tp`` when ``tp`` does not divide them (``extra_groups_for_head_shards``);
LFM2's conv is ``hidden / tp x (L_cache - 1)`` and no temporal state (``configs/lfm2.py``).

The pool (``mem_cache/kv_cache_configurator.py`` ``_handle_max_mamba_cache``, ``resolve_max_num_reqs``,
``_calculate_mamba_ratio``): from the memory left after the weights, ``rest``, the state pool takes
``max_mamba_cache_size`` = K slots: ``--max-mamba-cache-size``; else with ``--disable-radix-cache`` and
``--max-running-requests`` that many; else ``K = (rest x r / (1 + r) - per_req) // per_req`` with ``r =
--mamba-full-memory-ratio``. ``MambaPool`` allocates K + 1 slots (slot 0 pads) and the KV pool gets the rest;
``max_running_requests`` is at most ``K // ratio`` (3 slots per request with the radix cache, 1 without).

Over pipeline stages (sglang PR #21448, then #33666, in release v0.5.17 and main): a rank allocates the state
of its own slice only (``_init_pools`` passes ``mamba_layer_ids`` = the ``mamba2_cache_params.layers`` in
``[start_layer, end_layer)``), while the profile charges every rank the same bytes per slot, those of the
fullest stage: ``int(mamba_cache_per_req x max_stage_layers / layers)`` (``_handle_max_mamba_cache``,
``pp_layer_scale``), out of a ``rest`` taken over the whole world (``get_available_gpu_memory(distributed=
True)``: the least free memory of any rank). K is the same on every stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import ceil

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.results.estimate import Component
from gpumem_gui.core.runtimes.base import Lever, component
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.runtimes.sglang_swa import Cells, per_layer_bytes
from gpumem_gui.core.spec.kinds import RecurrentState
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.units import GiB

# the mixers SGLang sizes a mamba pool for (configs/hybrid_arch.py mambaish_config: hybrid_gdn_config,
# mamba2_config, kimi_linear_config); Mamba-1 (Jamba) and lightning (MiniMax) are not on its lists
SGLANG_STATE_MIXERS = frozenset({"gated_deltanet", "kda", "mamba2", "short_conv"})
# configs/mamba_utils.py mamba2_state_dtype: SGLANG_MAMBA_CONV_DTYPE defaults to torch.bfloat16
CONV_STATE_BYTES = 2
# configs/mamba_utils.py mamba2_state_dtype dtype_map; "auto": its default torch.float32
SSM_DTYPE_BYTES = {"auto": 4, "float32": 4, "bfloat16": 2, "float16": 2}
# mem_cache/kv_cache_configurator.py _calculate_mamba_ratio: MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO with
# the radix cache (default no_buffer strategy), 1 with --disable-radix-cache
RADIX_SLOTS_PER_REQUEST, NO_RADIX_SLOTS_PER_REQUEST = 3, 1
_SRC = "sglang configs/mamba_utils.py mamba_cache_per_req; mem_cache/kv_cache_configurator.py"


@dataclass(frozen=True)
class StateBytes:
    """One request slot's state bytes on one attention-TP rank, over all state layers."""

    conv: int
    ssm: int
    layers: int
    ssm_dtype: str

    @property
    def per_req(self) -> int:
        return self.conv + self.ssm


def _groups(groups: int, tp: int) -> int:
    """Mamba-2 groups after ``extra_groups_for_head_shards``: padded up to ``tp`` when it does not divide."""
    return groups if groups % tp == 0 else tp


def layer_state_elems(spec: ModelSpec, kind: RecurrentState, tp: int) -> tuple[int, int]:
    """(conv, temporal) elements one request keeps in one layer of ``kind`` on one attention-TP rank."""
    la, sc, mb = spec.linear_attention, spec.short_conv, spec.mamba
    if kind.mixer == "short_conv" and sc is not None:  # configs/lfm2.py: intermediate = hidden, state 0
        return spec.hidden_size // tp * (sc.kernel - 1), 0
    if kind.mixer == "mamba2" and mb is not None and mb.kind == "mamba2":
        conv_dim = mb.inner + 2 * _groups(mb.groups, tp) * mb.state_size
        return conv_dim // tp * (mb.conv_kernel - 1), mb.heads // tp * mb.head_dim * mb.state_size
    if la is not None and kind.mixer in ("gated_deltanet", "kda"):
        if kind.mixer == "kda":  # KimiLinearStateShape: q, k, v each sharded; (H / tp, dv, dv)
            conv = (la.value_dim // tp + 2 * (la.key_dim // tp)) * (la.conv_kernel - 1)
            return conv, la.value_heads // tp * la.value_head_dim * la.value_head_dim
        conv_dim = la.value_dim + 2 * _groups(la.key_heads, tp) * la.key_head_dim
        return conv_dim // tp * (
            la.conv_kernel - 1
        ), la.value_heads // tp * la.value_head_dim * la.key_head_dim
    raise GpumemInputError(f"sglang: the state of {kind.mixer} layers is not modelled", field="engine")


def ssm_dtype(run: InferenceRun) -> str:
    """The temporal state's dtype: ``--mamba-ssm-dtype``, else float32 (mamba2_state_dtype's default, also
    what the stored configs that name ``mamba_ssm_dtype`` say; a config naming another dtype is not read)."""
    return "float32" if run.mamba_ssm_dtype == "auto" else run.mamba_ssm_dtype


def state_per_request(
    spec: ModelSpec, attn_tp: int, ssm: str = "float32", stage: range | None = None
) -> StateBytes:
    """:class:`StateBytes` of one request on one attention-TP rank (``mamba_cache_per_req``), over the state
    layers in ``stage`` (a pipeline stage's layers; all when None)."""
    conv = temporal = layers = 0
    for kind in model_kinds(spec).state:
        c, t = layer_state_elems(spec, kind, attn_tp)
        n = len(kind.layers) if stage is None else sum(i in stage for i in kind.layers)
        conv += c * n
        temporal += t * n
        layers += n
    return StateBytes(conv * CONV_STATE_BYTES, temporal * SSM_DTYPE_BYTES[ssm], layers, ssm)


@dataclass(frozen=True)
class StagedState:
    """A hybrid's state over pipeline stages: what each stage allocates per slot (its own state layers), and
    what the profile charges every rank per slot (``charged``: the fullest stage's share of the whole
    model's bytes; the whole model's at pp 1)."""

    stages: tuple[StateBytes, ...]
    charged: int

    @property
    def fullest(self) -> StateBytes:
        return max(self.stages, key=lambda s: s.per_req)


def staged_state(spec: ModelSpec, attn_tp: int, ssm: str, stages: list[range]) -> StagedState:
    """:class:`StagedState` of ``stages`` (each pipeline stage's layers): ``_handle_max_mamba_cache`` scales
    ``mamba_cache_per_req`` by ``pp_layer_scale = max_stage_mamba_layers / len(layers)`` and truncates."""
    whole = state_per_request(spec, attn_tp, ssm)
    per_stage = tuple(state_per_request(spec, attn_tp, ssm, layers) for layers in stages)
    scale = max(s.layers for s in per_stage) / max(whole.layers, 1)
    return StagedState(per_stage, int(whole.per_req * scale))


def check_state_tp(spec: ModelSpec, attn_tp: int) -> None:
    """SGLang's ``divide`` asserts that the attention-TP size divides what it shards (one-line error)."""
    la, sc, mb = spec.linear_attention, spec.short_conv, spec.mamba
    parts = {"hidden_size": spec.hidden_size} if sc is not None else {}
    if la is not None:
        parts |= {"linear value heads": la.value_heads, "linear key heads x dim": la.key_dim}
    if mb is not None and mb.kind == "mamba2":
        parts |= {"mamba heads": mb.heads}
    for name, n in parts.items():
        if n % attn_tp:
            raise GpumemInputError(
                f"sglang: attention tp {attn_tp} does not divide the state layers' {name} ({n})", field="tp"
            )


def slots_per_request(run: InferenceRun) -> int:
    return NO_RADIX_SLOTS_PER_REQUEST if run.disable_radix_cache else RADIX_SLOTS_PER_REQUEST


@dataclass(frozen=True)
class MambaSlots:
    """The state pool: ``slots`` = max_mamba_cache_size (allocated + 1), how it was chosen."""

    slots: int
    state: StateBytes  # what one slot holds on this rank (its stage's state layers)
    ratio: int  # state slots per running request
    how: str
    charged: int  # the bytes per slot the profile takes off the KV budget (StagedState.charged)

    @property
    def bytes(self) -> int:
        """What this rank's MambaPool allocates: K + 1 slots of its own state layers."""
        return (self.slots + 1) * self.state.per_req if self.slots > 0 else 0

    @property
    def budget_bytes(self) -> int:
        """What the profile takes off ``rest`` before sizing the KV pool: K + 1 charged slots."""
        return (self.slots + 1) * self.charged if self.slots > 0 else 0

    def facts(self) -> dict[str, object]:
        out: dict[str, object] = {
            "max_mamba_cache_size": self.slots,
            "conv_state_bytes": (self.slots + 1) * self.state.conv,
            "ssm_state_bytes": (self.slots + 1) * self.state.ssm,
            "state_bytes_per_request": self.state.per_req,
            "mamba_ssm_dtype": self.state.ssm_dtype,
            "mamba_slots_per_request": self.ratio,
        }
        if self.charged != self.state.per_req:  # over pipeline stages
            out["state_bytes_charged_per_request"] = self.charged
        return out


def mamba_slots(run: InferenceRun, rest: float | None, state: StateBytes, charged: int) -> MambaSlots:
    """max_mamba_cache_size from the memory left after the weights (``_handle_max_mamba_cache``, ``charged``
    bytes per slot); without a GPU (``rest`` None): the batch's sequences x the slots per request."""
    dp = run.dp_size if run.enable_dp_attention else 1
    ratio, per = slots_per_request(run), charged
    if run.max_mamba_cache_size is not None:
        return MambaSlots(run.max_mamba_cache_size // dp, state, ratio, "--max-mamba-cache-size / dp", per)
    if run.disable_radix_cache and run.max_running_requests is not None:
        how = "--max-running-requests / dp (radix cache off)"
        return MambaSlots(run.max_running_requests // dp, state, ratio, how, per)
    if rest is None:
        how = "batch x slots per request"
        return MambaSlots(ceil(run.batch / run.dp_size) * ratio, state, ratio, how, per)
    r = run.mamba_full_memory_ratio
    slots = int((rest * r / (1 + r) - per) // per) if per else 0
    return MambaSlots(slots, state, ratio, f"(rest x {r:g} / (1 + {r:g}) - per_req) // per_req", per)


def state_component(m: MambaSlots) -> Component:
    s = m.state
    staged = m.charged != s.per_req  # over pipeline stages: the profile charges the fullest stage's bytes
    return component(
        "mamba_state",
        "recurrent-state pool (mamba cache)",
        m.bytes,
        f"(max_mamba_cache_size + 1) x per_req; max_mamba_cache_size = {m.how}; per_req = state layers x "
        "(conv (kernel - 1) x conv_dim / tp x 2 B (bf16) + temporal heads / tp x head_dim x state x SSM "
        "dtype)"
        + (
            f"; this stage's state layers, K sized at {m.charged} B per slot (the fullest stage's share)"
            if staged
            else ""
        ),
        f"{_SRC} _handle_max_mamba_cache; mem_cache/memory_pool.py MambaPool",
        max_mamba_cache_size=m.slots,
        state_layers=s.layers,
        conv_bytes_per_request=s.conv,
        ssm_bytes_per_request=s.ssm,
        mamba_ssm_dtype=s.ssm_dtype,
    )


def state_warnings(run: InferenceRun, m: MambaSlots | None) -> list[str]:
    """The batch against the state pool (one line each)."""
    if m is None:
        return []
    if m.slots <= 0:
        return [
            'mamba_full_memory_ratio: SGLang refuses to start ("Not enough GPU memory for hybrid state '
            f'cache"): {m.charged / GiB:.3f} GiB of state per request leaves no slot; raise '
            "mem_fraction_static or mamba_full_memory_ratio, or set max_mamba_cache_size"
        ]
    seqs = ceil(run.batch / run.dp_size)
    if seqs > m.slots // m.ratio:
        return [
            f"max_mamba_cache_size: {m.slots} state slots at {m.ratio} per request cap max_running_requests "
            f"at {m.slots // m.ratio}, fewer than the batch's {seqs} sequences; raise "
            "mamba_full_memory_ratio or max_mamba_cache_size"
            + ("" if run.disable_radix_cache else ", or disable the radix cache (1 slot per request)")
        ]
    return []


def hybrid_cells(spec: ModelSpec, kv_elem: float, attn_tp: int, layers: range) -> Cells:
    """The KV cell of a hybrid's rank: only its attention layers (``full_attention_layer_ids``; a Falcon-H1
    layer is attention and Mamba and counts), ``HybridLinearKVPool`` over them (pool_configurator.py
    DefaultPoolConfigurator: ``num_layers`` = the full-attention layers of a mambaish config)."""
    attention = {i for k in model_kinds(spec).attention for i in k.layers}
    n = sum(i in attention for i in layers)
    return Cells(full=round(n * per_layer_bytes(spec, kv_elem, attn_tp)), full_layers=n)


# larger state shares a fit tries (SGLang accepts any positive --mamba-full-memory-ratio)
_RATIOS = (1.5, 2.0, 3.0, 5.0, 8.0)


def state_levers(run: InferenceRun, fits: Callable[..., bool]) -> list[Lever]:
    """For a hybrid whose batch the state slots cap: the smallest larger ``mamba_full_memory_ratio`` that
    fits, and no radix cache (one state slot per request instead of three)."""
    out: list[Lever] = []
    ratio = next(
        (r for r in _RATIOS if r > run.mamba_full_memory_ratio and fits(mamba_full_memory_ratio=r)), None
    )
    if ratio is not None:
        update: dict[str, object] = {"mamba_full_memory_ratio": ratio}
        out.append((2, "mamba_full_memory_ratio", f"mamba_full_memory_ratio {ratio:g}", update))
    if not run.disable_radix_cache and fits(disable_radix_cache=True):
        desc = "no radix cache (--disable-radix-cache: one state slot per request)"
        out.append((3, "disable_radix_cache", desc, {"disable_radix_cache": True}))
    return out
