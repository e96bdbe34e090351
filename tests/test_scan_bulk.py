"""Issue 33 item 10 (runaway work): a training replay of a linear-attention model does the chunk loop in a
number of steps that does not grow with the sequence (core/replay/scan.py), with the same results to the
byte as replaying every chunk: the gated delta rule (Qwen3-Next, Qwen3.5), Kimi Delta Attention (Kimi
Linear) and MiniMax's lightning blocks, on many points, including ones whose peak lies inside the loop."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay import scan
from gpumem_gui.core.training import make_training_run
from gpumem_gui.core.training.rank import simulate_rank
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "reference" / "extra" / "configs"


def _cfg(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


# variants whose linear-attention layers dominate (a small vocabulary and MLP, many wide heads): their
# peaks fall inside the chunk loop or its backward, where a wrong stand-in would show
SMALL = {"vocab_size": 128, "hidden_size": 128, "intermediate_size": 32}
MODELS = {
    "qwen3_next": _cfg("synthetic__qwen3_next-tiny"),
    "qwen3_next-heavy": {
        **_cfg("synthetic__qwen3_next-tiny"),
        **SMALL,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    },
    "qwen3_5": _cfg("synthetic__qwen3_5-tiny"),
    "kimi_linear": _cfg("synthetic__kimi_linear-tiny"),
    "kimi_linear-heavy": {
        **_cfg("synthetic__kimi_linear-tiny"),
        **SMALL,
        "moe_intermediate_size": 16,
        "linear_attn_config": {
            **_cfg("synthetic__kimi_linear-tiny")["linear_attn_config"],
            "num_heads": 16,
            "head_dim": 64,
        },
    },
    "minimax": _cfg("synthetic__minimax-tiny"),
    "minimax-heavy": {**_cfg("synthetic__minimax-tiny"), **SMALL, "num_local_experts": 2, "block_size": 64},
}


def _points(chunk: int) -> list[dict]:
    seqs = (1, chunk - 1, chunk * 6 + 1, chunk * 8, chunk * 9 - 3, chunk * 13 + 7, chunk * 21)
    out: list[dict] = [{"seq": s, "batch": b} for s in seqs for b in (1, 2)]
    mid = chunk * 11 + 5
    out += [
        {"seq": mid, "batch": 3, "precision": "bf16"},
        {"seq": mid, "grad_accum": 2},
        {"seq": mid, "method": "lora", "lora_rank": 4},
        {"seq": mid, "grad_ckpt": True},
        {"seq": chunk * 9 - 3, "batch": 2, "grad_ckpt": True},
        {"seq": chunk * 21, "grad_ckpt": True, "method": "lora", "lora_rank": 4},
        {"seq": mid, "grad_ckpt": True, "ckpt_every": 2, "framework": "torchtitan"},
        {"seq": mid, "grad_ckpt": True, "ckpt_policy": "selective-op", "framework": "torchtitan"},
        {"seq": mid, "grad_ckpt": True, "zero": 3, "dp": 2},
        {"seq": mid, "zero": 3, "dp": 2},
        {"seq": mid, "fsdp": "full_shard", "dp": 2, "precision": "mp-bf16"},
        {"seq": mid, "framework": "torchtune", "activation_offload": True, "grad_ckpt": True},
        {"seq": mid, "first_step": True, "optimizer": "adamw-8bit"},
    ]
    return out


def _both(spec, kw: dict, monkeypatch: pytest.MonkeyPatch):
    run = make_training_run(**kw)
    monkeypatch.setattr(scan, "ENABLED", False)
    every = simulate_rank(spec, run)[0]
    monkeypatch.setattr(scan, "ENABLED", True)
    return every, simulate_rank(spec, run)[0]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_stand_in_gives_every_chunk_s_results_to_the_byte(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = spec_from_config(MODELS[name], name=name)
    la = spec.linear_attention
    assert la is not None
    inside = 0
    for kw in _points(la.chunk_size):
        every, stand_in = _both(spec, kw, monkeypatch)
        assert stand_in == every, (name, kw)  # totals, bytes by kind and tag, where, every figure
        inside += any("attention" in p.where for p in every.phases.values())
    if name.endswith("-heavy"):
        assert inside, "no point peaks in the attention layers: the comparison would not test the stand-in"


def test_replayed_chunks_do_not_grow_with_the_sequence(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = spec_from_config(MODELS["qwen3_next"], name="q")
    steps: list[int] = []
    orig = scan.run_scan

    def counted(s, n, step, carry, state, collected=None):  # type: ignore[no-untyped-def]
        count = [0]

        def each(it, c):  # type: ignore[no-untyped-def]
            count[0] += 1
            return step(it, c)

        out = orig(s, n, each, carry, state, collected)
        steps.append(count[0])
        return out

    monkeypatch.setattr("gpumem_gui.core.replay.delta_rule.run_scan", counted)
    for seq in (64 * 40, 64 * 4000):
        for ckpt in (False, True):  # checkpointed: the first forward and the recomputation
            steps.clear()
            simulate_rank(spec, make_training_run(seq=seq, grad_ckpt=ckpt))
            assert steps and max(steps) <= scan.MAX_HEAD + 1 + scan.TAIL, (seq, ckpt, steps)


def test_a_wrong_stand_in_would_be_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison is sharp: a ballast one chunk short moves the peaks."""
    spec = spec_from_config(MODELS["qwen3_next-heavy"], name="h")
    run = make_training_run(seq=64 * 12)
    monkeypatch.setattr(scan, "ENABLED", False)
    every = simulate_rank(spec, run)[0]
    monkeypatch.setattr(scan, "ENABLED", True)
    monkeypatch.setattr(scan, "TAIL", scan.TAIL + 1)  # the ballast stands for one chunk fewer ...
    real = scan.run_scan

    def short(s, n, step, carry, state, collected=None):  # type: ignore[no-untyped-def]
        return real(s, n - 1, step, carry, state, collected)  # ... and one chunk is never replayed

    monkeypatch.setattr("gpumem_gui.core.replay.delta_rule.run_scan", short)
    assert simulate_rank(spec, run)[0] != every


@pytest.mark.parametrize(
    "config",
    [
        "Qwen__Qwen3-Next-80B-A3B-Instruct",
        "MiniMaxAI__MiniMax-Text-01-hf",
        "moonshotai__Kimi-Linear-48B-A3B-Instruct",
    ],
)
def test_the_published_models_give_the_same_results(config: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = spec_from_config(_cfg(config), name=config)
    for kw in ({"seq": 4096}, {"seq": 3000, "batch": 2, "zero": 3, "dp": 8, "grad_ckpt": True}):
        every, stand_in = _both(spec, kw, monkeypatch)
        assert stand_in == every, (config, kw)
