"""Catalog entries of the encoder-decoder model types issue 14 adds (BART): family, size label and the
parameter count the publisher states, with its source; build_model_catalog checks each against the exact
count (BartForConditionalGeneration: lm_head tied to the shared embedding, final_logits_bias a buffer)."""

from __future__ import annotations

from catalog_published import Model, label, stated

# fairseq examples/bart/README.md, 'Pre-trained models': "bart.base | BART model with 6 encoder and decoder
# layers | 140M", "bart.large | BART model with 12 encoder and decoder layers | 400M", "bart.large.cnn |
# bart.large finetuned on CNN-DM | 400M" (read via the search index, find_string id 10324823300)
BART_README = "github.com/facebookresearch/fairseq examples/bart/README.md ('Pre-trained models')"
SEQ2SEQ_NOTE = (
    "Encoder-decoder: transformers generate() and fine-tuning only (source = --seq, target = --new-tokens; "
    "training: labels = the input ids)."
)

MODELS: tuple[Model, ...] = (
    Model("facebook/bart-base", "BART", "140M", stated("140M", BART_README, SEQ2SEQ_NOTE)),
    # 406.3M built: the README's 400M is a rounded figure, read as a size label
    Model("facebook/bart-large", "BART", "400M", label("400M", BART_README, SEQ2SEQ_NOTE)),
    Model("facebook/bart-large-cnn", "BART", "400M", label("400M", BART_README, SEQ2SEQ_NOTE)),
)
