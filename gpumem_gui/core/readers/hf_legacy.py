"""``config.json`` readers of the older families with their own config spellings (GPT-2, OPT, BLOOM,
Falcon, GPT-NeoX): ``n_embd``/``n_head``, learned or ALiBi positions, LayerNorm with biases, plain MLPs."""

from __future__ import annotations

from typing import Any

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.config_fields import ConfigReader, common


def _layernorm_mha(
    r: ConfigReader, name: str, mt: str, h: int, a: int, bias: bool, **rest: Any
) -> dict[str, Any]:
    """What these families share: as many K/V heads as query heads (unless ``rest`` says otherwise),
    LayerNorm with bias, a plain MLP, biases on every projection or on none, embeddings tied by default."""
    return (
        dict(
            name=name,
            model_type=mt,
            hidden_size=h,
            num_attention_heads=a,
            num_kv_heads=a,
            head_dim=r.head_dim(h, a),
            vocab_size=r.int("vocab_size"),
            tie_word_embeddings=r.bool("tie_word_embeddings", default=True),
            norm="layernorm",
            norm_bias=True,
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=bias,
            mlp_gated=False,
        )
        | rest
    )


def _gpt2(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    h = r.int("n_embd", "hidden_size")
    a = r.int("n_head", "num_attention_heads")
    n_pos = r.int("n_positions", "max_position_embeddings", default=1024)
    return _layernorm_mha(
        r,
        name,
        mt,
        h,
        a,
        bias=True,
        num_layers=r.int("n_layer", "num_hidden_layers"),
        intermediate_size=r.int("n_inner", default=4 * h),
        position_embedding="learned",
        learned_position_rows=n_pos,
        max_position_embeddings=n_pos,
        activation=str(r.get("activation_function", default="gelu_new")),
    )


def _opt(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    h = r.int("hidden_size")
    a = r.int("num_attention_heads")
    bias = r.bool("enable_bias", default=True)
    affine = r.bool("layer_norm_elementwise_affine", default=True)
    if not affine:
        raise GpumemInputError(
            "OPT without affine layer norms is not supported",
            source=r.source,
            field="layer_norm_elementwise_affine",
        )
    max_pos = r.int("max_position_embeddings", default=2048)
    final = r.bool("do_layer_norm_before", default=True) and not r.bool(
        "_remove_final_layer_norm", default=False
    )
    proj = r.int("word_embed_proj_dim", default=h)
    return _layernorm_mha(
        r,
        name,
        mt,
        h,
        a,
        bias=bias,
        num_layers=r.int("num_hidden_layers"),
        intermediate_size=r.int("ffn_dim"),
        embedding_dim=proj if proj != h else None,
        position_embedding="learned",
        # OPTLearnedPositionalEmbedding keeps 2 extra rows (offset 2)
        learned_position_rows=max_pos + 2,
        max_position_embeddings=max_pos,
        final_norm=final,
        activation=str(r.get("activation_function", default="relu")),
    )


def _bloom(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    h = r.int("hidden_size", "n_embed")
    a = r.int("n_head", "num_attention_heads")
    return _layernorm_mha(
        r,
        name,
        mt,
        h,
        a,
        bias=True,
        num_layers=r.int("n_layer", "num_hidden_layers"),
        intermediate_size=4 * h,
        embedding_norm=True,
        position_embedding="alibi",
        max_position_embeddings=r.int("seq_length", "max_position_embeddings", default=2048),
        activation="gelu",
    )


def _falcon(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    h = r.int("hidden_size")
    a = r.int("num_attention_heads", "n_head")
    new_arch = r.bool("new_decoder_architecture", default=False)
    parallel = r.bool("parallel_attn", default=True)
    if new_arch:
        kv = r.int("num_kv_heads", "n_head_kv", default=a)
    elif r.bool("multi_query", default=True):
        kv = 1
    else:
        kv = a
    n_ln = r.int("num_ln_in_parallel_attn", default=2 if new_arch else 1)
    norms = (2 if new_arch and n_ln == 2 else 1) + (0 if parallel else 1)
    bias = r.bool("bias", default=False)
    alibi = r.bool("alibi", default=False)
    return _layernorm_mha(
        r,
        name,
        mt,
        h,
        a,
        bias=bias,
        num_layers=r.int("num_hidden_layers", "n_layer"),
        num_kv_heads=kv,
        intermediate_size=r.int("ffn_hidden_size", default=4 * h),
        position_embedding="alibi" if alibi else "rope",
        max_position_embeddings=r.int("max_position_embeddings", default=2048),
        norms_per_layer=norms,
        parallel_attn_mlp=parallel,
        transformers_expands_kv=new_arch and kv < a,
        activation=str(r.get("activation", default="gelu")),
    )


def _gpt_neox(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    bias = r.bool("attention_bias", default=True)
    f = common(
        r,
        name,
        mt,
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=True,
        mlp_gated=False,
        norm="layernorm",
        norm_bias=True,
        parallel_attn_mlp=r.bool("use_parallel_residual", default=True),
        activation=str(r.get("hidden_act", default="gelu")),
    )
    f["num_kv_heads"] = f["num_attention_heads"]
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    return f
