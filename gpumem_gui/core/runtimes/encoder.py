"""What an inference run of an encoder (BERT, RoBERTa: :attr:`ModelSpec.encoder`) may be: one forward of
``batch x seq`` tokens through transformers on one GPU, the task head's logits at the end.

Serving engines built around a generation loop and a KV cache do not run these models for their heads: vLLM
and SGLang serve encoders only as pooling / embedding models, llama.cpp and Ollama only as embedding models
(``--embedding``), none with a classification or masked-LM head, and none of those paths is modelled here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.encoder import check_positions
from gpumem_gui.core.spec.model import ModelSpec

if TYPE_CHECKING:
    from gpumem_gui.core.runtimes.base import Runtime


def check_encoder_inference(spec: ModelSpec, run: InferenceRun, rt: Runtime) -> None:
    """Refuse, in one line naming the field, what an encoder run cannot be (on engine ``rt``)."""
    check_positions(spec, run.seq)
    if not rt.serves("encoder"):
        raise GpumemInputError(
            f"{run.engine} is not modelled for encoder models (BERT, RoBERTa: no generation, no KV cache); "
            "use --engine transformers",
            field="engine",
        )
    if run.new_tokens:
        raise GpumemInputError(
            "an encoder does not generate: one forward over the input, new_tokens must be 0",
            field="new_tokens",
        )
    for name in ("tp", "pp", "ep"):
        if getattr(run, name) > 1:
            raise GpumemInputError(f"{name} > 1 is not modelled for encoders (one GPU)", field=name)
