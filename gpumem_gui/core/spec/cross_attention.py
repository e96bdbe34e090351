"""What Llama 3.2 Vision's cross-attention layers (layer type ``cross_attention``) cache (transformers 5.24,
``models/mllama/modeling_mllama.py``, ``cache_utils.py``).

* Text only: ``MllamaTextModel.forward`` skips a cross-attention layer that gets no
  ``cross_attention_states`` and has none cached, so its DynamicLayer stays empty: 0 bytes, whatever the
  sequence (spec/kv.py counts no per-token keys for it: ``STATE_LAYER_TYPES``).
* With images: the first forward projects the vision tokens once (``MllamaTextCrossAttention``: k_proj /
  v_proj of ``cross_attention_states``, k_norm over the keys) and ``cache.update`` stores them; the later
  steps get no ``pixel_values`` (``prepare_inputs_for_generation``) and read the cached keys and values. Each
  cross-attention layer then holds, per sequence, ``images x max_num_tiles x num_patches`` tokens of
  ``num_key_value_heads x head_dim`` keys and as many values, fixed for the whole generation
  (``MllamaForConditionalGeneration._prepare_static_cache`` sizes its StaticLayer the same). Measured:
  tests/reference/extra/cross_cache_mllama.json (validation/measure_cross_cache.py).
"""

from __future__ import annotations

from gpumem_gui.core.spec.kinds import CrossAttention
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec


def cross_attention_layers(spec: ModelSpec) -> int:
    """How many layers are cross-attention layers (0 for a model without them)."""
    return len(model_kinds(spec).layers_of("cross_attention"))


def cross_tokens_per_image(spec: ModelSpec) -> int:
    """Vision tokens one image gives each cross-attention layer (``max_num_tiles x num_patches``: every image
    is padded to ``max_num_tiles`` tiles by MllamaImageProcessor)."""
    return spec.vision.image_tokens if spec.vision is not None else 0


def cross_cache_bytes_per_layer(
    spec: ModelSpec, images: int, batch: int = 1, bytes_per_element: float = 2
) -> tuple[int, ...]:
    """Per-layer bytes the cross-attention layers hold for ``batch`` sequences of ``images`` images each
    (keys and values, ``bytes_per_element`` each); 0 on every other layer, and everywhere without images."""
    tokens = batch * images * cross_tokens_per_image(spec)
    per = round(2 * tokens * spec.num_kv_heads * spec.head_dim * bytes_per_element)
    kinds = model_kinds(spec)
    return kinds.per_layer(lambda _: per, kinds.of(CrossAttention))


def cross_cache_bytes(spec: ModelSpec, images: int, batch: int = 1, bytes_per_element: float = 2) -> int:
    """All cross-attention layers' cached vision keys and values (:func:`cross_cache_bytes_per_layer`)."""
    return sum(cross_cache_bytes_per_layer(spec, images, batch, bytes_per_element))
