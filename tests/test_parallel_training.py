"""Model parallelism per rank against numbers derived by hand from the runtimes' code: sequence parallelism,
the TP head, context-parallel sharding and buffers, pipeline schedules, expert parallelism, and the checks."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import load_config_file
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.parallel import Degrees, rank_spec
from gpumem_gui.core.training import estimate_training, make_training_run, simulate_rank, step_config
from gpumem_gui.core.training.estimate import _stage_phases
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "reference" / "configs"
LLAMA, MIXTRAL = "meta-llama__Llama-3.2-1B", "mistralai__Mixtral-8x7B-v0.1"


@cache
def _spec(name: str) -> ModelSpec:
    return load_config_file(CONFIGS / f"{name}.json")


def _run(**kw: Any) -> Any:
    return make_training_run(**{"batch": 1, "seq": 1024, "precision": "amp-bf16", **kw})


def _component(est: Any, phase: str, key: str) -> int:
    return sum(c.bytes for c in est.phases[phase].components if c.key == key)


# ---- tensor and sequence parallelism --------------------------------------------------------------------


def test_the_head_is_vocab_parallel_only_where_the_framework_keeps_it_sharded() -> None:
    spec = _spec(LLAMA)
    for fw, shards, gather in (
        ("pytorch", 1, 4),
        ("hf-trainer", 1, 4),
        ("torchtitan", 4, 1),
        ("megatron", 4, 1),
    ):
        cfg, rspec = step_config(spec, _run(tp=4, framework=fw))
        assert (cfg.vocab_shards, cfg.logits_gather) == (shards, gather), fw
        assert rspec.vocab_size == spec.vocab_size // 4  # VocabParallelEmbedding / RowwiseParallel rows
    cfg, _ = step_config(spec, _run(tp=1, framework="torchtitan"))
    assert (cfg.vocab_shards, cfg.logits_gather, cfg.sequence_shards) == (1, 1, 1)


def test_torchtitan_loss_parallel_is_torchs_dtensor_cross_entropy() -> None:
    """torch/distributed/tensor/parallel/loss.py on the rank's vocabulary shard (L = fp32 shard logits):
    forward ``_log_softmax`` holds the bf16 logits, their fp32 copy, ``shifted`` and ``exp(shifted)`` (3.5 L
    + the row max); backward ``_nll_loss_and_log_softmax_backward`` holds the saved result with
    ``zeros_like``, ``exp`` and their sum (4 L)."""
    spec = _spec(LLAMA)
    res, cfg, rspec = simulate_rank(spec, _run(framework="torchtitan", tp=2))
    t = cfg.tokens
    big = t * rspec.vocab_size * 4
    fw, bw = res.phases["forward"], res.phases["backward"]
    assert fw.where == "loss" and fw.by_tag["logits"] == 3 * big + big // 2 + 4 * t
    assert bw.where == "loss (backward)" and bw.by_tag["logits"] == big
    assert 3 * big <= bw.by_tag["temporaries"] < 3 * big + 1024


def test_a_gathered_head_holds_full_vocabulary_logits() -> None:
    """transformers' colwise_gather_output: the loss sees tokens x vocab; vocab-parallel: tokens x vocab/tp.
    The fp32 log-softmax the loss saves is the largest logits tensor: 4 B x tokens x vocab (/ tp)."""
    spec = _spec(LLAMA)
    t, v = 1024, spec.vocab_size
    gathered, parallel = (
        simulate_rank(spec, _run(tp=4, framework=fw))[0].phases["backward"].by_tag["logits"]
        for fw in ("pytorch", "torchtitan")
    )
    assert 4 * t * v <= gathered
    assert 4 * t * (v // 4) <= parallel < 4 * t * v


def test_sequence_parallelism_splits_the_norms_over_the_tp_ranks() -> None:
    """Llama under autocast with fp32 weights: each RMSNorm keeps its fp32 normed input (4 B x tokens x
    hidden, saved by ``weight * hidden``) and its fp32 rsqrt (4 B x tokens); 2 norms a layer plus the final
    one, whose output the model's outputs keep (4 B x tokens x hidden). Without SP every TP rank holds them
    for all tokens; with SP for tokens / tp."""
    spec = _spec(LLAMA)
    h, t, n_norms = spec.hidden_size, 1024, 2 * spec.num_layers + 1
    for sp, tokens in ((False, t), (True, t // 4)):
        res = simulate_rank(spec, _run(tp=4, sequence_parallel=sp))[0]
        want = n_norms * (4 * tokens * h + 4 * tokens) + 4 * tokens * h
        assert res.phases["forward"].by_tag["norm"] == want, sp


def test_megatron_sequence_parallelism_saves_the_shard_and_reuses_one_gather_buffer() -> None:
    """LinearWithGradAccumulationAndAsyncCommunication: ctx.save_for_backward(input) is the local shard; the
    gather lands in the global memory buffer 'mpu', one batch x seq x hidden tensor for the whole step."""
    spec = _spec(LLAMA)
    run = _run(tp=4, sequence_parallel=True, framework="megatron", precision="megatron-bf16")
    est = estimate_training(spec, run)
    assert _component(est, "forward", "sp_gather_buffer") == 1024 * spec.hidden_size * 2
    dtensor = estimate_training(
        spec, _run(tp=4, sequence_parallel=True, framework="torchtitan", precision="bf16")
    )
    assert _component(dtensor, "forward", "sp_gather_buffer") == 0
    assert est.facts["activation_bytes_per_microbatch"] < dtensor.facts["activation_bytes_per_microbatch"]


def test_dtensor_embedding_gradient_is_the_whole_vocabulary() -> None:
    spec = _spec(LLAMA)
    est = estimate_training(spec, _run(tp=4))
    want = (spec.vocab_size - spec.vocab_size // 4) * spec.hidden_size * 4  # fp32 gradient beyond the shard
    assert _component(est, "optimizer", "tp_embedding_grad") == want
    assert _component(est, "forward", "tp_embedding_grad") == 0
    mega = estimate_training(spec, _run(tp=4, framework="megatron", precision="megatron-bf16"))
    assert _component(mega, "optimizer", "tp_embedding_grad") == 0


# ---- context parallelism ----------------------------------------------------------------------------------


def test_fsdp_shards_parameters_and_states_over_dp_times_cp() -> None:
    """torchtitan's dp_shard_cp mesh: FSDP over dp=2 x cp=2 shards as FSDP over 4 ranks."""
    spec = _spec(LLAMA)
    cp = simulate_rank(spec, _run(dp=2, cp=2, fsdp="full_shard", seq=2048))[0]
    dp = simulate_rank(spec, _run(dp=4, cp=1, fsdp="full_shard", seq=1024))[0]
    assert cp.param_bytes == dp.param_bytes
    assert cp.state_bytes == dp.state_bytes
    assert cp.grad_bytes == dp.grad_bytes


def test_context_parallel_buffers_ring_and_allgather() -> None:
    spec = _spec(LLAMA)
    kv = spec.num_kv_heads * spec.head_dim
    q = 4096 // 4
    ring = estimate_training(spec, _run(cp=4, seq=4096, framework="megatron", precision="megatron-bf16"))
    assert _component(ring, "forward", "context_parallel") == 2 * 2 * q * kv * 2
    gather = estimate_training(spec, _run(cp=4, seq=4096, framework="torchtitan"))
    merged = q * spec.num_attention_heads * spec.head_dim * 4
    assert _component(gather, "forward", "context_parallel") == (4 + 1) * 2 * q * kv * 2 + merged


# ---- pipeline schedules -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "virtual", "held"),
    [
        ("1f1b", 1, 4.0),  # min(pp - 0, m) = 4
        ("gpipe", 1, 8.0),  # all m = 8 micro-batches
        ("zero-bubble", 1, 4.0),  # ZB-H1: as 1F1B
        ("interleaved-1f1b", 2, 5.5),  # ((4-0-1) x 2 + (2-1) x 4 + 1) = 11 chunks / 2
    ],
)
def test_first_stage_holds_the_schedules_micro_batches(schedule: str, virtual: int, held: float) -> None:
    spec = _spec(LLAMA)
    run = _run(pp=4, grad_accum=8, pp_schedule=schedule, pp_virtual=virtual)
    phases, res, _ = _stage_phases(spec, run, 0)
    extra = (held - 1) * res.microbatch_activations
    got = sum(c.bytes for c in phases["forward"].components if c.key == "pipeline_inflight")
    assert got == round(extra)
    zb = sum(c.bytes for c in phases["forward"].components if c.key == "zero_bubble_w")
    assert (zb > 0) == (schedule == "zero-bubble")


def test_fsdp2_under_pipelining_keeps_its_stage_unsharded_and_accumulates_fp32_gradients() -> None:
    """torchtitan (apply_fsdp: reshard_after_forward = not pp_enabled) keeps every unit of the stage gathered
    in bf16; torch pipelining (stage.py backward_maybe_with_nosync) reduces nothing until the last
    micro-batch, so the stage's gradients accumulate unsharded in the fp32 reduce dtype (_fsdp_param.py
    to_accumulated_grad_if_needed); the kept parameters are no micro-batch's activations."""
    spec = _spec(LLAMA)
    fsdp = {"framework": "torchtitan", "precision": "mp-bf16", "pp": 4, "grad_accum": 8}
    phases, res, _ = _stage_phases(spec, _run(fsdp="full_shard", dp=4, **fsdp), 0)
    numel = res.trainable_params  # the stage's parameters, all trained
    assert _component_of(phases, "forward", "gathered_parameters") == 2 * numel
    assert _component_of(phases, "forward", "unsharded_gradients") == 4 * numel
    assert _component_of(phases, "backward", "unsharded_gradients") == 4 * numel
    _, plain, _ = _stage_phases(spec, _run(**{**fsdp, "precision": "bf16"}), 0)  # no FSDP: bf16 weights
    assert res.microbatch_activations == plain.microbatch_activations
    assert _component_of(phases, "forward", "pipeline_inflight") == 3 * res.microbatch_activations


def _component_of(phases: Any, phase: str, key: str) -> int:
    return sum(c.bytes for c in phases[phase].components if c.key == key)


def test_last_stage_of_1f1b_holds_one_micro_batch() -> None:
    from gpumem_gui.core.training.model_parallel import in_flight

    run = _run(pp=4, grad_accum=8)
    assert in_flight(run, 3)[0] == 1
    assert in_flight(run.model_copy(update={"pp_schedule": "gpipe"}), 3)[0] == 8
    assert in_flight(run.model_copy(update={"grad_accum": 2}), 0)[0] == 2  # fewer micro-batches than stages


# ---- expert parallelism -----------------------------------------------------------------------------------


def test_expert_parallel_rank_routes_top_k_rows_and_exchanges_them() -> None:
    spec = _spec(MIXTRAL)  # 8 experts, top-2
    rspec = rank_spec(spec, Degrees(ep=8), 0)
    assert rspec.moe is not None and rspec.moe.num_experts == 1
    assert rspec.moe.experts_per_token == 2  # balanced routing: t x top_k rows reach the rank's expert
    est = estimate_training(spec, _run(dp=8, ep=8, seq=512, zero=3))
    assert _component(est, "forward", "expert_parallel") == 2 * 512 * 2 * spec.hidden_size * 2


# ---- checks and invariance --------------------------------------------------------------------------------


def test_checks_name_the_field() -> None:
    with pytest.raises(GpumemInputError) as e:
        estimate_training(_spec(LLAMA), _run(tp=4, sequence_parallel=True, seq=1022))
    assert e.value.field == "sequence_parallel"
    with pytest.raises(GpumemInputError) as e:
        estimate_training(
            _spec(LLAMA), _run(pp=4, pp_schedule="interleaved-1f1b", pp_virtual=3, grad_accum=8)
        )
    assert e.value.field == "pp_virtual"
    with pytest.raises(GpumemInputError) as e:
        estimate_training(
            _spec(LLAMA), _run(pp=4, pp_schedule="interleaved-1f1b", pp_virtual=2, grad_accum=6)
        )
    assert e.value.field == "grad_accum"


def test_one_gpu_ignores_the_model_parallel_options() -> None:
    spec = _spec(LLAMA)
    base = estimate_training(spec, _run())
    for kw in ({"sequence_parallel": True}, {"pp_schedule": "gpipe"}, {"pp_virtual": 2}):
        assert estimate_training(spec, _run(**kw)).peak_bytes == base.peak_bytes, kw


def test_interleaved_with_as_many_micro_batches_as_stages_warms_up_everything() -> None:
    """schedules.py: num_microbatches == pipeline_parallel_size -> all_warmup_microbatches on every rank."""
    from gpumem_gui.core.training.model_parallel import in_flight

    run = _run(pp=4, grad_accum=4, pp_schedule="interleaved-1f1b", pp_virtual=2)
    assert [in_flight(run, s)[0] for s in range(4)] == [4.0, 4.0, 4.0, 4.0]
    run8 = run.model_copy(update={"grad_accum": 8})
    assert [in_flight(run8, s)[0] for s in range(4)] == [5.5, 4.5, 3.5, 2.5]  # (11, 9, 7, 5) chunks / 2


def test_qlora_base_is_sharded_under_deepspeed_zero3_as_under_fsdp() -> None:
    """bnb_4bit_quant_storage=bf16 lets ZeRO-3 partition the packed 4-bit weights (HF PEFT docs, "DeepSpeed
    ZeRO-3 + QLoRA"); ZeRO-2 leaves every rank the whole base."""
    spec = _spec("Qwen__Qwen2.5-0.5B")

    def params(**kw: object) -> int:
        run = make_training_run(method="qlora", precision="bf16", seq=128, **kw)  # type: ignore[arg-type]
        est = estimate_training(spec, run)
        return next(c.bytes for c in est.components if c.key == "parameters")

    z2, z3_2, z3_8 = params(zero=2, dp=8), params(zero=3, dp=2), params(zero=3, dp=8)
    assert z3_8 < z3_2 < z2
    fsdp = params(fsdp="full_shard", dp=8, fsdp_version=1)
    assert abs(z3_8 - fsdp) < 0.1 * fsdp


def test_torchtitan_splits_interleaved_chunks_unevenly() -> None:
    """torchtitan generate_llm_fqn_per_model_part: the embedding and the head count as a layer each; Megatron
    (the default framework) still refuses layers that do not divide into pp x pp_virtual chunks."""
    from gpumem_gui.core.spec.parallel import weighted_chunk_layers

    # Llama 3.1 405B: 126 layers over 8 x 2 chunks -> 7 (+ embedding), 8 x 14, 7 (+ head)
    held = [weighted_chunk_layers(126, 8, 2, s) for s in range(8)]
    assert [len(h) for h in held] == [15, 16, 16, 16, 16, 16, 16, 15]
    assert held[0][:8] == (0, 1, 2, 3, 4, 5, 6, 63) and held[7][-1] == 125
    assert sorted(i for h in held for i in h) == list(range(126))
    # 32 layers over 4 x 2 chunks: 34 effective -> 5, 5, 4 x 5, 4 less the embedding / head
    assert [len(weighted_chunk_layers(32, 4, 2, s)) for s in range(4)] == [8, 9, 8, 7]
    spec = _spec(LLAMA)  # 16 layers over 3 x 2 chunks (18 effective: 3 each) -> 2, 3, 3, 3, 3, 2
    kw = {"pp": 3, "pp_schedule": "interleaved-1f1b", "pp_virtual": 2, "grad_accum": 6}
    with pytest.raises(GpumemInputError) as e:
        estimate_training(spec, _run(**kw))
    assert e.value.field == "pp_virtual"
    titan = _run(framework="torchtitan", **kw)
    est = estimate_training(spec, titan)
    assert [r.key for r in est.ranks] == ["pp0", "pp1", "pp2"]
    # (2 + 3), (3 + 3), (3 + 2) layers; the even contiguous split would be 6, 5, 5
    assert [step_config(spec, titan, s)[1].num_layers for s in range(3)] == [5, 6, 5]
    assert weighted_chunk_layers(16, 3, 2, 1) == (2, 3, 4, 11, 12, 13)
