"""Training and fine-tuning memory: ``estimate_training(spec, run) -> Estimate``.

One optimizer step is replayed tensor by tensor (:mod:`gpumem_gui.core.replay.step`): the transformers forward
and loss on symbolic tensors with autograd's saving rules, the backward engine freeing saved tensors as
gradients appear, and the optimizer step with its implementation's temporaries. Phases:

* ``forward``: parameters, optimizer states (steady state: they exist before the step), activations saved for
  backward growing layer by layer, the autocast weight copies, logits and the fp32 loss computation;
* ``backward``: saved activations freed as gradients appear (the peak is usually at its start, when the fp32
  logits gradient joins the saved activations, or at its end, when every gradient exists);
* ``optimizer``: parameters + gradients + states + the step's temporaries.

``peak_bytes`` is the largest live-tensor total on the most-loaded GPU (``torch.cuda.max_memory_allocated``);
``total_bytes`` adds the CUDA context, cuBLAS workspaces, NCCL buffers (:mod:`comms`) and allocator reserve.

Several GPUs: ZeRO-1/2/3 and FSDP shard optimizer states / gradients / parameters over the data-parallel ranks
(gradients reduce-scattered as they appear; ZeRO-3/FULL_SHARD gather one decoder layer at a time, the root
unit of embeddings and head staying gathered); tensor, pipeline and expert parallelism give each rank its
slice of the model (:func:`gpumem_gui.core.spec.parallel.rank_spec`); 1F1B pipelining keeps the
activations of ``min(pp - stage, grad_accum)`` micro-batches on a stage; context parallelism splits the
sequence.
"""

from __future__ import annotations

from gpumem_gui.core.training.checks import check_training
from gpumem_gui.core.training.command import training_command
from gpumem_gui.core.training.estimate import estimate_training
from gpumem_gui.core.training.frameworks import FRAMEWORKS, Framework, framework
from gpumem_gui.core.training.precision import PRECISION_DOC
from gpumem_gui.core.training.profiles import holds_unsynced_gradients
from gpumem_gui.core.training.rank import sharding_hooks, simulate_rank, step_config, step_options
from gpumem_gui.core.training.run import TrainingRun, make_training_run

__all__ = [
    "FRAMEWORKS",
    "PRECISION_DOC",
    "Framework",
    "TrainingRun",
    "check_training",
    "estimate_training",
    "framework",
    "holds_unsynced_gradients",
    "make_training_run",
    "sharding_hooks",
    "simulate_rank",
    "step_config",
    "step_options",
    "training_command",
]
