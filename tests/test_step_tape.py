"""Issue 30 item 1: a training step recorded once per model and run shape as a tape (core/replay/step_tape.py)
gives every point the replay's answer to the byte: each phase's peak, what was live at it by kind and tag
and where, and every byte count of the step; the whole training estimate (the JSON the regression oracle
compares) is the same with the tapes on and off. The tape's phase peaks follow the tracker's own rules
(tape_phases.py) on random programs, and its sizes (sym.py) divide as the replay's integers do."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumem_gui.core import load_model
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay import step_tape
from gpumem_gui.core.replay.autograd import Sim
from gpumem_gui.core.replay.sym import Sym, TapeUnsupported
from gpumem_gui.core.replay.tape import TapeSim, record
from gpumem_gui.core.training import estimate_training, make_training_run, rank
from gpumem_gui.core.training.rank import simulate, simulate_rank
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "reference" / "extra" / "configs"


def _tiny(name: str):  # type: ignore[no-untyped-def]
    return spec_from_config(json.loads((CONFIGS / f"{name}.json").read_text()), name=name)


@pytest.fixture(autouse=True)
def _fresh_tapes(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """No tape and no memoised step from another test; every point comes off a tape (the first one records
    it) unless a test says otherwise."""
    monkeypatch.setattr(step_tape, "REPLAYED_FIRST", 0)
    step_tape.clear()
    step_tape.STATS.clear()
    rank._simulate_cached.cache_clear()
    yield
    step_tape.clear()
    rank._simulate_cached.cache_clear()


# ---- the tape's phase peaks follow the tracker's rules -----------------------------------------------------

_TAGS = ("a", "b", "c")
_KINDS = ("act", "temp", "grad")
_op = st.one_of(
    st.tuples(st.just("alloc"), st.integers(0, 3), st.integers(0, 40), st.sampled_from(_TAGS)),
    st.tuples(st.just("free"), st.integers(0, 50)),
    st.tuples(st.just("grow"), st.integers(0, 50), st.integers(-5, 9)),
    st.tuples(st.just("retag"), st.integers(0, 50), st.sampled_from(_TAGS)),
    st.tuples(st.just("phase"), st.sampled_from(("forward", "backward", "optimizer"))),
    st.tuples(st.just("empty"), st.sampled_from(("d", "e"))),
)


def _program(sim: Sim, ops: list, b: object, q: object) -> dict:  # type: ignore[type-arg]
    """Allocations of ``a*b*q + c`` bytes, frees, growths, retags, empty storages and phase changes."""
    live: list = []
    for op in ops:
        if op[0] == "alloc":
            live.append(sim.storage(op[1] * b * q + op[2], op[3], _KINDS[op[2] % 3]))  # type: ignore[operator]
        elif op[0] == "free" and live:
            live.pop(op[1] % len(live))
        elif op[0] == "grow" and live:
            live[op[1] % len(live)].grow(op[2])
        elif op[0] == "retag" and live:
            sim.tr.retag(live[op[1] % len(live)], "grad", op[2])
        elif op[0] == "phase":
            sim.tr.start_phase(op[1])
        elif op[0] == "empty":
            live.append(sim.storage(0, op[1], "act"))
    return {"cur": sim.tr.cur}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_op, max_size=40), st.integers(1, 5), st.integers(1, 9), st.integers(1, 5), st.integers(1, 9))
def test_phase_peaks_follow_the_tracker(ops: list, b0: int, q0: int, b1: int, q1: int) -> None:  # type: ignore[type-arg]
    """Each phase's peak (first of the highest levels at allocations, growths and phase entries, a phase met
    again keeping the higher), what was live by kind and tag (every tag seen so far, empty ones too) and
    where: the tape recorded at one point, evaluated at another, equals the tracker at that other point."""
    tape = record(lambda sim, b, q, p: _program(sim, ops, b, q), (b0, q0, 0), phases=True)
    sim = Sim()
    _program(sim, ops, b1, q1)
    m = tape.monomials((b1, q1, 0))
    phases = ("setup", "forward", "backward", "optimizer")
    got = {k: (v.total, v.by_kind, v.by_tag, v.where) for k, v in tape.phase_peaks(m, phases).items()}
    assert got == sim.tr.peaks
    assert list(got) == list(sim.tr.peaks)


# ---- sizes divide as the replay's integers -----------------------------------------------------------------


def test_an_inexact_division_is_pinned_by_its_remainder() -> None:
    """``(b*q*1024) // 2048`` is ``b*q/2`` where ``b*q`` is even (a congruence guard: the tape serves the
    points that leave the remainder the recording left), ``x % 8`` a constant under the same kind of guard,
    ``rows // b`` a polynomial division by one term."""

    def run(sim: TapeSim, b: Sym, q: Sym, p: Sym) -> dict:  # type: ignore[type-arg]
        return {"half": (b * q * 1024) // 2048, "rest": (b * q - b) % 8, "per_seq": (b * q * 3) // b}

    tape = record(run, (2, 5, 0), phases=True)
    # (1, 3): b*q odd; (2, 6): b*q - b = 10 leaves 2, not the recorded 0
    for point, admitted in (
        ((2, 5, 0), True),
        ((4, 3, 0), True),
        ((2, 9, 0), True),
        ((1, 3, 0), False),
        ((2, 6, 0), False),
    ):
        m = tape.monomials(point)
        assert tape.admits(m, point) is admitted, point
        if admitted:
            b, q, _ = point
            assert tape.exact_values(m) == {"half": b * q // 2, "rest": (b * q - b) % 8, "per_seq": 3 * q}


def test_threads_record_their_own_guards() -> None:
    """The window estimates on its thread while a worker fits and sweeps: a tape recorded in one thread gets
    none of the other's comparisons (the recording state is per thread)."""
    inner: list = []

    def compare(b: Sym, q: Sym, limit: int) -> dict:  # type: ignore[type-arg]
        assert (b if limit == 3 else q) > limit
        return {}

    def run(sim: TapeSim, b: Sym, q: Sym, p: Sym) -> dict:  # type: ignore[type-arg]
        t = threading.Thread(
            target=lambda: inner.append(record(lambda s, b2, q2, _: compare(b2, q2, 3), (5, 1, 0)))
        )
        t.start()
        t.join()
        return compare(b, q, 7)

    outer = record(run, (1, 9, 0))
    assert outer.guard_rows is not None and inner[0].guard_rows is not None
    assert len(outer.guard_rows) == len(inner[0].guard_rows) == 1
    assert not outer.admits(outer.monomials((1, 5, 0)), (1, 5, 0))
    assert not inner[0].admits(inner[0].monomials((2, 1, 0)), (2, 1, 0))


def test_a_size_used_as_a_plain_number_is_unsupported() -> None:
    with pytest.raises(TapeUnsupported):
        record(lambda sim, b, q, p: {"n": int(b)}, (1, 1, 0), phases=True)
    with pytest.raises(TapeUnsupported):
        record(lambda sim, b, q, p: {"n": (b * q) // (b + q)}, (1, 1, 0), phases=True)


# ---- the step from its tape is the replay, to the byte -----------------------------------------------------

# (model, run fields, points (batch, seq)): dense, MoE, MLA, sliding windows, linear attention, Mamba, an
# encoder, an encoder-decoder, a VLM's text stack; LoRA / QLoRA, checkpointing, ZeRO / FSDP, TP + SP, PP,
# offload, framework tricks (torchtune's and Axolotl's chunked losses, Liger's fused loss, float8, compile)
LLAMA = "synthetic__smollm3-tiny"
POINTS = ((1, 96), (2, 64), (3, 40), (1, 200), (2, 130))
CASES = {
    "llama-full": (LLAMA, {}),
    "llama-lora-ckpt": (LLAMA, {"method": "lora", "grad_ckpt": True}),
    "llama-qlora": (LLAMA, {"method": "qlora", "grad_ckpt": True}),
    "llama-zero3-dp8": (LLAMA, {"zero": 3, "dp": 8}),
    "llama-zero2-offload": (LLAMA, {"zero": 2, "dp": 4, "offload": "optimizer"}),
    # DeepSpeed's flat partitions: the for-loop step over one partition (stage 2) or sub-group (stage 3)
    "llama-zero2-for-loop": (LLAMA, {"zero": 2, "dp": 4, "optimizer": "adamw-for-loop"}),
    "llama-zero3-lion": (LLAMA, {"zero": 3, "dp": 4, "optimizer": "lion"}),
    "llama-fsdp1": (LLAMA, {"fsdp": "full_shard", "dp": 4, "fsdp_version": 1}),
    # gradient accumulation without sync (FSDP1 no_sync as the HF Trainer runs it; FSDP2 with an upcast)
    "llama-fsdp1-no-sync": (
        LLAMA,
        {"framework": "hf-trainer", "fsdp": "full_shard", "dp": 4, "fsdp_version": 1, "grad_accum": 4},
    ),
    "llama-fsdp2-no-sync-mp": (
        LLAMA,
        {"fsdp": "full_shard", "dp": 4, "precision": "mp-bf16", "grad_accum": 2, "grad_sync": "last"},
    ),
    "llama-ddp-bucket-view-no-sync": (
        LLAMA,
        {"dp": 2, "bucket_view": True, "grad_accum": 2, "grad_sync": "last"},
    ),
    "llama-torchtitan-3d": (
        "synthetic__smollm3-tiny",
        {
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
    ),
    "llama-megatron": (
        "synthetic__smollm3-tiny",
        {"framework": "megatron", "precision": "megatron-bf16", "tp": 2},
    ),
    "llama-torchtune": (
        "synthetic__smollm3-tiny",
        {"framework": "torchtune", "method": "lora", "grad_ckpt": True},
    ),
    "llama-unsloth": (
        "synthetic__smollm3-tiny",
        {"framework": "unsloth", "method": "lora", "grad_ckpt": True},
    ),
    "llama-eager-dropout": (LLAMA, {"attn": "eager", "dropout": 0.1, "first_step": True}),
    "llama-axolotl-chunked": (LLAMA, {"framework": "axolotl", "loss": "chunked", "method": "lora"}),
    "llama-deepspeed-offload": (
        LLAMA,
        {"framework": "deepspeed", "zero": 3, "dp": 4, "offload": "optimizer+params"},
    ),
    "llama-float8-compile": (
        LLAMA,
        {"framework": "torchtitan", "tp": 2, "fsdp": "full_shard", "dp": 2, "float8": True, "compile": True},
    ),
    "llama-ckpt-every-2-frozen": (LLAMA, {"grad_ckpt": True, "ckpt_every": 2, "frozen_layers": 1}),
    "moe-ep": ("synthetic__qwen3_moe-sparse-step2", {"ep": 2, "dp": 2, "optimizer": "adamw-8bit"}),
    "mla": ("synthetic__deepseek_v3-small", {"method": "lora"}),
    "sliding": ("synthetic__cohere2-tiny", {"grad_ckpt": True}),
    "linear-attention": ("synthetic__qwen3_next-tiny", {}),
    "mamba-hybrid": ("synthetic__nemotron_h-tiny", {"grad_ckpt": True}),
    "vlm-text": ("synthetic__qwen2_5_vl-tiny", {"method": "lora"}),
    "gpt-oss": ("synthetic__gpt_oss-tiny", {"zero": 1, "dp": 4, "zero_impl": "torch"}),
}


def _check_case(spec, fields: dict, points: tuple) -> None:  # type: ignore[no-untyped-def,type-arg]
    for batch, seq in points:
        run = make_training_run(batch=batch, seq=seq, **fields)
        for stage in range(run.pp):
            assert simulate(spec, run, stage)[0] == simulate_rank(spec, run, stage)[0], (batch, seq, stage)


@pytest.mark.parametrize("case", sorted(CASES))
def test_step_tape_equals_the_replay(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every point comes off a tape (a new one where a guard says the structure changed: one token or
    several sequences, a sliding window reached, another chunk count or remainder), equal to the replay."""
    monkeypatch.setattr(step_tape, "_worth_recording", lambda key: True)
    name, fields = CASES[case]
    _check_case(_tiny(name), fields, POINTS)
    assert step_tape.STATS["evaluated"] >= len(POINTS), dict(step_tape.STATS)
    assert not step_tape.unsupported()


def test_more_micro_batches_share_the_tape_of_two() -> None:
    """The step replays two micro-batches at most (the second with every ``.grad`` live): grad_accum 2, 4
    and 8 are one shape, read off one tape, each equal to its replay (PP with FSDP2's pipelined units)."""
    spec = _tiny(LLAMA)
    fields = {"pp": 2, "fsdp": "full_shard", "dp": 2}
    for ga, seq in ((2, 96), (4, 64), (8, 40), (8, 200)):
        _check_case(spec, {**fields, "grad_accum": ga}, ((2, seq),))
    assert step_tape.STATS["evaluated"] == 8 and step_tape.STATS["recorded"] == 2  # one tape per stage


def test_a_shape_whose_guards_move_with_every_point_stops_recording() -> None:
    """A linear-attention model's chunk loop runs once per 64 tokens: a coarse sweep meets a new chunk count
    at every point. After two tapes that served one point each, the shape's points are replayed (recording
    each would cost more than replaying it), equal all the same."""
    _check_case(_tiny("synthetic__qwen3_next-tiny"), {}, ((2, 64), (2, 130), (2, 200), (2, 300), (2, 400)))
    assert dict(step_tape.STATS) == {"recorded": 2, "evaluated": 2, "replayed": 3}


def test_encoders_and_encoder_decoders_from_their_tapes() -> None:
    for model in ("google-bert/bert-base-uncased", "facebook/bart-base"):
        spec = load_model(model).spec
        _check_case(spec, {"grad_ckpt": True}, ((1, 64), (2, 128), (3, 33)))
    assert step_tape.STATS["evaluated"] >= 4 and not step_tape.unsupported()


def test_a_point_past_float64s_exact_range_is_replayed() -> None:
    """Sums of more than 2**53 bytes are not exact in float64: such a point is replayed (counted)."""
    spec = _tiny(LLAMA)
    _check_case(spec, {}, ((1, 64), (2, 64), (1 << 20, 1 << 20)))
    assert step_tape.STATS["inexact"] == 1


def test_what_the_tape_cannot_express_is_replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    def unsupported(*_: object) -> None:
        raise TapeUnsupported("for the test")

    monkeypatch.setattr(step_tape, "record_step", unsupported)
    _check_case(_tiny(LLAMA), {}, POINTS[:3])
    assert list(step_tape.unsupported().values()) == ["for the test"]
    assert step_tape.STATS["unsupported"] == 3 and not step_tape.STATS["evaluated"]


def test_a_shape_records_its_tape_on_its_third_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tape costs a few replays to record: a shape asked once or twice is replayed, the third point
    records, the next ones come off it; a point no tape of a known shape admits records at once."""
    monkeypatch.setattr(step_tape, "REPLAYED_FIRST", 2)
    spec = _tiny(LLAMA)
    _check_case(spec, {}, ((2, 96), (2, 64)))
    assert dict(step_tape.STATS) == {"replayed": 2}
    _check_case(spec, {}, ((2, 40), (3, 200)))
    assert dict(step_tape.STATS) == {"replayed": 2, "recorded": 1, "evaluated": 2}
    _check_case(spec, {}, ((1, 40),))  # one sequence: another structure (a guard)
    assert dict(step_tape.STATS) == {"replayed": 2, "recorded": 2, "evaluated": 3}


# ---- the whole estimate: the examples, tapes on and off --------------------------------------------

EXAMPLES = {
    "one GPU full": {},
    "LoRA + checkpointing": {"method": "lora", "grad_ckpt": True},
    "ZeRO-3 dp 8": {"zero": 3, "dp": 8},
    "torchtitan FSDP2 x TP 2 + SP x PP 2": CASES["llama-torchtitan-3d"][1],
}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_training_estimate_is_the_same_with_tapes(example: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_model("meta-llama/Llama-3.2-1B").spec
    points = ((1, 512), (2, 256), (1, 1030), (4, 66))
    runs = [make_training_run(batch=b, seq=s, **EXAMPLES[example]) for b, s in points]
    taped = [estimate_training(spec, r).model_dump_json() for r in runs]
    monkeypatch.setattr(step_tape, "TAPES_ON", False)
    rank._simulate_cached.cache_clear()
    assert [estimate_training(spec, r).model_dump_json() for r in runs] == taped
    assert step_tape.STATS["evaluated"] >= len(points) - 1


def test_one_polynomial_compared_with_itself_keeps_no_guard() -> None:
    """Two sizes with the same polynomial (a gradient's bytes against its input's, the backward engine's
    validate_outputs) compare the same way at every point: no guard, the other comparisons kept."""

    def run(sim: TapeSim, b: Sym, q: Sym, p: Sym) -> dict:  # type: ignore[type-arg]
        x, y = b * q * 4, q * b * 4  # one polynomial, two objects
        assert x == y and (x != y) is False and x >= y
        assert x > q * 3
        return {}

    tape = record(run, (2, 8, 0))
    assert tape.guard_rows is not None and len(tape.guard_rows) == 1
    assert tape.admits(tape.monomials((1, 1, 0)), (1, 1, 0))
    assert not tape.admits(tape.monomials((0, 5, 0)), (0, 5, 0))


def test_the_log_is_freed_once_the_tape_is_built() -> None:
    """The run's parameters and their AccumulateGrad nodes point at each other, so the tracker they reach
    stays until the cyclic garbage collector runs: its log (every event and size) is dropped when the tape
    is built, not walked by that collector; the tape reads the same."""
    trackers = []

    def run(sim: TapeSim, b: Sym, q: Sym, p: Sym) -> dict:  # type: ignore[type-arg]
        trackers.append(sim.tr)
        x = sim.storage(b * q * 4, "x")
        sim.storage(q * 8, "y")  # freed at once
        del x
        return {}

    tape = record(run, (2, 8, 0), phases=True)
    assert trackers[0].events == []
    assert tape.phase_peaks(tape.monomials((3, 5, 0)), ("setup",))["setup"].total == 3 * 5 * 4 + 5 * 8


def test_a_size_times_a_whole_number_is_made_once() -> None:
    """A tensor's elements times its dtype's width, asked again (each gradient the backward engine checks
    against it), is the same size object: one row of the tape, never a stale one."""
    n = Sym.var(0, 3) * Sym.var(1, 5)
    twice = n * 2
    assert n * 2 is twice and 2 * n is twice and (twice.c, twice.v) == ({(1, 1, 0): 2}, 30)
    four = n * 4
    assert (four.c, four.v) == ({(1, 1, 0): 4}, 60) and n * 4 is four
    assert (n * 2) is not twice and (n * 2).c == twice.c  # the last factor only is kept
    half = n * 0.5  # a float factor: a new size each time
    assert half.v == 7.5 and n * 0.5 is not half
