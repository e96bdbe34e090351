"""The pure estimation core: no Qt, no NVML, no plotting (enforced by import-linter).

Python API::

    from gpumem_gui.core import load_model

    # a catalog id, a config.json, a model folder, a .safetensors or .gguf file, or a hub id:
    m = load_model("meta-llama/Llama-3.1-8B")
    m.params.total                                 # exact parameter count (tied weights once)
    m.spec.head_dim                                # the architecture (ModelSpec)
    m.weights.bytes_by_dtype if m.weights else None  # exact bytes from file headers

Bad input raises :class:`GpumemInputError` with one line naming the file/field and the problem.
"""

from gpumem_gui.core.errors import GpumemError, GpumemInputError
from gpumem_gui.core.kv import kv_bytes_per_token_per_layer, kv_cache_bytes_transformers
from gpumem_gui.core.loader import LoadedModel, load_model
from gpumem_gui.core.model import MLASpec, ModelSpec, MoESpec, VisionSpec
from gpumem_gui.core.params import ParamCounts, count_params

__all__ = [
    "GpumemError",
    "GpumemInputError",
    "LoadedModel",
    "MLASpec",
    "MoESpec",
    "ModelSpec",
    "ParamCounts",
    "VisionSpec",
    "count_params",
    "kv_bytes_per_token_per_layer",
    "kv_cache_bytes_transformers",
    "load_model",
]
