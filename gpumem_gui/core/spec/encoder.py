"""``EncoderSpec``: what makes a :class:`~gpumem_gui.core.spec.model.ModelSpec` a bidirectional encoder (BERT,
RoBERTa) rather than a causal decoder, and which task head sits on it.

An encoder's body is described by the ordinary ModelSpec fields (learned absolute positions, LayerNorm with
biases, post-norm blocks, a plain GELU MLP, an embedding LayerNorm); this spec adds what the decoder fields
cannot say: the token-type table, the task head transformers builds for the chosen Auto class, and how
position ids are made. The attention is bidirectional and no KV cache is kept (``BertModel.forward``:
``use_cache = False`` unless ``is_decoder``; ``create_bidirectional_mask``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpumem_gui.core.fields import UI

if TYPE_CHECKING:
    from gpumem_gui.core.spec.model import ModelSpec

# the heads transformers' Auto classes build on an encoder (models/bert/modeling_bert.py
# BertForSequenceClassification, BertForTokenClassification, BertForMaskedLM; the RoBERTa equivalents)
EncoderHead = Literal["sequence_classification", "token_classification", "masked_lm"]
ENCODER_HEADS: tuple[str, ...] = ("sequence_classification", "token_classification", "masked_lm")
MAX_LABELS = 1 << 20  # a bound of ours, not a library's: a classifier wider than the largest vocabularies
# the architectures name a checkpoint's head (config.json "architectures"; suffix of the model class)
HEAD_OF_ARCHITECTURE = {
    "ForSequenceClassification": "sequence_classification",
    "ForTokenClassification": "token_classification",
    "ForMaskedLM": "masked_lm",
    "ForPreTraining": "masked_lm",
}


class EncoderSpec(BaseModel):
    """The encoder's extra embedding, its head, and its position-id construction."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    head: EncoderHead = Field(
        description="the task head: sequence classification (first token, pooled, num_labels logits), token "
        "classification (num_labels logits per token) or masked LM (transform + vocabulary decoder tied "
        "to the embedding)"
    )
    num_labels: Annotated[int, Field(gt=0, le=MAX_LABELS)] = Field(
        2, description="classifier outputs (PreTrainedConfig.num_labels: len(id2label), default 2)"
    )
    type_vocab_size: Annotated[int, Field(ge=0, le=1 << 20)] = Field(
        description="rows of the token-type embedding (BertEmbeddings.token_type_embeddings); 0: none"
    )
    classifier: Literal["pooler", "dense"] = Field(
        description="the sequence-classification head: pooler: BertPooler (dense + tanh on the first token) "
        "in the base model and a Linear classifier (BertForSequenceClassification); dense: no pooler, "
        "RobertaClassificationHead (dense + tanh + out_proj) as the classifier"
    )
    position_ids_from_input: bool = Field(
        False,
        description="position ids computed from the input ids (RobertaEmbeddings."
        "create_position_ids_from_input_ids: int32 mask and cumsum, an int64 [batch, seq] tensor) instead of "
        "a slice of the position_ids buffer (BertEmbeddings)",
    )
    classifier_dropout: Annotated[float, Field(ge=0, lt=1)] | None = Field(
        None,
        description="dropout before the classifier (config classifier_dropout; None: hidden_dropout_prob)",
    )
    tie_decoder: bool = Field(
        True,
        description="the masked-LM decoder's weight is the word embedding (config tie_word_embeddings, True "
        "in BertConfig / RobertaConfig)",
    )
    block: Literal["bert", "modernbert", "deberta"] = Field(
        "bert",
        description="bert: post-norm BertLayer with learned positions (modeling_bert.py, "
        "modeling_roberta.py); modernbert: ModernBertEncoderLayer (pre-norm, no norm before the first "
        "attention, fused Wqkv, rotary on fp32 copies of q and k, GLU MLP Wi/Wo, a final norm; "
        "modeling_modernbert.py); deberta: DebertaV2Layer, post-norm with disentangled attention over "
        "relative positions (modeling_deberta_v2.py)",
    )
    pooling: Literal["cls", "mean"] = Field(
        "cls",
        description="sequence classification pools the first token (cls) or the mean over tokens "
        "(ModernBertConfig.classifier_pooling)",
    )
    head_dense_bias: bool = Field(
        True,
        description="the head's dense layer has a bias (BERT/RoBERTa heads; ModernBertPredictionHead: "
        "classifier_bias, default False)",
    )
    decoder_bias: bool = Field(
        True, description="the masked-LM decoder has a bias (ModernBertConfig.decoder_bias; BERT: always)"
    )
    relative_span: Annotated[int, Field(ge=0, le=1 << 20)] = Field(
        0,
        description="DeBERTa-v2: relative-position buckets on each side (position_buckets; the attention "
        "span att_span, rel_embeddings has 2 x span rows); 0 for other encoders",
    )


_HEAD = "Encoder task head"


class TaskHead(BaseModel):
    """The task head to put on an encoder instead of the one its config names, declared once: the CLI's
    ``--task`` / ``--num-labels`` and the window's encoder form are generated from these fields (None: what
    the config says)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: Annotated[
        EncoderHead | None,
        UI(
            "Task head",
            _HEAD,
            "an encoder's task head (BERT, RoBERTa): the Auto class transformers builds, which decides the "
            "head's parameters and activations; the config's architectures name it, else sequence "
            "classification",
            choices=(
                ("sequence classification", "sequence_classification"),
                ("token classification", "token_classification"),
                ("masked LM", "masked_lm"),
            ),
            special="from the config",
        ),
    ] = None
    num_labels: Annotated[
        int | None,
        Field(gt=0, le=MAX_LABELS),
        UI(
            "Labels",
            _HEAD,
            "outputs of an encoder's classification head (the config's num_labels / id2label by default)",
            special="from the config",
            none=0,
            shown=lambda v: v.get("task") != "masked_lm",
        ),
    ] = None

    @classmethod
    def of(cls, spec: ModelSpec) -> TaskHead:
        """The head ``spec`` carries, every field given (empty for a model that is no encoder)."""
        enc = spec.encoder
        return cls() if enc is None else cls(task=enc.head, num_labels=enc.num_labels)


def make_task_head(**fields: object) -> TaskHead:
    """Build a :class:`TaskHead`; a bad value is one :class:`GpumemInputError` naming the field."""
    from gpumem_gui.core.errors import describe_validation_error

    try:
        return TaskHead(**fields)  # type: ignore[arg-type]
    except ValidationError as e:
        raise describe_validation_error(e, source="task head") from None


def with_head(spec: ModelSpec, head: str, num_labels: int | None = None) -> ModelSpec:
    """``spec`` with the task head ``head`` (and ``num_labels`` classifier outputs) instead of its own; the
    decoder of a masked-LM head is tied as the config says. A decoder spec has no head to change."""
    from gpumem_gui.core.errors import GpumemInputError

    enc = spec.encoder
    if enc is None:
        raise GpumemInputError(
            f"--task applies to encoders (BERT, RoBERTa); {spec.name} is a causal LM", field="task"
        )
    if head not in ENCODER_HEADS:
        raise GpumemInputError(f"unknown task {head!r}; tasks: {', '.join(ENCODER_HEADS)}", field="task")
    new = enc.model_copy(update={"head": head, "num_labels": num_labels or enc.num_labels})
    tie = enc.tie_decoder and head == "masked_lm"
    return spec.model_copy(update={"encoder": EncoderSpec(**new.model_dump()), "tie_word_embeddings": tie})


def check_positions(spec: ModelSpec, seq: int) -> None:
    """An encoder's learned position table has ``max_position_embeddings`` rows (RoBERTa: two fewer usable,
    its ids start after the padding index; ModernBERT: trained to that length): a longer sequence has no
    position to look up."""
    from gpumem_gui.core.errors import GpumemInputError

    if seq > spec.max_position_embeddings:
        raise GpumemInputError(
            f"{seq} tokens exceed the encoder's {spec.max_position_embeddings} positions "
            "(max_position_embeddings); choose a shorter sequence",
            field="seq",
        )
