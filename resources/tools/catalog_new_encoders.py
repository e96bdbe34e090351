"""Catalog entries of the encoder model types issue 14 adds (BERT, RoBERTa, ModernBERT, DeBERTa-v3): family,
size label and the parameter count the publisher states, with its source; build_model_catalog checks each
against the exact count. The catalog holds each checkpoint with the head its config names
(``BertForMaskedLM``, ``RobertaForMaskedLM``, ``ModernBertForMaskedLM``: the masked-LM head, decoder tied to
the embedding; DeBERTa-v3's config names none: sequence classification); ``--task`` picks another."""

from __future__ import annotations

from catalog_published import Model, components, label, stated

# Devlin et al. 2018, "BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding",
# section 3: "BERTBASE (L=12, H=768, A=12, Total Parameters=110M) and BERTLARGE (L=24, H=1024, A=16, Total
# Parameters=340M)"
BERT_PAPER = "arXiv:1810.04805 (BERT paper, section 3)"
# fairseq examples/roberta/README.md, 'Pre-trained models': "roberta.base | RoBERTa using the BERT-base
# architecture | 125M" and "roberta.large | RoBERTa using the BERT-large architecture | 355M"
ROBERTA_README = "github.com/facebookresearch/fairseq examples/roberta/README.md ('Pre-trained models')"
# answerdotai/ModernBERT-base model card (README.md): "ModernBERT-base - 22 layers, 149 million parameters"
# and "ModernBERT-large - 28 layers, 395 million parameters"
MODERNBERT_CARD = "huggingface.co/answerdotai/ModernBERT-base model card (README.md)"
# microsoft/deberta-v3-base model card (README.md): "It has only 86M backbone parameters with a vocabulary
# containing 128K tokens which introduces 98M parameters in the Embedding layer"
DEBERTA_CARD = "huggingface.co/microsoft/deberta-v3-base model card (README.md)"
ENCODER_NOTE = "Encoder (bidirectional, no KV cache): transformers only; --task picks the head."

MODELS: tuple[Model, ...] = (
    Model("google-bert/bert-base-uncased", "BERT", "110M", stated("110M", BERT_PAPER, ENCODER_NOTE)),
    Model(
        "google-bert/bert-large-uncased",
        "BERT",
        "340M",
        # BertForMaskedLM builds 335.2M (BertForPreTraining, with the pooler and the NSP head, 336.2M): the
        # paper's 340M is a rounded figure, read as a size label
        label("340M", BERT_PAPER, ENCODER_NOTE),
    ),
    Model("FacebookAI/roberta-base", "RoBERTa", "125M", stated("125M", ROBERTA_README, ENCODER_NOTE)),
    Model("FacebookAI/roberta-large", "RoBERTa", "355M", stated("355M", ROBERTA_README, ENCODER_NOTE)),
    Model("answerdotai/ModernBERT-base", "ModernBERT", "149M", stated("149M", MODERNBERT_CARD, ENCODER_NOTE)),
    Model(
        "answerdotai/ModernBERT-large", "ModernBERT", "395M", stated("395M", MODERNBERT_CARD, ENCODER_NOTE)
    ),
    Model(
        "microsoft/deberta-v3-base",
        "DeBERTa-v3",
        "184M",
        components((86, 98), 10**6, DEBERTA_CARD + " ('86M backbone' + '98M' embedding)", ENCODER_NOTE),
    ),
)
