"""vLLM's encoder profile for a model with a vision tower: what ``profile_run`` adds to the profiled torch
peak before the language model's dummy forward.

The rules, from ``vllm/v1/worker/gpu_model_runner.py`` ``GPUModelRunner.profile_run`` and
``vllm/multimodal/encoder_budget.py`` / ``vllm/v1/core/encoder_cache_manager.py`` (vLLM main, 2026):

1. the budget: ``compute_mm_encoder_budget`` takes ``max(max_num_batched_tokens, max tokens per item)`` for
   both the encoder's compute budget and the encoder cache (``_get_max_num_batched_encoder_embeds``,
   ``_get_encoder_cache_size``, neither set on the command line); ``get_encoder_budget`` is their minimum;
2. the items: ``MultiModalBudget._get_max_items``: ``budget // tokens per item``, at most ``max_num_seqs x``
   the items one prompt holds (``max(1, min(limit_mm_per_prompt, max_model_len // tokens per item))``), at
   least 1; ``--limit-mm-per-prompt image=0`` drops the modality (no encoder profiling);
3. the dummy item: the processor's ``get_image_size_with_most_features`` (Qwen2-VL / Qwen3-VL: the
   ``max_pixels`` image, Gemma 3: the SigLIP side, Llama 4: the largest tile canvas plus the global tile),
   i.e. the largest image the model's processor passes (``VisionTower.max_side``); vLLM counts its tokens in
   embeddings (the merged features, ``EncoderCacheManager``: "operates on the level of multimodal
   embeddings");
4. ``_get_mm_dummy_batch`` batches that item ``items`` times onto the GPU (``group_and_batch_mm_kwargs``
   moves the processor's tensors to the device as they are: fp32 ``pixel_values`` from the HF image
   processors, bf16 from Llama 4's)
   and ``self.model.embed_multimodal(**batched_dummy_mm_inputs)`` runs the tower once on all of them;
5. the outputs go to ``self.encoder_cache[f"tmp_{i}"]``; ``batched_dummy_mm_inputs`` and
   ``dummy_encoder_outputs`` stay locals of ``profile_run``, so the inputs and the outputs are alive through
   ``_dummy_run(max_num_tokens)`` and ``_dummy_sampler_run`` and are freed only after them
   (``self.encoder_cache.clear()`` at the end).

So the profiled peak is ``max(tower peak, inputs + outputs + max(dummy forward, sampler run))``.

The tower's own activations are the transformers tower's replay (:func:`gpumem_gui.core.replay.vision.
tower_peak`, the one ``--images`` runs in the transformers engine) on ``items`` images of the dummy size and
no text. vLLM's towers compute the same layers with their own modules (``vllm/model_executor/models/
qwen2_5_vl.py``: ``Qwen2_5_VisionMLP`` a fused ``gate_up_proj`` in vLLM main, separate gate and up
projections up to v0.8.5; the windowed and full blocks as varlen attention over ``cu_seqlens``, no ``S x S``
scores, as the replay's SDPA flash kernel; the rotary's fp32 copies of q and k in the older
``apply_rotary_pos_emb_vision``, as the transformers tower keeps them): the replay stands for them, not
measured on a GPU here; on the one published log it decides (Qwen2.5-VL-3B on an L4,
tests/test_vllm_encoder.py) the KV pool comes 5 % over the logged one. With tensor parallelism vLLM shards
the tower's heads and MLP (``mm_encoder_tp_mode="weights"``); the replay is of the whole tower, an upper
side there (the engine warns).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.memory import DT_BYTES
from gpumem_gui.core.replay.vision import TowerPeak, pixel_bytes, tower_peak
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.vision import VisionTower, image_grid

# vllm/config/multimodal.py: --limit-mm-per-prompt defaults to 999 items of each modality
MM_LIMIT_DEFAULT = 999
# the replay's dtype names (core/replay/memory.py)
_REPLAY_DTYPES = {"bf16": "bf16", "fp16": "f16", "fp32": "f32"}


@dataclass(frozen=True)
class EncoderProfile:
    """What vLLM's encoder profile holds, in bytes per rank of the first pipeline stage."""

    items: int  # images the dummy batch holds
    item_tokens: int  # embeddings of one dummy image (the budget's unit)
    image_side: int  # pixels a side of the dummy image (0: the tower is not replayed)
    inputs: int  # the batched pixel_values on the GPU, alive through the whole profile run
    outputs: int  # the encoder outputs in encoder_cache, alive through the whole profile run
    tower_peak: int  # live bytes at the tower's peak, inputs and outputs included (0: not replayed)
    tower_where: str  # where the replay's peak is

    @property
    def held(self) -> int:
        """What the language model's dummy forward and the sampler run find allocated."""
        return self.inputs + self.outputs


def item_tokens(spec: ModelSpec) -> int:
    """Embeddings of vLLM's dummy image: the merged features of the largest image the processor passes
    (a replayed tower), else the reader's tokens per image."""
    if spec.vision is None:
        return 0
    tower = spec.vision.tower
    return image_grid(tower, tower.max_side).features if tower is not None else spec.vision.image_tokens


def encoder_items(spec: ModelSpec, run: InferenceRun, tokens: int, seqs: int, max_len: int) -> int:
    """Images the profiling run feeds the vision encoder at once (rules 1 and 2 above); 0 for a text model or
    ``--limit-mm-per-prompt image=0``."""
    per_item = item_tokens(spec)
    limit = MM_LIMIT_DEFAULT if run.images_per_prompt is None else run.images_per_prompt
    if not per_item or not limit:
        return 0
    budget = max(tokens, per_item)
    per_prompt = max(1, min(limit, max_len // per_item))
    return max(1, min(budget // per_item, seqs * per_prompt))


def encoder_profile(
    spec: ModelSpec, run: InferenceRun, tokens: int, seqs: int, max_len: int
) -> EncoderProfile | None:
    """The encoder profile of ``profile_run`` (rules 1 to 5), None when vLLM runs none (a text model, no
    images allowed)."""
    items = encoder_items(spec, run, tokens, seqs, max_len)
    if not items or spec.vision is None:
        return None
    per_item = item_tokens(spec)
    tower = spec.vision.tower
    dt = _REPLAY_DTYPES[run.compute_dtype]
    if tower is None:  # the tower is not replayed: the encoder cache alone, sized by the text model's width
        out = items * per_item * spec.hidden_size * run.dt
        return EncoderProfile(items, per_item, 0, 0, out, 0, "")
    side = tower.max_side
    grid = image_grid(tower, side)
    peak = _tower_peak(spec, tower, items, dt)
    inputs = items * pixel_bytes(tower, grid)  # the processor's pixel_values, moved to the GPU as they are
    outputs = items * grid.features * tower.out_hidden_size * round(DT_BYTES[dt])
    return EncoderProfile(items, per_item, side, inputs, outputs, peak.peak, peak.where)


@lru_cache(maxsize=64)
def _tower_peak(spec: ModelSpec, tower: VisionTower, items: int, dt: str) -> TowerPeak:
    """The tower's replay on the dummy batch: ``items`` sequences of one image of the largest size each and no
    text (q = 0); kept per model, batch and dtype (a fit's searches ask the same one at every point)."""
    cfg = ReplayConfig(
        batch=items, q=0, param_dt=dt, images=1, image_size=tower.max_side, weights_counted=False
    )
    return tower_peak(spec, cfg)
