"""``ModelSpec``: an exact, frozen description of a decoder-only transformer's architecture.

It holds what parameter accounting, KV-cache sizing and activation modelling need, and nothing that
depends on how the model is run. Every field is validated; cross-field rules (heads divide, layer types
match the layer count, ...) are checked in one place, :meth:`ModelSpec._check_consistency`.

The spec describes what ``transformers`` builds for a checkpoint: e.g. ``head_dim`` is explicit because
Gemma, Qwen3 and Mistral-Nemo set it apart from ``hidden_size / num_attention_heads``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from gpumem_gui.core.spec.altup import AltUpSpec
from gpumem_gui.core.spec.arch_traits import ArchTraits
from gpumem_gui.core.spec.base import MAX_LAYERS, MAX_SIZE, Frozen, NonNegInt, PositiveInt
from gpumem_gui.core.spec.compressed import DeepseekV4Spec
from gpumem_gui.core.spec.dsa import IndexerSpec
from gpumem_gui.core.spec.encoder import EncoderSpec
from gpumem_gui.core.spec.gemma4 import Gemma4Spec
from gpumem_gui.core.spec.linear import LinearAttentionSpec, ShortConvSpec
from gpumem_gui.core.spec.mamba import Mamba1Spec, Mamba2Spec
from gpumem_gui.core.spec.seq2seq import Seq2SeqSpec
from gpumem_gui.core.spec.vision import VisionTower

# re-exported: the spec's building blocks are imported from here across the core
__all__ = [
    "MAX_LAYERS",
    "MAX_SIZE",
    "ArchTraits",
    "Frozen",
    "MLASpec",
    "MoESpec",
    "ModelSpec",
    "NonNegInt",
    "PositiveInt",
    "Provenance",
    "VisionSpec",
]

PositionEmbedding = Literal["rope", "learned", "alibi", "none"]
NormKind = Literal["rmsnorm", "layernorm"]
# chunked_attention: Llama 4's local layers (masking_utils create_chunked_causal_mask; cached as sliding)
# mamba: a Mamba-2 mixer alone; mlp: an MLP alone (NemotronHBlock, one sub-layer per layer: spec/mamba.py)
LayerType = Literal[
    "full_attention",
    "sliding_attention",
    "chunked_attention",
    "linear_attention",
    "conv",
    "mamba",
    "hybrid",  # FalconH1DecoderLayer: a Mamba-2 mixer and attention side by side (KV cache and state)
    "mlp",
    "cross_attention",  # MllamaCrossAttentionDecoderLayer: attends to vision tokens (spec/cross_attention.py)
    # DeepSeek-V4's compressed layers (DeepseekV4Config.layer_types; spec/compressed.py)
    "compressed_sparse_attention",
    "heavily_compressed_attention",
]
# l2: weightless L2 norm per head after the rotary, on the rotary layers only (Llama4TextL2Norm)
QKNorm = Literal["none", "per_head", "full_width", "l2"]


class MoESpec(Frozen):
    """Mixture-of-experts feed-forward layers.

    ``dense_layers`` lists (0-based) the decoder layers that keep a dense MLP of the model's
    ``intermediate_size`` instead of experts (DeepSeek's ``first_k_dense_replace``, Qwen-MoE's
    ``mlp_only_layers`` / ``decoder_sparse_step``); all other layers are MoE layers.
    """

    num_experts: PositiveInt = Field(description="routed experts per MoE layer")
    experts_per_token: PositiveInt = Field(description="routed experts each token is sent to (top-k)")
    expert_intermediate_size: PositiveInt = Field(description="intermediate width of one routed expert")
    shared_expert_intermediate_size: NonNegInt = Field(
        0, description="total intermediate width of the always-on shared expert MLP (0: none)"
    )
    shared_expert_gate: bool = Field(
        False, description="a Linear(hidden, 1) gating the shared expert (Qwen-MoE)"
    )
    router_bias: bool = False
    expert_bias: bool = Field(False, description="expert linears carry biases")
    dense_layers: tuple[NonNegInt, ...] = ()
    score_bias_param: bool = Field(
        False,
        description="the router's e_score_correction_bias is a [1, num_experts] nn.Parameter (fp32, "
        "requires_grad=False) counted among the parameters (Ernie4_5_MoeStatics); DeepSeek-V3 / GLM-4.5 keep "
        "theirs as a buffer",
    )

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) must be at most "
                f"num_experts ({self.num_experts})"
            )
        if len(set(self.dense_layers)) != len(self.dense_layers):
            raise ValueError("dense_layers has duplicates")
        return self


class MLASpec(Frozen):
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank compressed queries and keys/values."""

    q_lora_rank: PositiveInt | None = Field(None, description="None: plain q_proj (DeepSeek-V2-Lite)")
    kv_lora_rank: PositiveInt
    qk_nope_head_dim: PositiveInt
    qk_rope_head_dim: PositiveInt
    v_head_dim: PositiveInt
    indexer: IndexerSpec | None = Field(
        None, description="DSA lightning indexer (DeepseekV32Attention.indexer); None: plain MLA"
    )
    head_gate: bool = Field(
        False,
        description="g_proj (hidden -> heads): the attention output times sigmoid(g_proj(x).float()) per "
        "head before o_proj (BailingHybridAttention)",
    )

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @field_validator("qk_rope_head_dim")
    @classmethod
    def _rope_even(cls, v: int) -> int:
        if v % 2:  # apply_rotary_pos_emb_interleave / rotate_half split the rope part in two halves
            raise ValueError("must be even (the rotary embedding rotates two halves)")
        return v


class VisionSpec(Frozen):
    """The vision side of a multimodal checkpoint, counted apart from the text model."""

    kind: str = Field(description="e.g. 'siglip'")
    tower_params: NonNegInt
    projector_params: NonNegInt
    position_embedding_params: NonNegInt = Field(
        0, description="learned patch-position table inside the tower"
    )
    embedding_table_params: NonNegInt = Field(
        0, description="nn.Embedding tables among the projector's parameters (Gemma 3n's hard-token tables)"
    )
    image_tokens: NonNegInt = Field(0, description="tokens one image adds to the text sequence")
    tower: VisionTower | None = Field(
        None, description="the tower's forward, for its activations (spec/vision.py); None: not modelled"
    )

    @property
    def params(self) -> int:
        return self.tower_params + self.projector_params


class Provenance(Frozen):
    """Where a spec came from: a file, a hub id, or a catalog entry and its source."""

    kind: Literal["config.json", "safetensors", "gguf", "hub", "catalog", "manual"] = "manual"
    source: str = ""
    note: str = ""


class ModelSpec(Frozen):
    """Architecture of a decoder-only LLM (text part), optionally with a vision tower."""

    name: str = Field(min_length=1, max_length=200)
    model_type: str = Field(
        min_length=1,
        max_length=64,
        description="the architecture's name as the config spells it, e.g. 'llama': a label the readers "
        "set and the CLI and window show; nothing branches on it (quirks are ArchTraits; "
        "tests/test_architecture.py)",
    )
    hidden_size: PositiveInt
    num_layers: Annotated[int, Field(gt=0, le=MAX_LAYERS)]
    num_attention_heads: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    intermediate_size: PositiveInt = Field(description="dense MLP width")
    vocab_size: PositiveInt
    tie_word_embeddings: bool = False
    embedding_dim: PositiveInt | None = Field(
        None, description="token-embedding width when it differs from hidden_size (OPT-350m: project_in/out)"
    )
    embedding_norm: bool = Field(False, description="a norm right after the token embedding (BLOOM)")
    embedding_padding_rows: NonNegInt = Field(
        0, description="rows the token embedding holds beyond vocab_size (MllamaTextModel: vocab_size + 8)"
    )
    position_embedding: PositionEmbedding = "rope"
    learned_position_rows: NonNegInt = Field(0, description="rows of a learned absolute position table")
    max_position_embeddings: PositiveInt = 2048
    norm: NormKind = "rmsnorm"
    norm_bias: bool = False
    norms_per_layer: Annotated[int, Field(ge=1, le=4)] = 2
    final_norm: bool = True
    qk_norm: QKNorm = "none"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    lm_head_bias: bool = False
    mlp_gated: bool = True
    activation: str = "silu"
    parallel_attn_mlp: bool = False
    transformers_expands_kv: bool = Field(
        False,
        description="transformers caches K/V broadcast to every query head (Falcon new_decoder_architecture: "
        "FalconAttention broadcasts the grouped K/V before the cache update; measured [b, 128, s, 64] for "
        "falcon-40b), while vLLM/llama.cpp cache only the KV heads",
    )
    final_logit_softcapping: float | None = Field(
        None, gt=0, description="logits = cap * tanh(logits / cap) (Gemma-2); costs a second logits tensor"
    )
    sliding_window: PositiveInt | None = None
    layer_types: tuple[LayerType, ...] = ()
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    vision: VisionSpec | None = None
    traits: ArchTraits = ArchTraits()
    provenance: Provenance = Provenance()
    linear_attention: LinearAttentionSpec | None = Field(
        None,
        description="the linear_attention layers' token mixer and its fixed per-sequence state (gated "
        "DeltaNet: Qwen3NextGatedDeltaNet); required when layer_types names linear_attention layers",
    )
    short_conv: ShortConvSpec | None = Field(
        None, description="the conv layers' gated short convolution and its conv state (Lfm2ShortConv)"
    )
    attn_output_gate: bool = Field(
        False,
        description="q_proj also yields a per-channel gate: 2 x heads x head_dim outputs, the attention "
        "output multiplied by sigmoid(gate) before o_proj (Qwen3NextAttention)",
    )

    @model_validator(mode="after")
    def _check_linear(self) -> ModelSpec:
        if "linear_attention" in self.layer_types and self.linear_attention is None:
            raise ValueError(
                "layer_types has linear_attention layers but the linear_attention spec is not set"
            )
        compressed = {"compressed_sparse_attention", "heavily_compressed_attention"} & set(self.layer_types)
        if compressed and self.deepseek_v4 is None:
            raise ValueError("layer_types has compressed layers but the deepseek_v4 spec is not set")
        if self.deepseek_v4 is not None and self.deepseek_v4.attention.layer_types != self.layer_types:
            raise ValueError("the deepseek_v4 spec's layer types must be the model's layer_types")
        if "conv" in self.layer_types and self.short_conv is None:
            raise ValueError("layer_types has conv layers but the short_conv spec is not set")
        return self

    rotary_dim: PositiveInt | None = Field(
        None,
        description="channels of each head that rotate when fewer than head_dim (partial_rotary_factor x "
        "head_dim: GLM, GLM-4; the rest pass through and are concatenated back, apply_rotary_pos_emb)",
    )
    nope_layers: tuple[NonNegInt, ...] = Field(
        (),
        description="decoder layers that apply no rotary embedding to q and k though the model computes it "
        "(SmolLM3Attention.use_rope = no_rope_layers[layer_idx]; Cohere2Attention on full-attention layers)",
    )
    attention_chunk_size: PositiveInt | None = Field(
        None,
        description="tokens per attention chunk of the chunked_attention layers; transformers caches their "
        "last attention_chunk_size - 1 tokens (DynamicSlidingWindowLayer; Llama4TextConfig)",
    )

    @model_validator(mode="after")
    def _check_chunked(self) -> ModelSpec:
        if "chunked_attention" in self.layer_types and self.attention_chunk_size is None:
            raise ValueError("layer_types has chunked layers but attention_chunk_size is not set")
        return self

    attention_sinks: bool = Field(False, description="GptOssAttention.sinks: a logit per head in the softmax")
    approximate: str | None = Field(
        None,
        max_length=600,
        description="why the numbers are approximate: the readers do not model this model_type and the "
        "generic decoder reader of last resort (readers/generic.py) stood in; None when a reader describes "
        "it. Front ends show it and point to `gpumem trace`",
    )
    encoder: EncoderSpec | None = Field(
        None,
        description="set for a bidirectional encoder (BERT, RoBERTa): its token types, task head and "
        "position "
        "ids (spec/encoder.py); None for a causal decoder. An encoder keeps no KV cache and runs the encoder "
        "replay (replay/encoder.py)",
    )
    seq2seq: Seq2SeqSpec | None = Field(
        None,
        description="set for an encoder-decoder (T5): num_layers counts both stacks, the encoder's blocks "
        "first; the split, the relative attention bias and the cross-attention (spec/seq2seq.py)",
    )
    kv_shared_layers: tuple[NonNegInt, ...] = Field(
        (),
        description="layers that reuse an earlier layer's keys and values: no k/v projections or norms and "
        "no cache of their own (Gemma3nTextAttention.is_kv_shared_layer; cache_utils "
        "get_layer_types_and_kwargs makes them 'dummy' layers)",
    )
    altup: AltUpSpec | None = Field(
        None, description="Gemma 3n's per-layer inputs, AltUp and Laurel blocks (spec/altup.py)"
    )
    gemma4: Gemma4Spec | None = Field(
        None, description="Gemma 4's per-layer-type heads, k = v attention, PLE, MoE block (spec/gemma4.py)"
    )
    deepseek_v4: DeepseekV4Spec | None = Field(
        None,
        description="DeepSeek-V4's compressed attention, hyper-connections and grouped output projection "
        "(spec/compressed.py); required when layer_types names compressed layers",
    )

    @model_validator(mode="after")
    def _check_rotary_dim(self) -> ModelSpec:
        if self.rotary_dim is not None and (self.rotary_dim > self.head_dim or self.rotary_dim % 2):
            raise ValueError(
                f"rotary_dim ({self.rotary_dim}) must be even and at most head_dim ({self.head_dim})"
            )
        return self

    @model_validator(mode="after")
    def _check_consistency(self) -> ModelSpec:
        if self.num_kv_heads > self.num_attention_heads:
            raise ValueError(
                f"num_kv_heads ({self.num_kv_heads}) must be at most num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries but the model has {self.num_layers} layers"
            )
        if "sliding_attention" in self.layer_types and self.sliding_window is None:
            raise ValueError("layer_types has sliding layers but sliding_window is not set")
        if self.position_embedding == "learned" and self.learned_position_rows == 0:
            raise ValueError("learned position embeddings need learned_position_rows > 0")
        if self.moe is not None and any(i >= self.num_layers for i in self.moe.dense_layers):
            raise ValueError(f"moe.dense_layers names a layer beyond num_layers ({self.num_layers})")
        return self

    mamba: Mamba2Spec | Mamba1Spec | None = Field(
        None,
        discriminator="kind",
        description="the mamba layers' mixer and its conv + SSM state: Mamba-2 (NemotronHMamba2Mixer) or "
        "Mamba-1 (JambaMambaMixer); required when layer_types names mamba layers",
    )

    @model_validator(mode="after")
    def _check_mamba(self) -> ModelSpec:
        if ("mamba" in self.layer_types or "hybrid" in self.layer_types) and self.mamba is None:
            raise ValueError("layer_types has mamba layers but the mamba spec is not set")
        if "mlp" in self.layer_types and self.traits.block != "single":
            raise ValueError("mlp-only layers need the single-mixer block (traits.block single)")
        if self.activation == "xielu" and (self.mlp_gated or self.moe is not None):
            # XIELUActivation's learned alpha_p / alpha_n: modelled in Apertus' plain MLP (ApertusMLP) only
            raise ValueError("activation xielu is modelled only in a plain (ungated, dense) MLP (Apertus)")
        return self

    # ---- derived views -------------------------------------------------------------------------
    @property
    def resolved_layer_types(self) -> tuple[LayerType, ...]:
        """One entry per layer; a model that names none is full attention everywhere."""
        return self.layer_types or ("full_attention",) * self.num_layers

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer not in self.moe.dense_layers

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def token_embedding_dim(self) -> int:
        return self.embedding_dim or self.hidden_size

    @property
    def q_width(self) -> int:
        """Width of the query projection output (heads x head_dim; not always hidden_size)."""
        if self.mla is not None:
            return self.num_attention_heads * self.mla.qk_head_dim
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of one of K or V (KV heads x head_dim): what GQA/MQA shrink."""
        return self.num_kv_heads * self.head_dim

    @property
    def attention_kind(self) -> str:
        if self.mla is not None:
            return "MLA"
        if self.num_kv_heads == 1 and self.num_attention_heads > 1:
            return "MQA"
        if self.num_kv_heads < self.num_attention_heads:
            return "GQA"
        return "MHA"
