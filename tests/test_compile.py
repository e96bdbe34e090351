"""torch.compile as the frameworks use it (issue 31 item 3): the replay's compiled pieces against what
Inductor's partitioner really saves (tests/reference/distributed/compile.json, recorded on the CPU by
validation/truth_compile.py), which framework compiles which loss, and a published compile on / off pair."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import pytest

from gpumem_gui.core import load_model, make_training_run
from gpumem_gui.core.replay import attention_kernels, ffn, logits, tricks
from gpumem_gui.core.replay.autograd import Node, Sim
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.ops import Ops
from gpumem_gui.core.training import profile_table
from gpumem_gui.core.training.profiles import resolve, trick_sources
from gpumem_gui.core.training.rank import simulate_rank
from tests.conftest import REPO, reference_dir

DOC = json.loads((REPO / "tests" / "reference" / "distributed" / "compile.json").read_text())
SHAPE = DOC["shapes"]
TOK, D, FF, V = SHAPE["tokens"], SHAPE["hidden"], SHAPE["intermediate"], SHAPE["vocab"]


class _Piece:
    """Just enough of a CausalLM for one piece of a layer: a Sim, its ops, a config and a spec."""

    def __init__(self, compiled: bool, frozen: bool = False) -> None:
        self.s = Sim()
        self.o = Ops(self.s)
        self.cfg = ReplayConfig(batch=1, q=TOK, param_dt="bf16", compile=compiled, compile_loss=compiled)
        traits = SimpleNamespace(
            fused_gate_up=False, residual_dropout=False, rotary_half_tables=False, rope_tables_fp32=False
        )
        self.spec = SimpleNamespace(activation="silu", mlp_gated=True, traits=traits, vocab_size=V)
        self.shapes = {"mlp.gate_proj": (FF, D), "mlp.up_proj": (FF, D), "mlp.down_proj": (D, FF)}
        self.w = {k: self.param(k, n * m, trains=not frozen) for k, (n, m) in self.shapes.items()}

    def param(self, name: str, n: int, trains: bool = True) -> T:
        return self.s.param(name, n, "bf16", trains, n * 2, 0).tensor

    def act(self, n: int, dt: str = "bf16") -> T:
        """An activation that needs a gradient (the output of an earlier op)."""
        x = self.s.new(n, dt)
        self.s.node("pass", (self.param(f"src{n}", 1),), (x,))
        return x

    def has(self, name: str) -> bool:
        return False

    def linear(self, x: T, name: str) -> T:
        n_out, n_in = self.shapes[name]
        return self.o.linear(x, self.w[name], None, n_out, n_in)


def _saved(out: T) -> list[int]:
    """Bytes of every distinct non-parameter storage the graph behind ``out`` keeps for backward."""
    seen: dict[int, int] = {}
    todo, done = [out.fn], set()
    while todo:
        nd = todo.pop()
        if nd is None or id(nd) in done:
            continue
        done.add(id(nd))
        assert isinstance(nd, Node)
        for st in nd.saved or ():
            if st.kind != "param":
                seen[id(st)] = st.nbytes
        todo.extend(e[0] for e in nd.edges if e is not None)
    return sorted(seen.values(), reverse=True)


def _piece(name: str, compiled: bool) -> T:
    """The replay's code for the piece ``name`` of compile.json."""
    frozen = name == "swiglu-frozen"
    m: Any = _Piece(compiled, frozen)
    if name.startswith("swiglu"):
        return ffn.dense(m, "mlp", m.act(TOK * D))
    if name == "rms-norm":
        return tricks.compiled_rms_norm(m, m.act(TOK * D), m.param("norm", D))
    labels = m.s.new(TOK, "i64")
    if name == "hf-loss":
        return logits.causal_lm_loss(m, m.act(TOK * V))
    if name == "chunk-ce":
        return logits.cross_entropy_sum(m.s, m.act(TOK * V), labels, TOK if compiled else 0)
    assert name == "linear-ce"
    lg = m.o.linear(m.act(TOK * D), m.param("head", V * D), None, V, D)
    return logits.cross_entropy_sum(m.s, lg, labels, TOK if compiled else 0)


_PIECES = ("swiglu-full", "swiglu-frozen", "hf-loss", "chunk-ce", "linear-ce")


@pytest.mark.parametrize("name", (*_PIECES, "rms-norm"))
def test_compiled_piece_saves_what_inductor_saves(name: str) -> None:
    """Byte for byte the storages Inductor's min-cut partition kept (``grad_fn.saved_tensors`` of the
    compiled graph, parameters left out): the SwiGLU product's activation is recomputed, the cross-entropy
    keeps the 16-bit logits and two fp32 values per row instead of the fp32 log-probabilities."""
    traced = sorted((b for b, _ in DOC["cases"][name]["compiled"]["saved"]), reverse=True)
    assert _saved(_piece(name, compiled=True)) == traced


@pytest.mark.parametrize("name", _PIECES)
def test_the_same_pieces_eager_save_what_autograd_saves(name: str) -> None:
    """The eager replay of the same pieces against ``saved_tensors_hooks`` of the same code: the difference
    between the two tests is exactly what compiling changes."""
    traced = sorted((b for b, _ in DOC["cases"][name]["eager"]), reverse=True)
    assert _saved(_piece(name, compiled=False)) == traced


def test_the_compiled_losses_save_half_of_the_eager_ones() -> None:
    """A check on the recorded trace itself: fp32 log-probabilities (4 bytes per logit) eager, the 16-bit
    logits (2 bytes) compiled."""
    for name in ("hf-loss", "chunk-ce", "linear-ce"):
        case = DOC["cases"][name]
        assert max(case["eager"])[0] == TOK * V * 4 == 2 * max(case["compiled"]["saved"])[0]
        assert case["compiled"]["grad_dtypes"]["0"] == "bf16"  # the logits' gradient in their dtype


@pytest.mark.parametrize("compiled", [False, True])
def test_compiled_rotary_makes_only_its_outputs(compiled: bool) -> None:
    """Eager ``apply_rotary_pos_emb`` makes q * cos, -x2, the cat and the product with sin before the sum;
    compiled it is one kernel per output (nothing saved but the cos / sin tables, compile.json 'rope')."""
    m: Any = _Piece(compiled)
    heads, hd = SHAPE["heads"], SHAPE["head_dim"]
    q, k = m.act(heads * TOK * hd), m.act(2 * TOK * hd)
    cos, sin = m.s.new(TOK * hd, "bf16"), m.s.new(TOK * hd, "bf16")
    before = m.s.tr.cur
    m.s.tr.start_phase("rope")
    qe, ke = attention_kernels.rope(m, q, k, cos, sin)
    extra = m.s.tr.peaks["rope"][0] - before
    outputs = (qe.n + ke.n) * 2
    assert (extra == outputs) is compiled and extra >= outputs
    assert DOC["cases"]["rope"]["compiled"]["saved"] == []


def _fw_loss(framework: str, **fields: Any) -> tuple[bool, str]:
    r = resolve(make_training_run(framework=framework, compile=True, **fields))
    return r.compile_loss, r.loss


@pytest.mark.parametrize(
    ("framework", "fields", "compiled"),
    [
        ("pytorch", {}, True),  # torch.compile(model): ForCausalLMLoss is in the forward
        ("hf-trainer", {}, True),
        ("axolotl", {}, True),
        ("torchtitan", {"precision": "amp-bf16"}, True),  # build_cross_entropy_loss: torch.compile(loss_fn)
        ("torchtitan", {"precision": "amp-bf16", "tp": 2}, False),  # loss_parallel(): left eager
        ("torchtune", {}, True),  # LinearCrossEntropyLoss.apply_compile_strategy
        ("torchtune", {"loss": "chunked-output"}, True),  # CEWithChunkedOutputLoss.apply_compile_strategy
        ("torchtune", {"tp": 2}, False),  # LinearCrossEntropyLoss skips compile with TP and masking
        ("torchtune", {"loss": "standard"}, False),  # torch.compile(loss) returned and discarded
        ("unsloth", {}, False),  # its own fused cross-entropy
    ],
)
def test_each_framework_compiles_the_loss_it_compiles(framework: str, fields: dict, compiled: bool) -> None:
    assert _fw_loss(framework, **fields)[0] is compiled
    assert not resolve(make_training_run(framework=framework, **fields)).compile_loss
    run = make_training_run(framework=framework, compile=True, **fields)
    assert ("compiled loss (" in trick_sources(run)) is compiled


@pytest.fixture(scope="module")
def qwen():
    return load_model(str(reference_dir() / "configs" / "Qwen__Qwen2.5-0.5B.json")).spec


def test_a_compiled_standard_loss_drops_the_fp32_logits(qwen, monkeypatch) -> None:
    """The same compiled layers with and without the compiled loss (the plain-PyTorch profile with its
    compiled losses taken away): the forward's peak at the loss loses the fp32 upcast and the fp32
    log-probabilities, two fp32 logits-sized tensors, less what the compiled loss makes by then: 8 bytes per
    row (row max, log-sum-exp), the mean's count and the loss (4 bytes each)."""
    run = make_training_run(method="lora", batch=2, seq=512, compile=True)
    on, _, _ = simulate_rank(qwen, run)
    eager_loss = dataclasses.replace(profile_table.PROFILES["pytorch"], compiled_losses=())
    monkeypatch.setitem(profile_table.PROFILES, "pytorch", eager_loss)
    off, _, _ = simulate_rank(qwen, run)
    t = 2 * 512
    fp32_logits = t * qwen.vocab_size * 4
    drop = off.phases["forward"].total - on.phases["forward"].total
    assert drop == 2 * fp32_logits - 8 * t - 8


# https://github.com/pytorch/torchtune README.md "Optimization flags" (added 2024-11-18, #2003, commit
# 1814feb17): "Baseline uses Recipe=full_finetune_single_device, Model=Llama 3.2 3B, Batch size=2, Max
# sequence length=4096, Precision=bf16, Hardware=A100"; measured: Peak Memory Active (GiB), each row adding
# one technique: "| + Packed Dataset | 60.0 | +135.16% |" then "| + Compile | 51.0 | -14.93% |". Compile
# there is compile_model's per-layer compile; the loss (torch.nn.CrossEntropyLoss before the "+ Chunked Cross
# Entropy" row) stays eager: full_finetune_single_device discards compile_loss's return (recipe line 292).
# Packed to 4096 tokens per row, no checkpointing, no optimizer in backward (rows added later).
PUBLISHED_PACKED, PUBLISHED_COMPILED = 60.0, 51.0


def test_compiled_layers_save_what_torchtunes_published_table_says() -> None:
    """The published drop from compiling (9.0 GiB) within 5 %: the RMSNorms keep their 16-bit input instead
    of an fp32 copy and the normalised output, the SwiGLU activation is recomputed."""
    spec = load_model(str(reference_dir() / "configs" / "meta-llama__Llama-3.2-3B.json")).spec
    peak = {}
    for compiled in (False, True):
        run = make_training_run(
            framework="torchtune", method="full", precision="bf16", loss="standard", batch=2, seq=4096,
            compile=compiled,
        )  # fmt: skip
        res, _, _ = simulate_rank(spec, run)
        peak[compiled] = max(p.total for p in res.phases.values()) / 2**30
    published = PUBLISHED_PACKED - PUBLISHED_COMPILED
    assert abs((peak[False] - peak[True]) - published) <= 0.05 * published, peak
    for compiled, value in ((False, PUBLISHED_PACKED), (True, PUBLISHED_COMPILED)):
        assert abs(peak[compiled] - value) <= 0.05 * value, (compiled, peak)


def test_the_run_can_say_how_its_framework_version_ran_the_loss() -> None:
    """compile_loss: off for torchtitan as it ran in 2024 (train.py: '# TODO: compiling loss function causes
    CUDA errors, turning off for now'), on for a torchtune recipe that keeps compile_loss's result
    (lora_finetune_single_device); only losses with a compiled form can be compiled; without compile the
    field is named as ignored."""
    titan = {"framework": "torchtitan", "precision": "amp-bf16", "compile": True}
    assert resolve(make_training_run(**titan)).compile_loss
    assert not resolve(make_training_run(**titan, compile_loss="off")).compile_loss
    tune = {"framework": "torchtune", "loss": "standard", "compile": True}
    on = resolve(make_training_run(**tune, compile_loss="on"))
    assert on.compile_loss and not any("loss compiled" in line for line in on.applied)
    assert "compiled loss (compile_loss on)" in trick_sources(make_training_run(**tune, compile_loss="on"))
    from gpumem_gui.core import GpumemInputError, estimate_training

    spec = load_model(str(reference_dir() / "configs" / "Qwen__Qwen2.5-0.5B.json")).spec
    with pytest.raises(GpumemInputError) as e:
        estimate_training(spec, make_training_run(loss="fused-linear", compile=True, compile_loss="on"))
    assert e.value.field == "compile_loss" and "\n" not in str(e.value)
    est = estimate_training(spec, make_training_run(batch=1, seq=128, compile_loss="off"))
    assert any("compile_loss" in w and "ignored" in w for w in est.warnings)


def test_a_torchtitan_config_without_the_loss_component_leaves_the_loss_eager(tmp_path) -> None:
    from gpumem_gui.core import import_file

    src = REPO / "tests" / "data" / "imports" / "torchtitan_llama3_8b.toml"
    text = src.read_text()
    assert 'components = ["model", "loss"]' in text
    assert import_file(str(src)).run.compile_loss == "auto"  # the default: model and loss compiled
    model_only = tmp_path / "torchtitan.toml"
    model_only.write_text(text.replace('components = ["model", "loss"]', 'components = ["model"]'))
    assert import_file(str(model_only)).run.compile_loss == "off"


def test_a_whole_compiled_model_keeps_what_the_replay_says(tmp_path) -> None:
    """transformers' LlamaForCausalLM (a tiny config, bf16) with its loss, eager and under
    ``torch.compile(model)`` on the CPU (compile.json 'model': the bytes every node of the autograd graph
    saved, parameters left out) against the replay's activations after the forward. Eager within 0.1 %;
    compiled within 1 %: the whole-model graph also recomputes the rotary cos / sin from the positions,
    which the replay keeps (2 x 2 KiB here; a per-layer compile, torchtune's, saves them as inputs)."""
    rec = DOC["model"]
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(rec["config"]))
    spec = load_model(str(cfg)).spec
    ours = {}
    for compiled in (False, True):
        run = make_training_run(
            method="full", precision="bf16", batch=rec["batch"], seq=rec["seq"], compile=compiled
        )
        ours[compiled] = simulate_rank(spec, run, 0, cpu_dropout=True)[0].microbatch_activations
    assert abs(ours[False] - rec["eager"]) <= 0.001 * rec["eager"]
    assert abs(ours[True] - rec["compiled"]) <= 0.01 * rec["compiled"]
    traced_drop, our_drop = rec["eager"] - rec["compiled"], ours[False] - ours[True]
    assert abs(our_drop - traced_drop) <= 0.02 * traced_drop
