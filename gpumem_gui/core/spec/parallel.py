"""How a model is split over GPUs: the layers of each pipeline stage and what one tensor-parallel rank holds.

Shared by every runtime and by training: a rank's slice of the model is again a :class:`ModelSpec`, so the
replay and the byte accounting treat it like any model.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import ceil
from typing import Literal

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.spec.model import ModelSpec

Remainder = Literal["first", "last", "before_last"]


@dataclass(frozen=True)
class Degrees:
    """Tensor-, pipeline- and expert-parallel degrees of a plan."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    # which stages take the layers left over by an uneven split (stage_layers)
    remainder: Remainder = "first"


def check_degrees(spec: ModelSpec, degrees: Degrees) -> None:
    """Raise :class:`GpumemInputError` unless the model splits this way: tp divides the attention heads, pp
    is at most the layers, ep needs experts and divides them (inference and training add their own rule on
    which ranks the expert groups come from)."""
    if spec.num_attention_heads % degrees.tp:
        raise GpumemInputError(
            f"tensor parallel degree {degrees.tp} does not divide the {spec.num_attention_heads} attention "
            "heads",
            field="tp",
        )
    if degrees.pp > spec.num_layers:
        raise GpumemInputError(
            f"pipeline degree {degrees.pp} exceeds the {spec.num_layers} layers", field="pp"
        )
    if degrees.ep > 1:
        if spec.moe is None:
            raise GpumemInputError("expert parallelism needs a mixture-of-experts model", field="ep")
        if spec.moe.num_experts % degrees.ep:
            raise GpumemInputError(
                f"expert parallel degree {degrees.ep} does not divide the {spec.moe.num_experts} experts",
                field="ep",
            )


def stage_layers(spec: ModelSpec, pp: int, stage: int, remainder: Remainder = "first") -> range:
    """Layers of pipeline stage ``stage``: contiguous, ``layers // pp`` each, and the ``layers % pp`` left
    over one each on: the first stages (``"first"``); the last ones (``"last"``: sglang
    python/sglang/srt/distributed/utils.py ``get_pp_indices`` without ``SGLANG_PP_LAYER_PARTITION``); the
    stages before the last, counting back from the second to last (``"before_last"``: vllm
    vllm/distributed/utils.py ``get_pp_indices`` without ``VLLM_PP_LAYER_PARTITION``, ``partitions[-i] += 1``
    for i in 2 .. remainder + 1: the last stage, which also runs the norm and the head, never takes one)."""
    base, extra = divmod(spec.num_layers, pp)
    if remainder == "first":
        fuller = range(extra)
    elif remainder == "last":
        fuller = range(pp - extra, pp)
    else:
        fuller = range(pp - 1 - extra, pp - 1)
    start = stage * base + sum(1 for s in fuller if s < stage)
    return range(start, start + base + (stage in fuller))


def weighted_chunk_layers(num_layers: int, pp: int, virtual: int, stage: int) -> tuple[int, ...]:
    """Layers pipeline rank ``stage`` holds when the model is cut into ``pp x virtual`` chunks as torchtitan
    cuts it (torchtitan/distributed/pipeline_parallel.py ``generate_llm_fqn_per_model_part`` with
    ``input_weight = output_weight = 1``: the embedding and the norm + head count as one layer each, the
    ``layers + 2`` effective layers are spread evenly, the first chunks taking the remainder) and the
    chunks are dealt out round robin (``pipeline_module_split``, "loop" style: rank r holds chunks
    r, r + pp, ...). E.g. 126 layers over 16 chunks: 7 (with the embedding), 8 x 14, 7 (with the head)."""
    chunks = pp * virtual
    base, extra = divmod(num_layers + 2, chunks)
    if base < 1:
        raise GpumemInputError(
            f"pp_virtual: {num_layers} layers leave empty chunks over pp x pp_virtual = {chunks}",
            field="pp_virtual",
        )
    counts = [base + (1 if c < extra else 0) for c in range(chunks)]
    counts[0] -= 1  # the embedding
    counts[-1] -= 1  # the final norm and the head
    starts = [sum(counts[:c]) for c in range(chunks)]
    return tuple(i for c in range(stage, chunks, pp) for i in range(starts[c], starts[c] + counts[c]))


def rank_spec(
    spec: ModelSpec, degrees: Degrees, stage: int, layers: tuple[int, ...] | None = None
) -> ModelSpec:
    """The model as one tensor-parallel rank of pipeline stage ``stage`` sees it: heads, KV heads
    (replicated when tp exceeds them), MLP width, experts and vocabulary divided; only its layers
    (``layers``: these indices, e.g. :func:`weighted_chunk_layers`; else :func:`stage_layers`)."""
    if degrees.tp == 1 and degrees.pp == 1 and degrees.ep == 1:
        return spec
    return _rank_spec(spec, degrees.tp, degrees.pp, degrees.ep, stage, layers)


@lru_cache(maxsize=256)
def _rank_spec(
    spec: ModelSpec, tp: int, pp: int, ep: int, stage: int, held: tuple[int, ...] | None = None
) -> ModelSpec:
    run = Degrees(tp=tp, pp=pp, ep=ep)
    layers = held if held is not None else tuple(stage_layers(spec, run.pp, stage))
    kvh = max(1, spec.num_kv_heads // tp) if spec.num_kv_heads >= tp else 1
    heads = spec.num_attention_heads // tp
    moe = spec.moe
    if moe is not None:
        ep_share = max(1, run.ep)
        experts = max(1, moe.num_experts // ep_share)
        fe = moe.expert_intermediate_size if run.ep > 1 else ceil(moe.expert_intermediate_size / tp)
        moe = moe.model_copy(
            update={
                "num_experts": experts,
                "experts_per_token": min(moe.experts_per_token, experts),
                "expert_intermediate_size": max(1, fe),
                "shared_expert_intermediate_size": ceil(moe.shared_expert_intermediate_size / tp),
                "dense_layers": tuple(layers.index(i) for i in moe.dense_layers if i in layers),
            }
        )
    types = tuple(spec.resolved_layer_types[i] for i in layers) if spec.layer_types else ()
    update = {
        "num_layers": len(layers),
        "num_attention_heads": heads,
        "num_kv_heads": min(kvh, heads),
        "intermediate_size": max(1, ceil(spec.intermediate_size / tp)),
        "vocab_size": ceil(spec.vocab_size / tp),
        "layer_types": types,
        "moe": moe,
        # the stage's own layer numbering (NoPE layers: SmolLM3, Llama 4)
        "nope_layers": tuple(layers.index(i) for i in spec.nope_layers if i in layers),
    }
    out = ModelSpec.model_validate({**spec.model_dump(), **update})
    if (
        out.moe is not None
        and spec.moe is not None
        and out.moe.experts_per_token < spec.moe.experts_per_token
    ):
        # balanced routing: the rank's experts receive tokens x top_k rows from all EP ranks (Megatron-LM
        # MoEAlltoAllTokenDispatcher), also when it holds fewer than top_k experts; the spec's own check
        # (top-k at most the experts) is about a whole model
        k = spec.moe.experts_per_token
        out = out.model_copy(update={"moe": out.moe.model_copy(update={"experts_per_token": k})})
    return out
