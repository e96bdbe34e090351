"""``ArchTraits``: how an architecture's transformers modeling code differs from Llama's, as data (set by the
readers, read by the replay, the parameter accounting and the format rules)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from gpumem_gui.core.spec.base import Frozen


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
    router: Literal[
        "softmax",
        "fp32",
        "sparsemixer",
        "sigmoid",
        "fp32_softmax",
        "sigmoid_bias",
        "sigmoid_topk",
        "softmax_fp32_weights",
    ] = Field(
        "softmax",
        description="softmax: router logits in the activation dtype, fp32 softmax, top-k weights cast back "
        "(TopKRouter); fp32: fp32 copies of the input and the router weight, scores and top-k weights kept "
        "in fp32, so the experts' weighted outputs are fp32 (DeepseekV2/V3TopkRouter); sparsemixer: two "
        "masked softmaxes over the logits in the activation dtype, one expert each (PhimoeTopKRouter, "
        "sparsemixer); sigmoid: logits in the activation dtype, fp32 sigmoid + correction bias, top-k "
        "weights renormalised and kept in fp32 (MiniMaxM2TopKRouter); fp32_softmax: fp32 logits from an fp32 "
        "copy of the input, fp32 softmax, top-k of the scores plus a correction bias, gathered, renormalised "
        "into a new tensor and cast to the activation dtype (Ernie4_5_MoeTopKRouter); sigmoid_bias / "
        "sigmoid_topk: sigmoid scores in the activation dtype, the top-k chosen on scores + an fp32 expert "
        "bias (gathered) or on the scores themselves, divided by their sum + eps and scaled, all new tensors "
        "(Lfm2MoeTopKRouter); softmax_fp32_weights: TopKRouter's, the renormalised top-k weights left in "
        "fp32 (MiniMaxTopKRouter)",
    )
    shared_expert_first: bool = Field(
        False, description="the shared expert runs before the router (Qwen2MoeSparseMoeBlock.forward)"
    )
    moe_input_jitter: Annotated[int, Field(ge=0, le=2)] = Field(
        0,
        description="in training, in-place multiplications of the MoE input by a uniform noise tensor, which "
        "MulBackward saves: PhimoeSparseMoeBlock and PhimoeTopKRouter (input_jitter_noise > 0) one each, "
        "MiniMaxM2SparseMoeBlock (router_jitter_noise > 0) one",
    )
    sliding_mask_always: bool = Field(
        False,
        description="the model builds the sliding-window mask beside the causal one even when no layer "
        "slides, and holds it through the forward (Qwen2MoeModel.forward causal_mask_mapping)",
    )
    block: Literal["llama", "falcon", "bloom", "single", "minimax", "parallel_mamba"] = Field(
        "llama",
        description="the decoder block's code: the shared attention interface (llama and its descendants), "
        "or a modeling file's own (FalconDecoderLayer, BloomBlock: own attention kernels, in-place "
        "residuals, the model's loop keeping the previous layer's outputs); single: one norm and one "
        "mixer per layer, Mamba-2, attention or MLP by layer type (NemotronHBlock); minimax: the normed "
        "input is the residual and each sub-layer ends in residual * alpha + out * beta "
        "(MiniMaxDecoderLayer)"
        "; parallel_mamba: a Mamba-2 mixer and attention side by side on one normed input, each output "
        "scaled, then a scaled MLP (FalconH1DecoderLayer)",
    )
    model_forward: Literal["llama", "altup", "gemma4", "deepseek_v4"] = Field(
        "llama",
        description="the model's forward around its layers: LlamaModel.forward (embedding, masks, rotary, "
        "the layer loop, the final norm) and its descendants; altup: Gemma3nTextModel.forward (per-layer "
        "inputs, AltUp's stacked hidden states); gemma4: Gemma4TextModel.forward",
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
    vllm_ssm_state_fp32: bool = Field(
        False,
        description="vLLM keeps the Mamba layers' temporal state in float32 when --mamba-ssm-cache-dtype is "
        "auto (vllm/model_executor/models/config.py NemotronHForCausalLMConfig: the config's "
        "mamba_ssm_cache_dtype, else float32); otherwise auto is the model dtype (mamba_utils.py "
        "MambaStateDtypeCalculator)",
    )
    rope_interleaved: bool = Field(
        False,
        description="rotary over adjacent (even, odd) pairs: cos/sin halves repeat_interleave'd, rotate_half "
        "stacking (-x[1::2], x[0::2]) (GlmAttention / Glm4Attention apply_rotary_pos_emb)",
    )
    rope_complex: bool = Field(
        False,
        description="one complex64 rotary table (torch.polar); q/k rotate as complex fp32 copies, cast back "
        "(Llama4TextRotaryEmbedding, apply_rotary_emb)",
    )
    attn_temperature_tuning: bool = Field(
        False,
        description="NoPE layers scale the queries by a per-position fp32 factor, an fp32 product cast back "
        "(Llama4TextAttention attn_temperature_tuning)",
    )
    moe_scaled_input: bool = Field(
        False,
        description="MoE: sigmoid top-k router scores scale a copy of the input per expert, every expert "
        "runs "
        "on every token with bmm, summed with the shared expert in place (Llama4TextMoe, Llama4TextExperts)",
    )

    # gpt-oss (models/gpt_oss/modeling_gpt_oss.py): no SDPA path, the default falls back to eager
    # (GptOssPreTrainedModel._supports_sdpa = False); GptOssRotaryEmbedding's head_dim / 2 tables and
    # _apply_rotary_emb's chunks; GptOssRMSNorm's (weight * fp32 states).to(dtype); GptOssTopKRouter's softmax
    # over the top-k logits; GptOssExperts._apply_gate, the clamped SwiGLU over interleaved columns
    sdpa_supported: bool = True
    rotary_half_tables: bool = False
    norm_product_fp32: bool = False
    router_topk_softmax: bool = False
    # DeepseekV4Experts._apply_gate (modeling_deepseek_v4.py): gate.clamp(max=limit), up.clamp(-limit, limit),
    # act(gate) * up over the halves (clamped_act_mul)
    experts_gate: Literal["act_mul", "clamped_swiglu", "clamped_act_mul"] = "act_mul"
    qk_norm_after_rope: bool = Field(
        False,
        description="the per-head q/k norms run after the rotary, not before it (HunYuanDenseV1Attention "
        "query_layernorm / key_layernorm)",
    )
    rope_fp32: bool = Field(
        False,
        description="cos/sin stay fp32 and the rotary runs on fp32 copies of q and k, cast back "
        "(Ernie4_5RotaryEmbedding.forward, Ernie4_5 apply_rotary_pos_emb)",
    )
    query_position_scale: bool = Field(
        False,
        description="after the rotary, the queries are multiplied by a per-position factor (fp32, cast to "
        "the "
        "queries' dtype): a new query tensor (Ministral3Attention get_llama_4_attn_scale)",
    )
    causal_mask_buffer: bool = Field(
        False,
        description="the model registers a bool [max_positions, max_positions] lower-triangular buffer it "
        "never "
        "reads (GPTBigCodeModel.bias)",
    )
    rope_upcast: bool = Field(
        False,
        description="q and k are copied to fp32 before the rotary (cos/sin stay in the activation dtype) and "
        "the results cast back (Cohere2 apply_rotary_pos_emb: q.float(), k.float())",
    )
    layernorm_ops: bool = Field(
        False,
        description="LayerNorm written op by op in fp32 (mean, centred square, rsqrt, weight.to(float32) * "
        "x, cast back), not F.layer_norm (Cohere2LayerNorm.forward)",
    )
    logits_scaled: bool = Field(
        False,
        description="the head's logits multiplied by a float into a new tensor (Cohere2ForCausalLM "
        "logits * logit_scale)",
    )
    attention_code: Literal["shared", "gptj"] = Field(
        "shared",
        description="the attention's modeling code: the shared one (LlamaAttention and its kin), or "
        "GPTJAttention (one sin/cos table, rotary slices kept to the end, fp32 eager scores; replay/gptj.py)",
    )
    rope_tables_fp32: bool = Field(
        False,
        description="cos/sin stay fp32 (Olmo3RotaryEmbedding.forward returns them uncast), so the rotary's "
        "products are fp32, cast back to q's and k's dtype (Olmo3 apply_rotary_pos_emb)",
    )
    rotary_mrope: bool = Field(
        False,
        description="multimodal rotary over text positions: fp32 [3, b, q, d/2] frequency tables recomposed "
        "into [b, q, d] cos/sin per batch row (Qwen3_5TextRotaryEmbedding)",
    )
    key_scaled: bool = Field(
        False,
        description="the keys are multiplied by a float into a new tensor before the rotary "
        "(FalconH1Attention key_states * key_multiplier)",
    )
    residual_scaled: bool = Field(
        False,
        description="each sub-layer's output is multiplied by a float into a new tensor before the residual "
        "add (GraniteMoeHybridDecoderLayer residual + hidden_states * residual_multiplier)",
    )
    logits_float: bool = Field(
        False,
        description="the head's output upcast to a new fp32 tensor whatever the loss (NemotronHForCausalLM "
        "logits = self.lm_head(hidden_states).float())",
    )
    peft_expert_targets: tuple[tuple[str, str], ...] = Field(
        (),
        description="the transformers-4 names of the routed experts' projections PEFT renames onto "
        "transformers 5's fused expert stacks (v4 name, stack), empty where PEFT converts nothing "
        "(peft utils/transformers_weight_conversion.py _MOE_TARGET_MODULE_MAPPING: Mixtral's w1 / w3 / w2, "
        "Qwen2-MoE's gate_proj / up_proj / down_proj)",
    )
