"""Property tests (hypothesis) over random valid architectures."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpumem_gui.core.spec.kv import kv_bytes_per_token_per_layer, kv_cache_bytes_transformers
from gpumem_gui.core.spec.model import MLASpec, ModelSpec, MoESpec
from gpumem_gui.core.spec.params import COMPONENTS, count_params, text_tensors


@st.composite
def specs(draw: st.DrawFn) -> ModelSpec:
    kv = draw(st.integers(1, 8))
    group = draw(st.integers(1, 4))
    heads = kv * group
    head_dim = draw(st.sampled_from([16, 32, 64, 128]))
    layers = draw(st.integers(1, 6))
    hidden = draw(st.integers(1, 64)) * 16
    window = draw(st.none() | st.integers(2, 4096))
    layer_types = (
        tuple(
            draw(
                st.lists(
                    st.sampled_from(["full_attention", "sliding_attention"]), min_size=layers, max_size=layers
                )
            )
        )
        if window
        else ()
    )
    moe = None
    if draw(st.booleans()):
        n_exp = draw(st.integers(1, 16))
        moe = MoESpec(
            num_experts=n_exp,
            experts_per_token=draw(st.integers(1, n_exp)),
            expert_intermediate_size=draw(st.integers(1, 512)),
            shared_expert_intermediate_size=draw(st.integers(0, 512)),
            shared_expert_gate=draw(st.booleans()),
            dense_layers=tuple(sorted(draw(st.sets(st.integers(0, layers - 1))))),
        )
    mla = None
    if draw(st.booleans()):
        mla = MLASpec(
            q_lora_rank=draw(st.none() | st.integers(1, 256)),
            kv_lora_rank=draw(st.integers(1, 256)),
            qk_nope_head_dim=draw(st.integers(1, 64)),
            qk_rope_head_dim=2 * draw(st.integers(1, 32)),  # even: the rotary halves
            v_head_dim=draw(st.integers(1, 64)),
        )
    learned = draw(st.booleans())
    return ModelSpec(
        name="random",
        model_type="llama",
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=draw(st.integers(1, 4096)),
        vocab_size=draw(st.integers(1, 200_000)),
        tie_word_embeddings=draw(st.booleans()),
        position_embedding="learned" if learned else "rope",
        learned_position_rows=draw(st.integers(1, 4096)) if learned else 0,
        norm=draw(st.sampled_from(["rmsnorm", "layernorm"])),
        norm_bias=draw(st.booleans()),
        norms_per_layer=draw(st.integers(1, 4)),
        qk_norm=draw(st.sampled_from(["none", "per_head", "full_width"])),
        qkv_bias=draw(st.booleans()),
        o_bias=draw(st.booleans()),
        mlp_bias=draw(st.booleans()),
        mlp_gated=draw(st.booleans()),
        sliding_window=window,
        layer_types=layer_types,
        moe=moe,
        mla=mla,
    )


@settings(max_examples=200, deadline=None)
@given(specs())
def test_components_add_up_and_are_non_negative(spec: ModelSpec) -> None:
    c = count_params(spec)
    assert set(c.by_component) == set(COMPONENTS)
    assert all(v >= 0 for v in c.by_component.values())
    assert sum(c.by_component.values()) == c.total
    assert sum(c.per_layer) <= c.total
    assert 0 < c.active_per_token <= c.total
    assert c.total == sum(t.numel for t in text_tensors(spec))
    assert all(d > 0 for t in text_tensors(spec) for d in t.shape)


@settings(max_examples=100, deadline=None)
@given(specs())
def test_more_layers_never_fewer_params(spec: ModelSpec) -> None:
    bigger = spec.model_copy(
        update={
            "num_layers": spec.num_layers + 1,
            "layer_types": (*spec.layer_types, "full_attention") if spec.layer_types else (),
        }
    )
    bigger = ModelSpec.model_validate(bigger.model_dump())
    assert count_params(bigger).total > count_params(spec).total


@settings(max_examples=100, deadline=None)
@given(specs(), st.integers(0, 10_000), st.integers(1, 8))
def test_kv_cache_grows_with_tokens_and_batch(spec: ModelSpec, tokens: int, batch: int) -> None:
    per = kv_bytes_per_token_per_layer(spec)
    assert len(per) == spec.num_layers and all(p > 0 for p in per)
    a = kv_cache_bytes_transformers(spec, tokens, batch)
    b = kv_cache_bytes_transformers(spec, tokens + 1, batch)
    c = kv_cache_bytes_transformers(spec, tokens, batch + 1)
    assert all(x <= y for x, y in zip(a, b, strict=True))
    assert all(x <= y for x, y in zip(a, c, strict=True))
    assert sum(a) <= batch * tokens * sum(per)
