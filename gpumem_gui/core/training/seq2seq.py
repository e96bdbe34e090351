"""What a fine-tuning run of an encoder-decoder (T5, mT5, UMT5, BART: :attr:`ModelSpec.seq2seq`) can be.

The step is the one every model replays (:func:`gpumem_gui.core.replay.step.simulate_step` with
:class:`~gpumem_gui.core.replay.seq2seq.Seq2SeqLM`): ``model(input_ids, labels=input_ids, use_cache=False)``,
the encoder over ``seq`` source tokens and the decoder teacher-forced over ``seq`` target tokens (the labels
shifted right), the seq2seq LM head and its CrossEntropyLoss, on one GPU, full or LoRA, in fp32, bf16 or
amp-bf16. What it does not model is refused here in one line naming the field.
"""

from __future__ import annotations

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.seq2seq import check_positions
from gpumem_gui.core.training.run import TrainingRun

_PRECISIONS = ("amp-bf16", "bf16", "fp32")


def check_seq2seq_training(spec: ModelSpec, run: TrainingRun) -> None:
    """Refuse, in one line naming the field, what the encoder-decoder step does not model."""
    if model_kinds(spec).model != "encoder-decoder":
        return
    for name in ("dp", "tp", "pp", "ep", "cp"):
        if getattr(run, name) > 1:
            raise GpumemInputError(
                f"{name} > 1 is not modelled for encoder-decoders (one GPU); measure it with `gpumem trace`",
                field=name,
            )
    if run.zero or run.fsdp != "none" or run.offload != "none":
        raise GpumemInputError(
            "ZeRO, FSDP and offload are not modelled for encoder-decoders (one GPU)",
            field="zero" if run.zero else "fsdp" if run.fsdp != "none" else "offload",
        )
    if run.method == "qlora":
        raise GpumemInputError("QLoRA is not modelled for encoder-decoders; use full or lora", field="method")
    if run.precision not in _PRECISIONS:
        raise GpumemInputError(
            f"precision {run.precision} is not modelled for encoder-decoders (T5Block clamps fp16 overflows; "
            f"the step is replayed in {', '.join(_PRECISIONS)})",
            field="precision",
        )
    check_positions(spec, run.seq, run.seq)  # labels = input ids: the target is as long as the source
    if run.framework not in ("pytorch", "hf-trainer"):
        raise GpumemInputError(
            f"framework {run.framework} is not modelled for encoder-decoders; use pytorch or hf-trainer",
            field="framework",
        )
