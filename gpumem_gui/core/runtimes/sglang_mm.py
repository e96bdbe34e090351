"""What SGLang reserves for a multimodal model's vision path.

SGLang runs no profiling forward, of the language model or of the vision tower: ``ModelRunner.
profile_max_num_token`` (``python/sglang/srt/model_executor/model_runner.py``) sizes the token pool from the
free memory after loading and ``mem_fraction_static`` alone. The vision tower's activations at serving time
(the images of a prefill batch encoded at once, their embeddings cached in GPU memory) come out of the
reserve ``1 - mem_fraction_static``, which SGLang widens for a multimodal model when the fraction is its
default: ``ServerArgs.adjust_mem_fraction_for_vlm`` (``python/sglang/srt/server_args.py``, sgl-project/sglang
PR #6881; called from ``_handle_gpu_memory_settings`` when ``model_config.is_multimodal``) multiplies it by
``0.95 x clamp(1 - 0.1 x (L x H^2 / (24 x 1024^2) - 1), 0.8, 1.05)``, where ``L`` and ``H`` are
``getattr(vision_config, "num_hidden_layers", 24)`` and ``getattr(vision_config, "hidden_size", 1024)`` (the
baseline a ViT-L/14: 24 layers of 1024). A Qwen2.5-VL / Qwen3-VL vision config names its depth ``depth``,
so SGLang takes 24 layers for it. (SGLang's later post-capture KV sizing instead takes a fixed 8 GiB off the
fraction: ``python/sglang/srt/arg_groups/gpu_memory.py``; not modelled.)
"""

from __future__ import annotations

from gpumem_gui.core.spec.model import ModelSpec

# server_args.py adjust_mem_fraction_for_vlm (see the module docstring): the baseline ViT-L/14 and its factors
_BASE_FACTOR = 0.95
_BASE_LAYERS, _BASE_HIDDEN = 24, 1024
_SENSITIVITY = 0.1
_CLAMP = (0.8, 1.05)


def vlm_fraction_factor(spec: ModelSpec) -> float | None:
    """The factor SGLang multiplies its default ``mem_fraction_static`` by for ``spec``: 1 for a text model;
    None for a vision model whose vision config's sizes the readers do not keep (a tower that is not
    replayed: the factor is then not applied, and :func:`warnings` says so)."""
    if spec.vision is None:
        return 1.0
    tower = spec.vision.tower
    if tower is None:
        return None
    layers = tower.config_layers or _BASE_LAYERS  # getattr(vision_config, "num_hidden_layers", 24)
    ratio = layers * tower.hidden_size**2 / (_BASE_LAYERS * _BASE_HIDDEN**2)
    low, high = _CLAMP
    return _BASE_FACTOR * max(low, min(high, 1.0 - _SENSITIVITY * (ratio - 1.0)))


def warnings(spec: ModelSpec, fraction_is_default: bool) -> list[str]:
    """A vision model whose factor is unknown, with SGLang's default fraction."""
    if spec.vision is None or not fraction_is_default or vlm_fraction_factor(spec) is not None:
        return []
    return [
        "mem_fraction_static: SGLang lowers its default by 0.76 to 1.0 for a multimodal model, by the size "
        "of its vision tower (server_args.py adjust_mem_fraction_for_vlm); this model's tower sizes are not "
        "read, so the default is not lowered here: the KV pool may be up to a quarter over SGLang's"
    ]
