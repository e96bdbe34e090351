"""The training rows of ``bench_core.py``: issue 30's examples at a new point of a known model and run shape
(read off the step's tape) and as the first estimate of their shape (replayed), and the older uncached rows.

Never run by the test suite.
"""

from __future__ import annotations

from collections.abc import Callable

from gpumem_gui.core import load_model
from gpumem_gui.core.fit import GpuTarget
from gpumem_gui.core.fit.training import fit_training
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training import estimate_training, make_training_run

Case = tuple[str, Callable[[], object], str]


def _spec(model: str) -> ModelSpec:
    spec = load_model(model).spec
    assert spec is not None
    return spec


def clear_training_cache() -> None:
    """estimate_training memoises the step per (spec, run) and keeps the step's tapes per model and run shape
    (core/replay/step_tape.py); a cold call (the first estimate of a new model x run shape) clears both."""
    from gpumem_gui.core.replay import step_tape
    from gpumem_gui.core.training import checks, rank

    rank._simulate_cached.cache_clear()
    step_tape.clear()
    for kept in ("_adapter_checks", "_unused_notes"):  # kept per run shape
        getattr(checks, kept, None) and getattr(checks, kept).cache_clear()


# issue 30's training examples (Llama-3.1-8B, b1): one GPU full; LoRA + checkpointing; ZeRO-3 dp 8; torchtitan
# FSDP2 x TP 2 + SP x PP 2 (the README's per-rank command)
TRAIN_EXAMPLES: dict[str, dict[str, object]] = {
    "one GPU full": {},
    "LoRA + ckpt": {"method": "lora", "grad_ckpt": True},
    "ZeRO-3 dp8": {"zero": 3, "dp": 8},
    "ZeRO-3 dp8 x TP2": {"zero": 3, "dp": 8, "tp": 2, "gpus": 16},
    "torchtitan FSDP2 x TP2 + SP x PP2": {
        "framework": "torchtitan",
        "precision": "mp-bf16",
        "fsdp": "full_shard",
        "dp": 4,
        "tp": 2,
        "sequence_parallel": True,
        "pp": 2,
        "grad_accum": 8,
        "grad_ckpt": True,
        "ckpt_policy": "selective-op",
    },
}
NEW_POINT = "estimate: training {}, new point of a known shape"


def _first(spec: ModelSpec, fields: dict[str, object]) -> Callable[[], object]:
    """The first training estimate of a model x run shape (b1 s4096): no memo, no tape."""
    run = make_training_run(batch=1, seq=4096, **fields)
    return lambda: (clear_training_cache(), estimate_training(spec, run))


def _new_points(spec: ModelSpec, fields: dict[str, object]) -> Callable[[], object]:
    """Each call a training estimate at a sequence length not asked before (steps of 2 tokens from 4096: a
    multiple of tp with sequence parallelism), the model and run shape known: its first points (replayed)
    and the one that records its tapes are asked here, before the timing."""
    from gpumem_gui.core.replay import step_tape

    base = make_training_run(batch=1, seq=4096, **fields)
    seqs = iter(range(4096, 1 << 30, 2))

    def call() -> object:
        return estimate_training(spec, base.model_copy(update={"seq": next(seqs)}))

    for _ in range(step_tape.REPLAYED_FIRST + 1):
        call()
    return call


def training_cases(llama: ModelSpec, h100: int) -> list[Case]:
    train = make_training_run(method="lora", batch=1, seq=4096, grad_ckpt=True)
    train_z3 = make_training_run(batch=1, seq=4096, zero=3, dp=8, tp=2, gpus=16)
    h100_target = GpuTarget(name="H100-SXM-80GB", capacity_bytes=h100)
    qwen_next = _spec("Qwen/Qwen3-Next-80B-A3B-Instruct")
    long_linear = make_training_run(batch=1, seq=262144, zero=3, dp=8)
    new_points = [
        (NEW_POINT.format(name), _new_points(llama, fields), "read off the step's tape (issue 30)")
        for name, fields in TRAIN_EXAMPLES.items()
    ]
    first = [
        (f"estimate: training {name}, first of its shape", _first(llama, fields), "replayed (no tape yet)")
        for name, fields in TRAIN_EXAMPLES.items()
    ]
    # the caching allocator model (on by default, issue 31) against its flat 5 % reserve: the step's tape
    # alone, and the allocator's run on the tape's event stream
    flat = [
        (
            NEW_POINT.format(f"{name}, allocator model off"),
            _new_points(llama, {**TRAIN_EXAMPLES[name], "allocator_model": False}),
            "read off the step's tape, flat reserve",
        )
        for name in ("one GPU full", "LoRA + ckpt")
    ]
    train_flat = train.model_copy(update={"allocator_model": False})
    return [
        *new_points,
        *flat,
        *first,
        (
            "estimate: training Qwen3-Next-80B s262144 ZeRO-3, uncached",
            lambda: (clear_training_cache(), estimate_training(qwen_next, long_linear)),
            "gated DeltaNet chunk loop: steps independent of seq (issue 33)",
        ),
        (
            "estimate: training LoRA Llama-3.1-8B b1 s4096 ckpt",
            lambda: estimate_training(llama, train),
            "replays the whole step (cached per run)",
        ),
        (
            "estimate: training, uncached",
            lambda: (clear_training_cache(), estimate_training(llama, train)),
            "forward + backward + optimizer replayed",
        ),
        (
            "estimate: training full ZeRO-3 dp8 x TP2, uncached",
            lambda: (clear_training_cache(), estimate_training(llama, train_z3)),
            "",
        ),
        (
            "fit_training end to end (LoRA, H100), uncached",
            lambda: (clear_training_cache(), fit_training(llama, train, h100_target)),
            "galloping searches over batch, seq, GPUs",
        ),
        (
            "fit_training end to end (LoRA, H100), uncached, allocator model off",
            lambda: (clear_training_cache(), fit_training(llama, train_flat, h100_target)),
            "the flat 5 % reserve: the step's tape alone",
        ),
    ]
