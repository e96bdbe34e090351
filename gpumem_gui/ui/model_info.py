"""What the model panel shows about a model: the architecture summary (HTML) and the catalog's parameter
counts (a table item that sorts by the exact number)."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QTableWidgetItem

from gpumem_gui.core import (
    LoadedModel,
    SizeUnit,
    describe_linear_attention,
    fmt_bytes,
    fmt_count,
    model_kinds,
)
from gpumem_gui.ui.theme import FREE_COLOR

APPROXIMATE_COLOR = FREE_COLOR  # the theme's orange: a caution, not an error


class CountItem(QTableWidgetItem):
    """Sorts by the exact number, shows the short form."""

    def __lt__(self, other: QTableWidgetItem) -> bool:
        a = self.data(Qt.ItemDataRole.UserRole + 1)
        b = other.data(Qt.ItemDataRole.UserRole + 1)
        if isinstance(a, int) and isinstance(b, int):
            return a < b
        return super().__lt__(other)


def architecture_html(m: LoadedModel, unit: SizeUnit) -> str:
    """The architecture summary of ``m`` as a small HTML table."""
    e = html.escape
    rows: list[tuple[str, str]] = [("source", f"{m.source_kind}: {m.source}")]
    spec = m.spec
    if spec is not None:
        rows += [
            ("model type", spec.model_type),
            ("layers", str(spec.num_layers)),
            ("hidden size", f"{spec.hidden_size:,}"),
            (
                "attention",
                f"{spec.attention_kind}: {spec.num_attention_heads} query heads, "
                f"{spec.num_kv_heads} KV heads, "
                f"head_dim {spec.head_dim}",
            ),
            (
                "MLP",
                f"{'gated' if spec.mlp_gated else 'plain'} {spec.activation}, "
                f"width {spec.intermediate_size:,}",
            ),
            (
                "vocabulary",
                f"{spec.vocab_size:,} ({'tied' if spec.tie_word_embeddings else 'untied'} lm_head)",
            ),
            ("positions", f"{spec.position_embedding}, max {spec.max_position_embeddings:,}"),
        ]
        if spec.sliding_window:
            n_sl = len(model_kinds(spec).layers_of("sliding_attention"))
            rows.append(
                ("sliding window", f"{spec.sliding_window:,} tokens on {n_sl} of {spec.num_layers} layers")
            )
        if spec.attention_chunk_size:  # Llama 4's chunked local attention
            n_ch = len(model_kinds(spec).layers_of("chunked_attention"))
            rows.append(
                (
                    "attention chunks",
                    f"{spec.attention_chunk_size:,} tokens on {n_ch} of {spec.num_layers} layers",
                )
            )
        if spec.moe:
            rows.append(
                (
                    "MoE",
                    f"{spec.moe.num_experts} experts, top-{spec.moe.experts_per_token}, expert width "
                    f"{spec.moe.expert_intermediate_size:,}, {spec.num_moe_layers} MoE layers",
                )
            )
        if spec.mla:
            rows.append(("MLA", f"kv_lora_rank {spec.mla.kv_lora_rank}, q_lora_rank {spec.mla.q_lora_rank}"))
        if (linear := describe_linear_attention(spec)) is not None:  # hybrid models (spec/state.py)
            rows.append(("recurrent layers", linear))
        if spec.vision:
            rows.append(("vision", f"{spec.vision.kind}, {fmt_count(spec.vision.params)} parameters"))
        if spec.encoder:  # BERT, RoBERTa: the head the estimate counts (the CLI's --task changes it)
            labels = f", {spec.encoder.num_labels} labels" if spec.encoder.head != "masked_lm" else ""
            rows.append(("encoder", f"bidirectional, no KV cache; head {spec.encoder.head}{labels}"))
    if m.weights is not None:
        w = m.weights
        rows.append(
            (
                "weight files",
                f"{w.format}, {len(w.files)} file(s), {w.tensor_count:,} tensors, "
                f"{fmt_bytes(w.total_bytes, unit)} ({w.quantization or 'unquantized'})",
            )
        )
    body = "".join(
        f"<tr><td style='padding-right:8px'><b>{e(k)}</b></td><td>{e(v)}</td></tr>" for k, v in rows
    )
    notes = "".join(f"<p><i>note: {e(n)}</i></p>" for n in m.notes)
    return f"{approximate_html(m)}<table>{body}</table>{notes}"


def approximate_html(m: LoadedModel) -> str:
    """A banner above the summary when the readers do not model the architecture (``ModelSpec.approximate``:
    a generic decoder stood in): why, and where the exact answer is (Tools > Verify exactly)."""
    why = m.spec.approximate if m.spec is not None else None
    if not why:
        return ""
    return (
        f"<p style='color:{APPROXIMATE_COLOR}'><b>approximate: architecture not modelled</b><br>"
        f"{html.escape(why.removeprefix('architecture not modelled: '))}</p>"
    )
