"""``ModelSpec``: an exact, frozen description of a decoder-only transformer's architecture.

It holds what parameter accounting, KV-cache sizing and activation modelling need, and nothing that
depends on how the model is run. Every field is validated; cross-field rules (heads divide, layer types
match the layer count, ...) are checked in one place, :meth:`ModelSpec._check_consistency`.

The spec describes what ``transformers`` builds for a checkpoint: e.g. ``head_dim`` is explicit because
Gemma, Qwen3 and Mistral-Nemo set it apart from ``hidden_size / num_attention_heads``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Sanity bounds, far above any published model (the largest have ~100-200 layers, hidden sizes of ~30k,
# vocabularies of ~260k and ~1M-token contexts); they keep absurd inputs from running for hours.
MAX_LAYERS = 4096
MAX_SIZE = 1 << 31

PositiveInt = Annotated[int, Field(gt=0, le=MAX_SIZE)]
NonNegInt = Annotated[int, Field(ge=0, le=MAX_SIZE)]

PositionEmbedding = Literal["rope", "learned", "alibi", "none"]
NormKind = Literal["rmsnorm", "layernorm"]
LayerType = Literal["full_attention", "sliding_attention"]
QKNorm = Literal["none", "per_head", "full_width"]


class Frozen(BaseModel):
    """Base of every core model: immutable, no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


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

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class VisionSpec(Frozen):
    """The vision side of a multimodal checkpoint, counted apart from the text model."""

    kind: str = Field(description="e.g. 'siglip'")
    tower_params: NonNegInt
    projector_params: NonNegInt
    position_embedding_params: NonNegInt = Field(
        0, description="learned patch-position table inside the tower"
    )
    image_tokens: NonNegInt = Field(0, description="tokens one image adds to the text sequence")

    @property
    def params(self) -> int:
        return self.tower_params + self.projector_params


class ArchTraits(Frozen):
    """How an architecture's transformers modeling code differs from Llama's, as data.

    The readers (``gpumem_gui.core.readers``) set these from the config's architecture name and fields; the
    replay, the parameter accounting and the format rules read only these fields, never the name itself. The
    defaults are Llama's (``models/llama/modeling_llama.py``, transformers 5.24); each field names the code
    that differs.
    """

    embedding_scale: bool = Field(
        False,
        description="the token embedding is multiplied by sqrt(hidden) inside the embedding module, a second "
        "tensor that replaces the first (Gemma*TextScaledWordEmbedding.forward)",
    )
    norm_weight_offset: bool = Field(
        False, description="RMSNorm multiplies by (1 + weight) in fp32 before the cast back (GemmaRMSNorm)"
    )
    norm_placement: Literal["pre", "post", "sandwich"] = Field(
        "pre",
        description="pre: norm before attention and MLP (Llama); post: after them, before the residual add "
        "(Olmo2DecoderLayer); sandwich: both (Gemma2DecoderLayer's four norms)",
    )
    fused_qkv: bool = Field(
        False,
        description="one projection for q, k and v, split into views (GPT-2 c_attn, Phi-3 qkv_proj, Falcon/"
        "BLOOM/GPT-NeoX query_key_value)",
    )
    fused_gate_up: bool = Field(
        False, description="one gate_up_proj chunked into gate and up views (Phi3MLP.forward)"
    )
    eager_softmax_fp32: bool = Field(
        True,
        description="eager attention's softmax runs in fp32 and is cast back (eager_attention_forward); "
        "GPT-2 and Falcon keep the activation dtype",
    )
    attn_logit_softcapping: float | None = Field(
        None, gt=0, description="eager scores = cap x tanh(scores / cap) (Gemma-2 attn_logit_softcapping)"
    )
    rotary_per_layer_type: bool = Field(
        False,
        description="a rotary embedding per attention type, each computed when a layer of its type exists "
        "(Gemma-3: rotary_emb and rotary_emb_local)",
    )
    always_mask: bool = Field(
        False,
        description="the attention always gets a materialised float mask, never SDPA's is_causal shortcut, "
        "and masks it again inside (FalconModel / FalconAttention)",
    )
    sdpa_broadcast_kv: bool = Field(
        False,
        description="fewer K/V heads reach SDPA as broadcast views, neither repeated nor enable_gqa; with a "
        "mask torch takes its fp32 math path (FalconAttention)",
    )
    router_renormalize: bool = Field(
        True,
        description="MoE top-k weights are renormalised to sum to 1 in place (norm_topk_prob; Qwen2-MoE: "
        "off)",
    )
    residual_dropout: bool = Field(
        False,
        description="dropout on each block's attention and MLP outputs (GPT-2, OPT, GPT-NeoX): each keeps "
        "its mask for backward when training with dropout > 0",
    )
    embedding_dropout: bool = Field(
        False, description="dropout on the embeddings before the first layer (GPT2Model.drop, emb_dropout)"
    )
    attn_output_kept: bool = Field(
        False,
        description="the decoder layer keeps the attention output under its own name until it returns, "
        "through the MLP (GPT2Block.forward attn_output)",
    )
    module_names: tuple[tuple[str, str], ...] = Field(
        (),
        description="the real names of the nn.Linear / Conv1D modules where they differ from Llama's "
        "(q_proj, o_proj, up_proj, ... -> c_attn, dense, fc1, ...): PEFT's target_modules match these",
    )
    hidden_dropout: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.0,
        description="the config's dropout on hidden states: residual and embedding dropout where the "
        "architecture has them (GPT-2 resid_pdrop, OPT dropout, Starcoder2 residual_dropout)",
    )
    attention_dropout: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.0,
        description="the config's dropout on attention probabilities (attention_dropout, GPT-2 attn_pdrop): "
        "eager attention keeps a mask and the dropped probabilities; fused SDPA kernels on a GPU keep only "
        "their RNG state",
    )
    router: Literal["softmax", "fp32"] = Field(
        "softmax",
        description="softmax: router logits in the activation dtype, fp32 softmax, top-k weights cast back "
        "(TopKRouter); fp32: fp32 copies of the input and the router weight, scores and top-k weights kept "
        "in fp32, so the experts' weighted outputs are fp32 (DeepseekV2/V3TopkRouter)",
    )
    shared_expert_first: bool = Field(
        False, description="the shared expert runs before the router (Qwen2MoeSparseMoeBlock.forward)"
    )
    sliding_mask_always: bool = Field(
        False,
        description="the model builds the sliding-window mask beside the causal one even when no layer "
        "slides, and holds it through the forward (Qwen2MoeModel.forward causal_mask_mapping)",
    )
    block: Literal["llama", "falcon", "bloom"] = Field(
        "llama",
        description="the decoder block's code: the shared attention interface (llama and its descendants), "
        "or a modeling file's own (FalconDecoderLayer, BloomBlock: own attention kernels, in-place "
        "residuals, the model's loop keeping the previous layer's outputs)",
    )
    gguf_arch: str | None = Field(
        None,
        max_length=64,
        description="llama.cpp's architecture name (LLM_ARCH_*), which its quantization rules branch on",
    )
    sglang_hybrid_swa: bool = Field(
        False,
        description="SGLang keeps the sliding-window layers' KV in a separate, smaller pool (its "
        "is_hybrid_swa_model: an architecture allowlist, Llama4 / GPT-OSS / Gemma4 / MiMo-V2 ..., or a "
        "config with is_hybrid_swa; sglang/srt/configs/model_config.py); otherwise SGLang sizes every layer "
        "as full attention, Gemma-2/3 and Mistral included",
    )


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
