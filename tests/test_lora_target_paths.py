"""LoRA targets as PEFT takes them (issue 33 item 8): a dotted end of a module's path (``self_attn.q_proj``)
and one regex over the whole path (``re:...``), as ``peft/tuners/tuners_utils.py``
``check_target_module_exists`` matches them; checked against PEFT itself on the real (meta-device) model."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core import GpumemInputError, load_model
from gpumem_gui.core.replay import adapters
from gpumem_gui.core.replay.model import model_tensors
from gpumem_gui.core.training import estimate_training, make_training_run
from tests.conftest import reference_dir

CONFIG = reference_dir() / "configs" / "Qwen__Qwen3-0.6B.json"
RANK = 8

# (gpumem's lora_targets, PEFT's target_modules)
CASES = [
    ("self_attn.q_proj,v_proj", ["self_attn.q_proj", "v_proj"]),
    ("layers.1.self_attn.q_proj,mlp.down_proj", ["layers.1.self_attn.q_proj", "mlp.down_proj"]),
    (
        r"re:model\.layers\.(0|2)\.(self_attn|mlp)\.(q|gate)_proj",
        r"model\.layers\.(0|2)\.(self_attn|mlp)\.(q|gate)_proj",
    ),
    (r"re:.*\.[kv]_proj", r".*\.[kv]_proj"),
]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    cfg = json.loads(CONFIG.read_text()) | {"num_hidden_layers": 3}
    path = tmp_path_factory.mktemp("qwen3") / "config.json"
    path.write_text(json.dumps(cfg))
    return cfg, load_model(str(path)).spec


def _ours(spec, targets: str) -> int:
    run = make_training_run(method="lora", lora_targets=targets, lora_rank=RANK)
    shapes = {t.name: t.shape for t in model_tensors(spec)}
    chosen = adapters.lora_targets(spec, model_tensors(spec), run.lora_targets)
    return sum(RANK * (shapes[n][0] + shapes[n][1]) for n in chosen)


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize(("ours", "peft_targets"), CASES)
def test_trainable_parameters_equal_peft(small, ours: str, peft_targets) -> None:
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    cfg, spec = small
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    lora = peft.get_peft_model(model, peft.LoraConfig(r=RANK, target_modules=peft_targets))
    trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert _ours(spec, ours) == trainable


def test_paths_change_the_estimate_and_a_miss_names_the_paths(small) -> None:
    _, spec = small
    one = estimate_training(spec, make_training_run(method="lora", lora_targets="layers.0.self_attn.q_proj"))
    every = estimate_training(spec, make_training_run(method="lora", lora_targets="q_proj"))
    assert one.peak_bytes < every.peak_bytes
    with pytest.raises(GpumemInputError) as e:
        estimate_training(spec, make_training_run(method="lora", lora_targets=r"re:transformer\.h\..*"))
    assert e.value.field == "lora_targets" and "model.layers.0.self_attn.q_proj" in str(e.value)


@pytest.mark.parametrize("bad", ["re:(", "re:(a+)+$", "a..b", "q_proj,re:.*"])
def test_bad_targets_are_one_line_naming_the_field(bad: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        make_training_run(method="lora", lora_targets=bad)
    assert e.value.field == "lora_targets" and "\n" not in str(e.value)


def test_a_config_string_with_regex_characters_is_peft_regex(tmp_path) -> None:
    from gpumem_gui.core.imports.registry import import_file

    path = tmp_path / "axolotl.yml"
    path.write_text("base_model: Qwen/Qwen3-0.6B\nadapter: lora\nlora_target_modules: '.*\\.(q|v)_proj'\n")
    assert import_file(str(path)).run.lora_targets == (r"re:.*\.(q|v)_proj",)


def test_the_copied_config_gives_peft_the_regex_as_one_string() -> None:
    from gpumem_gui.core.training.command import training_command

    run = make_training_run(method="lora", lora_targets=r"re:.*\.(q|v)_proj")
    assert r"target_modules='.*\\.(q|v)_proj'" in training_command("Qwen3-0.6B", run)


MOE = reference_dir() / "configs" / "Qwen__Qwen3-30B-A3B.json"
_SMALL_MOE = {
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 1024,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@pytest.fixture(scope="module")
def small_moe(tmp_path_factory):
    cfg = json.loads(MOE.read_text()) | _SMALL_MOE
    path = tmp_path_factory.mktemp("qwen3moe") / "config.json"
    path.write_text(json.dumps(cfg))
    return cfg, load_model(str(path)).spec


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize(
    ("ours", "peft_targets"), [("gate", ["gate"]), ("q_proj,mlp.gate", ["q_proj", "mlp.gate"])]
)
def test_the_moe_router_as_a_target_equals_peft(small_moe, ours: str, peft_targets) -> None:
    """transformers 5's Qwen3MoeTopKRouter is no nn.Linear: PEFT 0.21 wraps its weight in a ParamWrapper with
    lora_A [r, hidden] and lora_B [experts, r]."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    cfg, spec = small_moe
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    lora = peft.get_peft_model(model, peft.LoraConfig(r=RANK, target_modules=peft_targets))
    trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert _ours(spec, ours) == trainable


def test_a_targeted_router_saves_its_merged_weight(small_moe) -> None:
    """ParamWrapper: F.linear runs on W + (B @ A) * scaling, a bf16 copy of the router weight per MoE layer,
    saved for backward."""
    _, spec = small_moe
    run = {"method": "lora", "precision": "bf16", "lora_rank": RANK, "seq": 64}
    q = estimate_training(spec, make_training_run(**run, lora_targets="q_proj"))
    both = estimate_training(spec, make_training_run(**run, lora_targets="q_proj,gate"))
    fwd = both.phases["forward"].peak_bytes - q.phases["forward"].peak_bytes
    layers, experts, hidden = spec.num_layers, 8, 256
    adapters_bytes = layers * RANK * (hidden + experts) * 4  # fp32 adapters (bf16 precision keeps them fp32)
    merged = layers * experts * hidden * 2
    assert fwd >= adapters_bytes + merged


@pytest.mark.parametrize("targets", [r"re:.*\.q_proj", "q_proj,gate"])
def test_path_and_router_targets_match_pytorchs_trace(tmp_path, targets: str) -> None:
    """The real model with PEFT's adapters under FakeTensorMode, counted by PyTorch's MemTracker: a regex
    target and a targeted router (ParamWrapper's merged weight) give the replay's peak."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from gpumem_gui.trace import trace

    (tmp_path / "config.json").write_text(json.dumps(json.loads(MOE.read_text()) | _SMALL_MOE))
    model = load_model(str(tmp_path))
    run = make_training_run(method="lora", lora_targets=targets, precision="bf16", seq=512)
    rep = trace(model, run, use_cache=False)
    assert rep.peak.estimated_bytes == pytest.approx(rep.peak.traced_bytes, rel=1e-4)
