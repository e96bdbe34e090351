"""LoRA on a vision-language model's tower (:mod:`.vision_train`): what the towers' ops add when PEFT wraps
their linears, or when the frozen tower runs under autograd all the same.

* An adapted linear of the tower or projector is PEFT's ``lora.Linear`` around the frozen base
  (``peft/tuners/lora/layer.py`` ``Linear.forward``, :func:`.adapters.lora`): the base's matmul saves
  nothing for a weight gradient, the adapter saves its input (and its dropout mask), and from the first
  adapted linear on, the tower's ops save what their backward needs.
* ``enable_input_require_grads``: PEFT calls it when the model checkpoints its layers
  (``peft/peft_model.py`` ``PeftModel.__init__`` -> ``_prepare_model_for_gradient_checkpointing``), and
  transformers 5.24 (``modeling_utils.py`` ``PreTrainedModel.enable_input_require_grads``) hooks the input
  embeddings of every ``PreTrainedModel`` inside the model, the vision model's included: its output
  ``requires_grad_(True)``, so autograd records the frozen tower from the patch embedding on, adapters or
  not. :data:`INPUT_EMBEDDINGS` are the towers whose vision model returns a module there.

:func:`layer_norm` is the LayerNorm node every trainable tower records (SigLIP, Qwen3-VL, Llama 4).
A text-only step leaves an adapted tower unused: :func:`unused_adapters`.
"""

from __future__ import annotations

from typing import Any

from gpumem_gui.core.replay import adapters
from gpumem_gui.core.replay.autograd import Node
from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.spec.params import Tensor

# the towers whose vision model has input embeddings for enable_input_require_grads to hook (transformers
# 5.24, PreTrainedModel.get_input_embeddings / the model's own): SiglipVisionModel (patch_embedding, a
# Conv2d), Qwen2_5_VisionTransformerPretrainedModel (patch_embed), PixtralVisionModel (patch_conv),
# Llama4VisionModel (models/llama4/modeling_llama4.py get_input_embeddings: patch_embedding, the
# Llama4UnfoldConvolution); Qwen3VLVisionModel returns None (checked on the models built from
# tests/reference/vision/configs)
INPUT_EMBEDDINGS = ("siglip", "qwen2_5_vl", "pixtral", "llama4")


def layer_norm(s: Any, x: T, w: T, b: T, width: int) -> T:
    """nn.LayerNorm over rows of ``width`` (native_layer_norm, its output in the input's dtype under CPU
    autocast): saves its input, weight, bias and the fp32 mean and rstd."""
    rows = x.n // width
    out = s.new(x.n, x.dt)
    mean, rstd = s.new(rows, "f32"), s.new(rows, "f32")
    s.node("multi", (x, w, b), (out,), (x, w, b, mean, rstd))
    return out


def adapted(m: Any, x: T, result: T, name: str, n_out: int, n_in: int) -> T:
    """A tower linear's output ``result`` with PEFT's adapter added where ``name`` is a LoRA target."""
    if f"{name}.lora_A" not in m.p:
        return result
    return adapters.lora(m, x, result, name, n_out, n_in)


def input_hook(m: Any, hooked: bool, x: T) -> T:
    """``make_inputs_require_grads`` on an input embedding's output ``x`` under PEFT with checkpointing
    (``hooked``: the module is one that enable_input_require_grads finds, :data:`INPUT_EMBEDDINGS` for a
    vision model): a leaf that requires a gradient from then on, held by its AccumulateGrad node for as long
    as the graph lives (as :meth:`.model.CausalLM._first_hidden_states` does for a text model's embedding),
    its gradient accumulated at the end of the backward."""
    cfg, s = m.cfg, m.s
    if cfg.method == "full" or not cfg.grad_ckpt or not hooked or x.fn is not None or not s.grad_enabled:
        return x
    leaf = Node(s, "acc", (), ((x.n, x.dt),), (x.st,))
    leaf.seq = 1 << 62
    x.fn, x.idx = leaf, 0
    return x


def unused_adapters(m: Any, linears: tuple[Tensor, ...]) -> None:
    """A text-only LoRA step whose targets reach the tower (``linears``: the tower's and projector's, as far
    as lora_vision_tower reaches): PEFT's ``get_peft_model`` adapts them all the same (``lora_A`` /
    ``lora_B``, trainable), but no image reaches them, so they get no gradient and torch's optimizers no
    state (``torch/optim/adamw.py`` ``_init_group`` skips a parameter whose ``grad`` is None); flat-buffer
    frameworks give them room all the same (``replay/step.py`` ``StepOptions.states_for_unused``)."""
    for t in linears:
        if t.name in m.lora_names:
            adapters.add_lora(m, t)
            base = t.name[: -len(".weight")]
            m.unused.update((f"{base}.lora_A", f"{base}.lora_B"))
