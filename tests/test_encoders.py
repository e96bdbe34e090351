"""Encoders (issue 14, group encoders): BERT and RoBERTa with their task heads.

* Parameters: exact totals, embedding and tensor shapes per head against transformers itself
  (``tests/reference/encoders/params.json``, written by ``validation/encoder_params.py`` with the head's Auto
  class on the meta device), buffers, and PEFT's LoRA trainable parameters.
* Memory: the replay against the traced points in ``tests/reference/encoders/trace.json``
  (``validation/trace_encoders.py``: the real model under FakeTensorMode, counted by MemTracker): inference
  within 1 %, training within 3 %.
* What an encoder is not: no KV cache, no generation, no serving engine; bad config values are one-line errors
  naming the field.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cache

import pytest

from gpumem_gui.core import estimate_inference, make_run
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import load_config_file, spec_from_config
from gpumem_gui.core.replay.model import model_tensors
from gpumem_gui.core.spec.encoder import ENCODER_HEADS, with_head
from gpumem_gui.core.spec.encoder_params import encoder_buffers_bytes
from gpumem_gui.core.spec.kv import kv_bytes_per_token_per_layer
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import count_params
from gpumem_gui.core.training import estimate_training, make_training_run, simulate_rank
from tests.conftest import REPO

DIR = REPO / "tests" / "reference" / "encoders"
PARAMS = json.loads((DIR / "params.json").read_text())["models"]
POINTS = [p for p in json.loads((DIR / "trace.json").read_text())["points"] if "error" not in p]
INFERENCE_TOLERANCE = 0.01
TRAINING_TOLERANCE = 0.03


@cache
def _spec(model: str, head: str) -> ModelSpec:
    return with_head(load_config_file(DIR / "configs" / f"{model}.json"), head)


def _config(model: str) -> dict:
    return json.loads((DIR / "configs" / f"{model}.json").read_text())


CASES = [(m, h) for m in sorted(PARAMS) for h in ENCODER_HEADS]


@pytest.mark.parametrize(("model", "head"), CASES)
def test_parameters_equal_transformers(model: str, head: str) -> None:
    ref = PARAMS[model][head]
    spec = _spec(model, head)
    counts = count_params(spec)
    assert counts.total == ref["total"]
    assert counts.embedding == ref["embedding"]
    ours = Counter(tuple(t.shape) for t in model_tensors(spec))  # fused where transformers fuses
    assert ours == Counter(tuple(s) for s in ref["tensors"].values())
    assert encoder_buffers_bytes(spec) == ref["buffer_bytes"]


@pytest.mark.parametrize(("model", "head"), [c for c in CASES if "lora_trainable" in PARAMS[c[0]][c[1]]])
def test_lora_trainable_parameters_equal_peft(model: str, head: str) -> None:
    """all-linear at r = 8 with PEFT's task type: no LoRA on the tied decoder, the classification head a
    trainable copy (modules_to_save) without adapters."""
    run = make_training_run(method="lora", precision="bf16", batch=1, seq=64, lora_rank=8)
    res, _, _ = simulate_rank(_spec(model, head), run)
    assert res.trainable_params == PARAMS[model][head]["lora_trainable"]


def test_token_classification_all_linear_lora_is_refused_as_peft_refuses_it() -> None:
    model = "google-bert__bert-base-uncased"
    assert "lora_error" in PARAMS[model]["token_classification"]
    run = make_training_run(method="lora", precision="bf16", batch=1, seq=64)
    with pytest.raises(GpumemInputError) as e:
        simulate_rank(_spec(model, "token_classification"), run)
    assert e.value.field == "lora_targets"


def _point_id(p: dict) -> str:
    return f"{p['model']}-{p['mode']}-{json.dumps(p['run'], sort_keys=True)}"


INFERENCE = [p for p in POINTS if p["mode"] == "inference"]
TRAIN = [p for p in POINTS if p["mode"] == "train"]


@pytest.mark.parametrize("point", INFERENCE, ids=[_point_id(p) for p in INFERENCE])
def test_inference_matches_the_trace(point: dict) -> None:
    r = point["run"]
    spec = _spec(point["model"], r["task"])
    attn = point.get("attn_implementation_used") or r["attn"]
    est = estimate_inference(spec, make_run(batch=r["batch"], seq=r["seq"], attn=attn))
    measured = point["phases"]["prefill"]["Total"]
    err = (est.phases["prefill"].peak_bytes - measured) / measured
    assert abs(err) < INFERENCE_TOLERANCE, f"prefill {err:+.3%}"
    assert est.kv_cache_bytes == point["kv_cache_bytes"] == 0
    assert est.phases["load"].peak_bytes == point["phases"]["load"]["Total"]


@pytest.mark.parametrize("point", TRAIN, ids=[_point_id(p) for p in TRAIN])
def test_training_matches_the_trace(point: dict) -> None:
    r = dict(point["run"])
    spec = _spec(point["model"], r.pop("task"))
    r["attn"] = point.get("attn_implementation_used") or r.get("attn", "sdpa")
    run = make_training_run(**r)
    res, _, _ = simulate_rank(spec, run, cpu_dropout=True)
    measured = max(m["Total"] for m in point["phases"].values())
    err = (max(p.total for p in res.phases.values()) - measured) / measured
    assert abs(err) < TRAINING_TOLERANCE, f"peak {err:+.3%}"
    assert res.trainable_params == point["trainable_params"]


def test_the_traces_cover_every_head_both_types_and_both_modes() -> None:
    seen = {(p["model"], p["mode"], p["run"]["task"]) for p in POINTS}
    models = {"google-bert__bert-base-uncased", "FacebookAI__roberta-base", "answerdotai__ModernBERT-base"}
    for model in models:
        for head in ENCODER_HEADS:
            assert (model, "inference", head) in seen
    assert {p["model"] for p in TRAIN} >= models


def test_the_head_comes_from_the_architectures() -> None:
    cfg = _config("google-bert__bert-base-uncased")
    assert spec_from_config(cfg, name="b").encoder.head == "masked_lm"  # BertForMaskedLM
    seq = {
        **cfg,
        "architectures": ["BertForSequenceClassification"],
        "id2label": {"0": "a", "1": "b", "2": "c"},
    }
    spec = spec_from_config(seq, name="b")
    assert spec.encoder.head == "sequence_classification" and spec.encoder.num_labels == 3
    assert not spec.tie_word_embeddings  # no decoder to tie
    tok = {**cfg, "architectures": ["BertForTokenClassification"], "num_labels": 9}
    assert spec_from_config(tok, name="b").encoder.num_labels == 9
    bare = {k: v for k, v in cfg.items() if k != "architectures"}
    assert spec_from_config(bare, name="b").encoder.head == "sequence_classification"


def test_an_encoder_keeps_no_cache_generates_nothing_and_has_no_position_past_its_table() -> None:
    spec = _spec("google-bert__bert-base-uncased", "masked_lm")
    assert set(kv_bytes_per_token_per_layer(spec)) == {0}
    with pytest.raises(GpumemInputError) as e:
        estimate_inference(spec, make_run(batch=1, seq=128, new_tokens=16))
    assert e.value.field == "new_tokens"
    roberta = _spec("FacebookAI__roberta-base", "sequence_classification")  # 514 rows, ids from 2
    assert estimate_inference(roberta, make_run(batch=1, seq=512)).kv_cache_bytes == 0
    with pytest.raises(GpumemInputError) as e:
        estimate_inference(roberta, make_run(batch=1, seq=513))
    assert e.value.field == "seq"
    with pytest.raises(GpumemInputError) as e:
        estimate_training(roberta, make_training_run(batch=1, seq=513))
    assert e.value.field == "seq"


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp", "ollama"])
def test_serving_engines_refuse_an_encoder_in_one_line(engine: str) -> None:
    spec = _spec("FacebookAI__roberta-base", "sequence_classification")
    with pytest.raises(GpumemInputError) as e:
        estimate_inference(spec, make_run(engine=engine, batch=1, seq=128))
    assert e.value.field == "engine" and "\n" not in str(e.value)


def test_task_applies_to_encoders_only() -> None:
    decoder = load_config_file(REPO / "tests" / "reference" / "configs" / "openai-community__gpt2.json")
    with pytest.raises(GpumemInputError) as e:
        with_head(decoder, "masked_lm")
    assert e.value.field == "task"
    with pytest.raises(GpumemInputError) as e:
        with_head(_spec("FacebookAI__roberta-base", "masked_lm"), "question_answering")
    assert e.value.field == "task"


def test_masked_lm_logits_dominate_and_training_estimates() -> None:
    mlm = _spec("google-bert__bert-base-uncased", "masked_lm")
    cls = _spec("google-bert__bert-base-uncased", "sequence_classification")
    run = make_run(batch=8, seq=512)
    assert estimate_inference(mlm, run).peak_bytes > estimate_inference(cls, run).peak_bytes
    est = estimate_training(cls, make_training_run(batch=8, seq=128))
    assert (
        est.facts["params_total"]
        == PARAMS["google-bert__bert-base-uncased"]["sequence_classification"]["total"]
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("hidden_act", "relu"),
        ("is_decoder", True),
        ("num_attention_heads", 7),
        ("hidden_dropout_prob", 1.5),
        ("attention_probs_dropout_prob", "x"),
        ("classifier_dropout", -0.1),
        ("id2label", []),
        ("num_labels", 0),
        ("type_vocab_size", -1),
        ("max_position_embeddings", 0),
        ("vocab_size", "big"),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_field(field: str, value: object) -> None:
    cfg = {**_config("FacebookAI__roberta-base"), field: value}
    with pytest.raises(GpumemInputError) as e:
        spec_from_config(cfg, name="r")
    assert e.value.field == field and "\n" not in str(e.value)


def test_cli_task_changes_the_head_and_drops_the_kv_lines(capsys: pytest.CaptureFixture[str]) -> None:
    from gpumem_gui.cli import main

    path = str(DIR / "configs" / "google-bert__bert-base-uncased.json")
    assert (
        main(
            [
                "estimate",
                path,
                "--task",
                "token_classification",
                "--num-labels",
                "9",
                "--seq",
                "512",
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["facts"]["task"] == "token_classification" and doc["kv_cache_bytes"] == 0
    spec = with_head(
        _spec("google-bert__bert-base-uncased", "token_classification"), "token_classification", 9
    )
    assert doc["facts"]["params_total"] == count_params(spec).total
    from gpumem_gui.core.runtimes.inference import runtime

    est = estimate_inference(spec, make_run(batch=1, seq=64))
    assert (
        runtime("transformers")
        .command("m", make_run(batch=1, seq=64), est)
        .startswith("AutoModelForTokenClassification.from_pretrained(")
    )
    assert main(["estimate", path, "--task", "masked_lm", "--seq", "256"]) == 0
    assert "KV cache" not in capsys.readouterr().out
    assert main(["inspect", path, "--json", "--task", "sequence_classification"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (
        doc["params"]["total"] == PARAMS["google-bert__bert-base-uncased"]["sequence_classification"]["total"]
    )
    assert doc["kv_cache_bytes_per_token"] is None
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out
    assert "task head masked_lm" in out and "KV cache" not in out
    assert main(["estimate", path, "--engine", "vllm", "--seq", "256"]) != 0
    err = capsys.readouterr().err
    assert "field 'engine'" in err and len(err.strip().splitlines()) == 1


def test_trace_request_names_the_head_and_its_labels() -> None:
    from gpumem_gui.core import load_model
    from gpumem_gui.trace.request import make_request

    m = load_model(str(DIR / "configs" / "FacebookAI__roberta-base.json"))
    spec = with_head(m.spec, "sequence_classification", 3)
    req = make_request(m.model_copy(update={"spec": spec}), make_run(batch=1, seq=64))
    assert req.run["task"] == "sequence_classification" and len(req.config["id2label"]) == 3


def test_modernbert_alternates_global_and_local_layers() -> None:
    spec = _spec("answerdotai__ModernBERT-base", "masked_lm")
    assert spec.layer_types[:4] == (
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    )
    assert spec.sliding_window == 64  # local_attention // 2: tokens seen on each side
    assert spec.encoder.block == "modernbert" and spec.encoder.pooling == "mean"
    every_2 = spec_from_config(
        {**_config("answerdotai__ModernBERT-base"), "global_attn_every_n_layers": 2}, name="m"
    )
    assert every_2.layer_types[:3] == ("full_attention", "sliding_attention", "full_attention")
    # sequences shorter than the half-window build no sliding mask (_ignore_bidirectional_mask_sdpa)
    from gpumem_gui.core.replay.config import ReplayConfig
    from gpumem_gui.core.replay.forward import replay_forward

    def mask_bytes(q: int) -> int:
        cfg = ReplayConfig(batch=2, q=q, param_dt="bf16", weights_counted=False)
        classifier = with_head(spec, "sequence_classification")  # its peak is in a layer, the mask alive
        return replay_forward(classifier, cfg).by_kind["mask"]

    assert mask_bytes(32) == 0 and mask_bytes(256) == 256 * 256  # bool [1, 1, q, q], expanded over the batch


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("classifier_pooling", "max"),
        ("hidden_activation", "relu"),
        ("classifier_activation", "silu"),
        ("local_attention", 1),
        ("global_attn_every_n_layers", 0),
        ("layer_types", ["full_attention"]),
        ("mlp_dropout", 2),
        ("decoder_bias", "yes"),
    ],
)
def test_bad_modernbert_values_are_one_line_errors_naming_the_field(field: str, value: object) -> None:
    cfg = {**_config("answerdotai__ModernBERT-base"), field: value}
    with pytest.raises(GpumemInputError) as e:
        spec_from_config(cfg, name="m")
    assert e.value.field == field and "\n" not in str(e.value)


@pytest.mark.parametrize(("model", "head"), [c for c in CASES if "large" not in c[0]])
def test_tape_equals_the_replay(model: str, head: str) -> None:
    """Encoder forwards from their tapes equal the replay op by op, on both sides of ModernBERT's half-window
    (the sliding mask appears at 64 tokens: a guard of the tape)."""
    from gpumem_gui.core.replay.config import ReplayConfig
    from gpumem_gui.core.replay.forward import replay_forward, replay_forward_direct

    spec = _spec(model, head)
    for attn in ("sdpa", "eager"):
        for b, q in ((1, 32), (2, 300), (3, 63), (1, 64), (4, 65), (2, 7)):
            cfg = ReplayConfig(batch=b, q=q, param_dt="bf16", attn=attn, weights_counted=False)
            assert replay_forward(spec, cfg) == replay_forward_direct(spec, cfg)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("share_att_key", False),
        ("relative_attention", False),
        ("position_biased_input", True),
        ("pos_att_type", "c2p"),
        ("type_vocab_size", 2),
        ("conv_kernel_size", 3),
        ("norm_rel_ebd", "none"),
        ("position_buckets", -1),
        ("legacy", False),
        ("pooler_hidden_size", 1024),
    ],
)
def test_deberta_variants_not_modelled_are_one_line_errors_naming_the_field(
    field: str, value: object
) -> None:
    cfg = {**_config("microsoft__deberta-v3-base"), field: value}
    with pytest.raises(GpumemInputError) as e:
        spec_from_config(cfg, name="d")
    assert e.value.field == field and "\n" not in str(e.value)


def test_deberta_reads_fine_tuned_configs() -> None:
    """A fine-tuned copy: pos_att_type as a list, the head (DebertaV2ForSequenceClassification), labels."""
    cfg = {
        **_config("microsoft__deberta-v3-base"),
        "pos_att_type": ["p2c", "c2p"],
        "architectures": ["DebertaV2ForSequenceClassification"],
        "id2label": {str(i): str(i) for i in range(8)},
        "pooler_hidden_size": 768,
    }
    spec = spec_from_config(cfg, name="d")
    assert (
        spec.encoder.block == "deberta" and spec.encoder.relative_span == 256 and spec.encoder.num_labels == 8
    )
    assert spec.position_embedding == "none" and not spec.tie_word_embeddings
