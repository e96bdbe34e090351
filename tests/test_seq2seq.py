"""Encoder-decoders (issue 14, group seq2seq): T5 (relu and v1.1 gated-gelu), mT5, UMT5, BART; mBART (issue
29: BART's blocks normalised first, a final LayerNorm per stack).

* Parameters: exact totals, embedding and tensor shapes against transformers itself
  (``tests/reference/seq2seq/params.json``, written by ``validation/seq2seq_params.py`` with
  ``AutoModelForSeq2SeqLM`` on the meta device); the weights of the load phase.
* Memory: ``generate()`` replayed (the encoder over the source, the first decoder step filling the
  cross-attention cache, the last decoder step) against the traced points in
  ``tests/reference/seq2seq/trace.json`` (``validation/trace_seq2seq.py``): every phase within 1 %, the
  caches (self + cross) exact.
* Fine-tuning (``model(input_ids, labels=input_ids)``, full and LoRA) replayed through the training step
  against the traced steps of the same file: the step's peak within 3 %, LoRA's trainable parameters equal
  PEFT's.
* What is not modelled is refused in one line naming the field; bad config values likewise.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cache

import pytest

from gpumem_gui.core import estimate_inference, make_run
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import load_config_file, spec_from_config
from gpumem_gui.core.reference_points import traced_training_run
from gpumem_gui.core.replay.model import model_tensors
from gpumem_gui.core.spec.kv import kv_bytes_per_token_per_layer
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import count_params
from gpumem_gui.core.spec.seq2seq import cross_cache_bytes_per_source_token
from gpumem_gui.core.training import estimate_training, make_training_run
from gpumem_gui.core.training.rank import simulate_rank
from tests.conftest import REPO

DIR = REPO / "tests" / "reference" / "seq2seq"
PARAMS = json.loads((DIR / "params.json").read_text())["models"]
_ALL = [p for p in json.loads((DIR / "trace.json").read_text())["points"] if "error" not in p]
POINTS = [p for p in _ALL if p.get("mode", "inference") == "inference"]
TRAIN = [p for p in _ALL if p.get("mode") == "train"]
TOLERANCE = 0.01
TRAIN_TOLERANCE = 0.03


@cache
def _spec(model: str) -> ModelSpec:
    return load_config_file(DIR / "configs" / f"{model}.json")


def _config(model: str) -> dict:
    return json.loads((DIR / "configs" / f"{model}.json").read_text())


@pytest.mark.parametrize("model", sorted(PARAMS))
def test_parameters_equal_transformers(model: str) -> None:
    ref, spec = PARAMS[model], _spec(model)
    counts = count_params(spec)
    assert counts.total == ref["total"]
    assert counts.embedding == ref["embedding"]
    assert ref["lm_head_tied"] and counts.lm_head == 0  # T5Config forces tie_word_embeddings = True
    assert Counter(t.shape for t in model_tensors(spec)) == Counter(tuple(s) for s in ref["tensors"].values())


def test_v1_1_and_original_t5_differ_as_transformers_builds_them() -> None:
    original, flan = _spec("google-t5__t5-small"), _spec("google__flan-t5-xl")
    assert not original.mlp_gated and original.activation == "relu"
    assert flan.mlp_gated and flan.activation == "gelu_new"  # gated-gelu runs NewGELUActivation
    # scale_decoder_outputs: the config's tie_word_embeddings is not False (T5 v1.1 stores False)
    assert original.seq2seq is not None and original.seq2seq.scale_decoder_outputs
    assert flan.seq2seq is not None and not flan.seq2seq.scale_decoder_outputs
    mt5 = _spec("google__mt5-small")
    assert mt5.seq2seq is not None and not mt5.seq2seq.scale_decoder_outputs  # MT5 never rescales


def test_mbart_is_bart_normalised_first_with_a_norm_per_stack() -> None:
    """modeling_mbart.py: MBartEncoderLayer / MBartDecoderLayer pre-norm, MBartEncoder /
    MBartDecoder.layer_norm (two more LayerNorms than the same config read as BART)."""
    mbart = _spec("facebook__mbart-large-50")
    as_bart = spec_from_config({**_config("facebook__mbart-large-50"), "model_type": "bart"}, name="b")
    assert mbart.seq2seq is not None and mbart.seq2seq.pre_norm and mbart.seq2seq.block == "bart"
    assert as_bart.seq2seq is not None and not as_bart.seq2seq.pre_norm
    assert count_params(mbart).total - count_params(as_bart).total == 2 * 2 * 1024
    names = {t.name for t in model_tensors(mbart)} - {t.name for t in model_tensors(as_bart)}
    assert names == {f"{s}.layer_norm.{w}" for s in ("encoder", "decoder") for w in ("weight", "bias")}
    # the replay runs the blocks in their own order: the same run differs from BART's post-norm one
    run = make_run(batch=2, seq=256, new_tokens=8)
    assert estimate_inference(mbart, run).phases["prefill"].peak_bytes != (
        estimate_inference(as_bart, run).phases["prefill"].peak_bytes
    )


def test_cache_per_token_counts_decoder_blocks_only() -> None:
    spec = _spec("google-t5__t5-base")  # 12 + 12 blocks, 12 heads x 64
    per_layer = kv_bytes_per_token_per_layer(spec)
    assert per_layer[:12] == (0,) * 12 and set(per_layer[12:]) == {2 * 768 * 2}
    assert cross_cache_bytes_per_source_token(spec) == 12 * 2 * 768 * 2


def _point_id(p: dict) -> str:
    return f"{p['model']}-{json.dumps(p['run'], sort_keys=True)}"


@pytest.mark.parametrize("point", POINTS, ids=[_point_id(p) for p in POINTS])
def test_generate_matches_the_trace(point: dict) -> None:
    r = point["run"]
    dt = r["compute_dtype"]
    run = make_run(
        batch=r["batch"],
        seq=r["seq"],
        new_tokens=r["new_tokens"],
        attn=r["attn"],
        compute_dtype=dt,
        weights=dt,
    )
    est = estimate_inference(_spec(point["model"]), run)
    for phase, measured in point["phases"].items():
        err = (est.phases[phase].peak_bytes - measured["Total"]) / measured["Total"]
        assert abs(err) < TOLERANCE, f"{phase} {err:+.4%}"
    # BART's final_logits_bias: the load phase counts buffers at 2 bytes (runtimes/base.py)
    buffer_slack = 2 * _spec(point["model"]).vocab_size if dt == "fp32" else 0
    assert abs(est.phases["load"].peak_bytes - point["phases"]["load"]["Total"]) <= buffer_slack
    assert est.kv_cache_bytes == point["kv_cache_bytes"]  # self- and cross-attention caches


@pytest.mark.parametrize("point", TRAIN, ids=[_point_id(p) for p in TRAIN])
def test_fine_tuning_matches_the_trace(point: dict) -> None:
    """One optimizer step replayed with the CPU's dropout kernel (the trace ran on the CPU)."""
    spec, run = _spec(point["model"]), traced_training_run(point)
    res, _, _ = simulate_rank(spec, run, cpu_dropout=True)
    measured = max(m["Total"] for m in point["phases"].values())
    err = (max(p.total for p in res.phases.values()) - measured) / measured
    assert abs(err) < TRAIN_TOLERANCE, f"peak {err:+.3%}"
    est = estimate_training(spec, run)
    assert est.facts["trainable_params"] == point["trainable_params"]


def test_fine_tuning_covers_both_families_full_and_lora() -> None:
    kinds = {(_spec(p["model"]).seq2seq.block, p["run"].get("method", "full")) for p in TRAIN}  # type: ignore[union-attr]
    assert kinds >= {("t5", "full"), ("t5", "lora"), ("bart", "full"), ("bart", "lora")}


def test_estimate_names_the_seq2seq_auto_class() -> None:
    from gpumem_gui.core.runtimes.transformers import TRANSFORMERS

    run = make_run(batch=1, seq=128, new_tokens=4)
    est = estimate_inference(_spec("google-t5__t5-small"), run)
    assert TRANSFORMERS.command("google-t5/t5-small", run, est).startswith("AutoModelForSeq2SeqLM")


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"engine": "vllm"}, "engine"),
        ({"compute_dtype": "fp16"}, "compute_dtype"),
        ({"tp": 2}, "tp"),
    ],
)
def test_unmodelled_inference_is_refused(kw: dict, field: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        estimate_inference(_spec("google-t5__t5-small"), make_run(batch=1, seq=64, new_tokens=4, **kw))
    assert e.value.field == field


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"tp": 2}, "tp"),
        ({"dp": 2}, "dp"),
        ({"zero": 2}, "zero"),
        ({"method": "qlora"}, "method"),
        ({"precision": "amp-fp16"}, "precision"),
        ({"framework": "torchtune"}, "framework"),
    ],
)
def test_unmodelled_fine_tuning_is_refused(kw: dict, field: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        estimate_training(_spec("google-t5__t5-small"), make_training_run(batch=1, seq=64, **kw))
    assert e.value.field == field
    assert "\n" not in str(e.value)


def test_bart_positions_bound_the_lengths() -> None:
    spec = _spec("facebook__bart-base")  # BartLearnedPositionalEmbedding: 1024 positions (+ 2)
    with pytest.raises(GpumemInputError) as e:
        estimate_inference(spec, make_run(batch=1, seq=2048, new_tokens=4))
    assert e.value.field == "seq"
    with pytest.raises(GpumemInputError) as e:
        estimate_training(spec, make_training_run(batch=1, seq=1025))
    assert e.value.field == "seq"


def test_t5_fine_tuning_estimate_has_the_step_phases() -> None:
    est = estimate_training(_spec("google-t5__t5-small"), make_training_run(batch=2, seq=128))
    assert {"forward", "backward", "optimizer"} <= set(est.phases)
    assert est.facts["trainable_params"] == PARAMS["google-t5__t5-small"]["total"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"feed_forward_proj": "gated-gelu-x"}, "feed_forward_proj"),
        ({"feed_forward_proj": "swiglu-relu"}, "feed_forward_proj"),
        ({"feed_forward_proj": 3}, "feed_forward_proj"),
        ({"num_layers": 0}, "num_layers"),
        ({"num_decoder_layers": -1}, "num_decoder_layers"),
        ({"relative_attention_num_buckets": 0}, "relative_attention_num_buckets"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
        ({"is_decoder": True}, "is_decoder"),
        ({"dropout_rate": 1.5}, "dropout_rate"),
        ({"dropout_rate": "x"}, "dropout_rate"),
    ],
)
def test_bad_config_values_name_the_field(change: dict, field: str) -> None:
    cfg = {**_config("google-t5__t5-small"), **change}
    with pytest.raises(GpumemInputError) as e:
        spec_from_config(cfg, name="t5", source="config.json")
    assert e.value.field == field
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"decoder_attention_heads": 8}, "decoder_attention_heads"),
        ({"decoder_ffn_dim": 1024}, "decoder_ffn_dim"),
        ({"encoder_attention_heads": 7, "decoder_attention_heads": 7}, "encoder_attention_heads"),
        ({"encoder_layerdrop": 0.1}, "encoder_layerdrop"),
        ({"attention_dropout": 1.0}, "attention_dropout"),
        ({"activation_dropout": -0.1}, "activation_dropout"),
        ({"d_model": 0}, "d_model"),
        ({"is_encoder_decoder": False}, "is_decoder"),
    ],
)
def test_bad_bart_config_values_name_the_field(change: dict, field: str) -> None:
    cfg = {**_config("facebook__bart-base"), **change}
    with pytest.raises(GpumemInputError) as e:
        spec_from_config(cfg, name="bart", source="config.json")
    assert e.value.field == field
    assert "\n" not in str(e.value)
