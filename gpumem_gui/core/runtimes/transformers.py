"""The transformers runtime: ``from_pretrained`` + ``generate()`` on PyTorch, replayed op by op.

Phases: ``load`` (the weights in the run's format and the model's buffers); ``prefill`` (one forward over
the prompt, :func:`~gpumem_gui.core.replay.forward.replay_forward`); ``decode`` (the last generation step:
one token after ``seq + new_tokens - 1`` cached, while ``generate()`` holds the previous step's fp32 scores).
``peak_bytes`` is the largest live-tensor total over the phases on the most-loaded GPU (what
``torch.cuda.max_memory_allocated()`` reports); ``total_bytes`` adds the CUDA context, the cuBLAS workspace,
NCCL's buffers under tensor parallelism and the caching allocator's reserve
(:mod:`gpumem_gui.core.results.overheads`).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats import WeightBytes, get_weight_format, kv_bytes_per_element
from gpumem_gui.core.gpu_memory import GpuMemory
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.forward import KINDS, ForwardResult, replay_forward
from gpumem_gui.core.replay.static_cache import static_cache_refusal
from gpumem_gui.core.replay.vision import has_tower as _has_tower
from gpumem_gui.core.replay.vision import image_tokens
from gpumem_gui.core.results.estimate import Component, Estimate, Explanation, GpuShare, Phase, tp_ranks
from gpumem_gui.core.results.nontorch import CommGroup, NonTorch
from gpumem_gui.core.results.overheads import stage_share
from gpumem_gui.core.runtimes.base import Runtime, load_phase
from gpumem_gui.core.runtimes.cross_attention import cross_cache_component
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.runtimes.seq2seq import seq2seq_phases
from gpumem_gui.core.spec.kinds import STATE_MIXERS
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.kv import has_compressed_cache
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.parallel import Degrees, rank_spec
from gpumem_gui.core.spec.params import count_params
from gpumem_gui.core.spec.state import state_facts

_REPLAY_DTYPES = {"bf16": "bf16", "fp16": "f16", "fp32": "f32"}
_TORCH_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}
# an encoder's task head -> the Auto class that loads it
_AUTO_CLASSES = {
    "sequence_classification": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
    "masked_lm": "AutoModelForMaskedLM",
}
_KIND_LABELS = {
    "kv_cache": "KV cache",
    "hidden_states": "hidden states",
    "attention": "attention temporaries",
    "mlp": "MLP temporaries",
    "norm": "norm temporaries",
    "logits": "logits",
    "rope": "rotary tables",
    "mask": "attention mask",
    "inputs": "input ids",
    "recurrent_state": "recurrent state (conv + linear-attention state)",
    "vision": "vision tower (images)",
    "dequantized weights": "dequantized 4-bit weights",
}
_KIND_KEYS = {"dequantized weights": "dequantized_weights"}  # the key training's breakdown uses too


@lru_cache(maxsize=4096)
def _kind_explanation(kind: str, where: str, dt_label: str) -> Explanation:
    """How the bytes of one kind at the peak were found; one shared (immutable) instance per kind, place and
    dtype, as every estimate with its peak there explains them the same way."""
    return Explanation(
        formula=f"{_KIND_LABELS[kind]} live at the peak ({where}), from an op-by-op replay of the "
        "transformers forward",
        inputs={"where": where, "dtype": dt_label},
        source="transformers 5.24 modeling code replayed on symbolic tensors (gpumem_gui.core.replay); "
        "checked against PyTorch MemTracker traces (tests/reference/trace)",
    )


def _kind_components(sim: ForwardResult, dt_label: str, static: int = 0) -> list[Component]:
    out = []
    for kind in KINDS:
        n = sim.by_kind.get(kind, 0)
        if not n:
            continue
        key = (
            kind if kind in ("kv_cache", "logits", "recurrent_state") else _KIND_KEYS.get(kind, f"act_{kind}")
        )
        static_kv = static and kind == "kv_cache"
        out.append(
            Component(
                key=key,
                label="KV cache (static, pre-allocated)" if static_kv else _KIND_LABELS[kind],
                bytes=n,
                explain=_static_explanation(static, sim.where)
                if static_kv
                else _kind_explanation(kind, sim.where, dt_label),
            )
        )
    return out


def _static_explanation(length: int, where: str) -> Explanation:
    """The static cache's entry: allocated whole for max_cache_len tokens (replay/static_cache.py)."""
    return Explanation(
        formula="batch x (K + V elements per token) x max_cache_len x bytes, summed over the layers "
        "initialised by this point of the forward (all of them after the prefill); max_cache_len = prompt + "
        "new tokens - 1, allocated by each layer's first update and written in place",
        inputs={"max_cache_len": length, "where": where},
        source="transformers 5.24 cache_utils.py StaticLayer.lazy_initialization / update; "
        "generation/utils.py _prepare_cache_for_generation (max_cache_length = max_length - 1)",
    )


def _generate_scores(run: InferenceRun, vocab: int) -> Component:
    """generate(): ``next_token_logits = logits[:, -1].to(copy=True, dtype=float32)`` and the processed scores
    of the previous step stay alive through the next forward (``generation/utils.py`` ``_sample``)."""
    return Component(
        key="generate_logits",
        label="generate() fp32 scores",
        bytes=2 * run.batch * vocab * 4,
        explain=Explanation(
            formula="2 x batch x vocab x 4 B: fp32 copy of the last logits, processed scores",
            inputs={"batch": run.batch, "vocab": vocab},
            source="transformers generation/utils.py _sample()",
        ),
    )


def _fixed_side_note(spec: ModelSpec, images: int) -> str:
    """A fixed-size tower's processor resizes every image (spec/vision.py ``fixed_side``): image_size is
    not used."""
    side = spec.vision.tower.fixed_side if images and spec.vision and spec.vision.tower else 0
    return (
        f"; every image resized to {side} px by the model's processor (image_size not used)" if side else ""
    )


def _check_compressed(run: InferenceRun) -> None:
    """What transformers runs DeepSeek-V4 with (modeling_deepseek_v4.py DeepseekV4PreTrainedModel): eager
    attention only (_supports_flash_attn = False: head_dim 512 is above FlashAttention's 256; sdpa falls back
    to eager), its own cache layers in the activation dtype (a quantized cache has no compressor state), and
    the forward replayed on one GPU."""
    if run.attn == "flash":
        raise GpumemInputError(
            "DeepSeek-V4 has no FlashAttention path in transformers (_supports_flash_attn = False): eager",
            field="attn",
        )
    if run.kv_dtype_resolved != run.compute_dtype:
        raise GpumemInputError(
            "DeepSeek-V4's cache layers (DeepseekV4HCACache / DeepseekV4CSACache) keep the compressor state "
            f"in the activation dtype; kv_dtype must be auto or {run.compute_dtype}",
            field="kv_dtype",
        )
    if run.tp > 1 or run.pp > 1:
        raise GpumemInputError(
            "DeepSeek-V4's forward is replayed on one GPU only in transformers (tp 1, pp 1)", field="tp"
        )


class Transformers(Runtime):
    name = "transformers"
    label = "transformers (PyTorch)"
    model_kinds = frozenset({"decoder", "hybrid", "encoder", "encoder-decoder"})
    state_mixers = STATE_MIXERS  # the state of every mixer, measured from its cache (spec/state.py)
    cross_attention_cache = True
    mixed_head_shapes = True
    compressed_attention = True  # DeepSeek-V4's forward replayed with its own cache (replay/dsv4.py)

    def quantizes_experts(self, run: InferenceRun) -> bool:
        """bitsandbytes replaces only ``nn.Linear``: fused 3-D expert tensors stay 16-bit (bitsandbytes
        issue #1849)."""
        return get_weight_format(run.weights).family != "bitsandbytes" if run.weights != "file" else True

    def check(self, spec: ModelSpec, run: InferenceRun) -> list[str]:
        if run.attn == "flash" and run.compute_dtype == "fp32":
            raise GpumemInputError("flash attention needs fp16 or bf16 activations", field="attn")
        if run.cache_implementation == "static" and (why := static_cache_refusal(spec)):
            raise GpumemInputError(
                f"cache_implementation static: modelled for decoders whose layers all attend fully; {why}",
                field="cache_implementation",
            )
        if has_compressed_cache(spec):
            _check_compressed(run)
        return []

    def _stage(
        self, spec: ModelSpec, run: InferenceRun, degrees: Degrees, stage: int, wb: WeightBytes
    ) -> tuple[dict[str, Phase], int, int]:
        """The phases of TP rank 0 of pipeline stage ``stage``, its weights' bytes and its logical cache."""
        rspec = rank_spec(spec, degrees, stage)
        weights, load = load_phase(spec, run, self.quantizes_experts(run), degrees, stage, wb)
        if model_kinds(spec).model == "encoder-decoder":  # generate() (runtimes/seq2seq.py)
            phases, cache = seq2seq_phases(spec, run, weights, load)
            return phases, weights.bytes, cache
        last_stage = stage == run.pp - 1
        kvb = kv_bytes_per_element(run.kv_dtype_resolved)
        dt = _REPLAY_DTYPES[run.compute_dtype]
        # bitsandbytes 4-bit linears dequantize their weight per matmul (replay/adapters.py linear4bit)
        bnb = run.compute_dtype if run.bnb_compute_dtype == "auto" else run.bnb_compute_dtype
        fmt = None if run.weights == "file" else get_weight_format(run.weights)
        bnb4 = (
            _REPLAY_DTYPES[bnb] if fmt is not None and fmt.family == "bitsandbytes" and fmt.bits < 8 else None
        )
        # a vision tower's images: their tokens join the prompt, the tower runs on the first stage
        # (replay/vision.py); nothing without a replayed tower
        image_tok = image_tokens(spec, run.images, run.image_size) if _has_tower(spec) else 0
        images = run.images if image_tok and stage == 0 else 0
        fwd = ReplayConfig(
            batch=run.batch,
            q=run.seq + image_tok,
            images=images,
            image_size=run.image_size if images else 0,
            param_dt=dt,
            attn=run.attn,
            logits_to_keep=0 if run.logits == "all" else 1,
            kv_bytes=kvb,
            lm_head=last_stage,
            weights_counted=False,
            bnb4_compute=bnb4,
        )
        # a static cache (replay/static_cache.py): max_cache_len = max_length - 1 = prompt + new tokens - 1
        static = (
            run.seq + image_tok + max(run.new_tokens - 1, 0) if run.cache_implementation == "static" else 0
        )
        fwd = replace(fwd, static_len=static)
        pre = replay_forward(rspec, fwd)
        # the images' keys and values in the cross-attention layers (runtimes/cross_attention.py)
        cross = [c] if (c := cross_cache_component(rspec, run, kvb)) is not None else []
        held = sum(c.bytes for c in cross)
        phases = {
            "load": load,
            "prefill": Phase(
                name="prefill",
                peak_bytes=weights.bytes + pre.peak + held,
                components=(weights, *_kind_components(pre, run.compute_dtype, static), *cross),
                note=f"peak at {pre.where}{_fixed_side_note(spec, images)}",
            ),
        }
        logical = pre.kv_cache_logical
        if run.new_tokens > (1 if static else 0):  # generate()'s last step (a static cache: its last slot)
            past = static - 1 if static else run.tokens + image_tok - 1
            step = ReplayConfig(
                batch=run.batch,
                q=1,
                past=past,
                param_dt=dt,
                attn=run.attn,
                logits_to_keep=1,
                kv_bytes=kvb,
                lm_head=last_stage,
                weights_counted=False,
                bnb4_compute=bnb4,
                static_len=static,
            )
            dec = replay_forward(rspec, step)
            extra = [_generate_scores(run, rspec.vocab_size)] if last_stage else []
            extra += cross
            phases["decode"] = Phase(
                name="decode",
                peak_bytes=weights.bytes + dec.peak + sum(c.bytes for c in extra),
                components=(weights, *_kind_components(dec, run.compute_dtype, static), *extra),
                note=f"last step: 1 token after {past} cached; peak at {dec.where}",
            )
            logical = dec.kv_cache_logical  # the cache after the generation (DeepSeek-V4: not monotonic)
        return phases, weights.bytes, logical + held

    def estimate(
        self,
        spec: ModelSpec,
        run: InferenceRun,
        warnings: tuple[str, ...],
        gpu: GpuMemory | None,
        wb: WeightBytes,
    ) -> Estimate:
        shares: list[tuple[GpuShare, dict[str, Phase]]] = []
        kv_logical = 0
        degrees = Degrees(tp=run.tp, pp=run.pp, ep=run.ep)
        for stage in range(run.pp):
            phases, weight_bytes, logical = self._stage(spec, run, degrees, stage, wb)
            kv_logical = max(kv_logical, logical)
            peak_phase = max(phases.values(), key=lambda p: p.peak_bytes)
            shares.append((stage_share(stage, run.tp, peak_phase, weight_bytes, _nontorch(run)), phases))
        worst_share, worst_phases = max(shares, key=lambda s: s[0].total_bytes)
        peak_phase = max(worst_phases.values(), key=lambda p: p.peak_bytes)
        return Estimate(
            mode="inference",
            engine=self.name,
            phases=worst_phases,
            peak_phase=peak_phase.name,
            peak_bytes=worst_share.peak_bytes,
            total_bytes=worst_share.total_bytes,
            components=worst_share.components,
            per_gpu=tp_ranks((s for s, _ in shares), run.tp),
            kv_cache_bytes=kv_logical,
            warnings=warnings,
            facts={
                "params_total": count_params(spec).total,
                "gpus": run.gpus,
                **({"task": spec.encoder.head} if spec.encoder is not None else {}),  # an encoder's head
                **({"seq2seq": True} if model_kinds(spec).model == "encoder-decoder" else {}),
                # linear-attention layers' fixed state (spec/state.py); nothing for other models
                **state_facts(spec, run.batch, run.dt, kv_bytes_per_element(run.kv_dtype_resolved)),
            },
        )

    def command(self, model: str, run: InferenceRun, est: Estimate) -> str:
        auto = _AUTO_CLASSES.get(str(est.facts.get("task")), "AutoModelForCausalLM")  # an encoder's head
        auto = "AutoModelForSeq2SeqLM" if est.facts.get("seq2seq") else auto  # runtimes/seq2seq.py
        return (
            f"{auto}.from_pretrained({model!r}, dtype={_TORCH_DTYPES[run.compute_dtype]}, "
            f"attn_implementation={run.attn!r}, device_map='auto')"
        )


def _nontorch(run: InferenceRun) -> NonTorch:
    """One inference process per GPU: one cuBLAS workspace (generate() runs on the main thread and the
    default stream); tensor parallelism (transformers' ``tp_plan``, one process per GPU under torchrun)
    all-reduces over a ``tp`` communicator, while pipeline stages are ``device_map`` layers of one process
    (no NCCL)."""
    groups = (CommGroup(name="tp", ranks=run.tp),) if run.tp > 1 else ()
    return NonTorch(
        gpu_arch=run.gpu_arch,
        context_mib=run.cuda_context_mib,
        groups=groups,
        nccl_channels=run.nccl_channels,
    )


TRANSFORMERS = Transformers()
