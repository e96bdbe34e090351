"""The built-in catalogs (``resources/models.json``, ``resources/gpus.json``) and their look-ups."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers import catalog
from gpumem_gui.core.readers.catalog import (
    find_gpu,
    find_model,
    load_gpu_catalog,
    load_model_catalog,
    resources_dir,
    search_models,
)
from gpumem_gui.core.readers.hf_config import load_config_file
from gpumem_gui.core.spec.params import count_params
from tests.conftest import REPO, reference_dir

MiB = 2**20
MODELS = load_model_catalog()
GPUS = load_gpu_catalog()


def _raw(name: str) -> dict:
    return json.loads((resources_dir() / name).read_text(encoding="utf-8"))


@pytest.fixture
def fresh_caches() -> Iterator[None]:
    """Catalog loads are cached; tests that swap the resource folder start and end with empty caches."""
    catalog.load_model_catalog.cache_clear()
    catalog.load_gpu_catalog.cache_clear()
    yield
    catalog.load_model_catalog.cache_clear()
    catalog.load_gpu_catalog.cache_clear()


# ---- the model catalog -------------------------------------------------------------------------------


def test_model_catalog_loads_every_entry() -> None:
    raw = _raw("models.json")
    assert raw["format"] == "gpumem-model-catalog" and raw["version"] == 1
    assert len(MODELS) == len(raw["models"]) >= 40
    for m in MODELS:
        assert m.spec.name == m.id
        assert m.spec.provenance.kind == "catalog" and m.spec.provenance.source == m.source
        assert m.source.startswith("https://huggingface.co/") and m.published_params_source
        assert m.moe == (m.spec.moe is not None)
        assert not m.source_verified or m.verified_from


def test_model_ids_are_unique() -> None:
    ids = [e["id"].lower() for e in _raw("models.json")["models"]]
    assert len(ids) == len(set(ids))
    short = [i.split("/", 1)[1] for i in ids]
    assert len(short) == len(set(short)), "find_model also matches the id without its organisation"


def test_catalog_covers_the_families_asked_for() -> None:
    families = {m.family for m in MODELS}
    for f in (
        "Llama 2",
        "Llama 3.1",
        "Qwen2.5",
        "Qwen3",
        "Gemma 3",
        "Mixtral",
        "DeepSeek-V3",
        "Phi-3",
        "GPT-2",
    ):
        assert f in families
    assert sum(m.moe for m in MODELS) >= 5
    assert any(m.spec.vision is not None for m in MODELS)
    assert any(m.spec.mla is not None for m in MODELS)


@pytest.mark.parametrize("entry", MODELS, ids=[m.id for m in MODELS])
def test_count_matches_the_published_figure(entry: catalog.CatalogModel) -> None:
    total = count_params(entry.spec).total
    rel = abs(total - entry.published_params) / entry.published_params
    assert rel <= entry.published_params_precision, (
        f"{entry.id}: exact {total:,} vs published {entry.published_params:,} ({rel:.3%} > "
        f"{entry.published_params_precision:.3%}); source {entry.published_params_source}"
    )


def _reference_entries() -> list[tuple[catalog.CatalogModel, Path]]:
    ref = reference_dir()
    out = []
    for m in MODELS:
        cfg = ref / "configs" / (m.id.replace("/", "__") + ".json")
        if cfg.is_file():
            out.append((m, cfg))
    return out


REFERENCE = reference_dir()
REF_ENTRIES = _reference_entries()


@pytest.mark.skipif(
    not (REFERENCE / "groundtruth.json").is_file(),
    reason=f"no reference data at {REFERENCE} (set GPUMEM_REFERENCE or add shared/reference)",
)
@pytest.mark.parametrize(("entry", "config"), REF_ENTRIES, ids=[m.id for m, _ in REF_ENTRIES])
def test_reference_models_are_exact(entry: catalog.CatalogModel, config: Path) -> None:
    truth = json.loads((REFERENCE / "groundtruth.json").read_text())["static"][config.stem]
    assert count_params(entry.spec).total == truth["total_params"]
    # the catalog spec is the one the reference config.json gives
    from_file = load_config_file(config)
    exclude = {"name", "provenance"}
    assert entry.spec.model_dump(exclude=exclude) == from_file.model_dump(exclude=exclude)


EXTRA = REPO / "tests" / "reference" / "extra" / "groundtruth_extra.json"


def _extra_totals() -> list[tuple[catalog.CatalogModel, int]]:
    if not EXTRA.is_file():
        return []
    static = json.loads(EXTRA.read_text())["static"]
    key = {m.id.replace("/", "__"): m for m in MODELS}
    return [(key[name], st["total_params"]) for name, st in static.items() if name in key]


EXTRA_TOTALS = _extra_totals()


@pytest.mark.skipif(not EXTRA_TOTALS, reason=f"no extra reference counts at {EXTRA}")
@pytest.mark.parametrize(("entry", "total"), EXTRA_TOTALS, ids=[m.id for m, _ in EXTRA_TOTALS])
def test_extra_reference_counts_are_exact(entry: catalog.CatalogModel, total: int) -> None:
    """More catalog models whose architecture transformers itself counted (tests/reference/extra)."""
    assert count_params(entry.spec).total == total


def test_reference_models_are_in_the_catalog() -> None:
    if not (REFERENCE / "configs").is_dir():
        pytest.skip(f"no reference configs at {REFERENCE}")
    assert len(REF_ENTRIES) >= 20
    assert all(m.source_verified for m, _ in REF_ENTRIES)


def test_find_model() -> None:
    m = find_model("meta-llama/Llama-3.1-8B")
    assert m is not None and count_params(m.spec).total == 8_030_261_248
    assert find_model("llama-3.1-8b") is m
    assert find_model("  META-LLAMA/LLAMA-3.1-8B ") is m
    for e in MODELS:
        assert find_model(e.short_name) is e
    assert find_model("Llama-3.1") is None
    assert find_model("") is None
    assert find_model("definitely/not-a-model") is None


def test_search_models() -> None:
    qwen3 = search_models("qwen3")
    assert qwen3 and all("qwen3" in m.id.lower() for m in qwen3)
    assert [m.id for m in search_models("QWEN3 32b")] == ["Qwen/Qwen3-32B"]
    assert {m.family for m in search_models("Llama 3.1")} == {"Llama 3.1"}
    assert search_models("") == list(MODELS)
    assert search_models("no such model") == []


# ---- the GPU catalog ---------------------------------------------------------------------------------


def test_gpu_catalog_loads_every_entry() -> None:
    raw = _raw("gpus.json")
    assert raw["format"] == "gpumem-gpu-catalog" and raw["version"] == 1
    assert len(GPUS) == len(raw["gpus"]) >= 25
    for g in GPUS:
        assert g.memory_bytes > 0 and g.source.startswith("https://") and g.memory_source and g.memory_nominal
        if g.memory_kind == "driver" and g.vendor == "nvidia":
            # nvidia-smi reports whole MiB
            assert g.memory_bytes % MiB == 0
        assert g.bandwidth_bytes_per_s is None or g.bandwidth_bytes_per_s > 10**11
    assert {g.vendor for g in GPUS} == {"nvidia", "amd"}


def _key(name: str) -> str:
    return re.sub(r"[\s_\-]+", "-", name.strip().lower())


def test_gpu_names_and_aliases_are_unique() -> None:
    names = [_key(n) for e in _raw("gpus.json")["gpus"] for n in (e["id"], *e.get("aliases", []))]
    assert len(names) == len(set(names))


def test_gpu_memory_figures() -> None:
    # driver-reported totals (nvidia-smi MiB), see each entry's memory_source
    assert find_gpu("H100-80GB").memory_bytes == 81559 * MiB
    assert find_gpu("A100-SXM4-80GB").memory_bytes == 81920 * MiB
    assert find_gpu("RTX-4090").memory_bytes == 24564 * MiB
    assert find_gpu("H200").memory_bytes == 143771 * MiB
    for g in GPUS:
        # usable memory never exceeds the nominal capacity read as GiB, and is within 10 % of it
        m = re.match(r"(\d+) GB", g.memory_nominal)
        assert m, g.memory_nominal
        nominal = int(m.group(1)) * 2**30
        assert 0.9 * nominal <= g.memory_bytes <= nominal * 1.001 + 2**30, g.id


def test_find_gpu() -> None:
    h100 = find_gpu("H100-SXM-80GB")
    assert find_gpu("h100-80gb") is h100
    assert find_gpu("H100") is h100
    assert find_gpu("h100 80gb") is h100
    assert find_gpu(" H100_SXM_80GB ") is h100
    assert find_gpu("rtx 4090").id == "RTX-4090"
    assert find_gpu("mi300x").vendor == "amd"


def test_unknown_gpu_lists_close_matches() -> None:
    with pytest.raises(GpumemInputError) as e:
        find_gpu("H100-80G")
    assert "unknown GPU 'H100-80G'" in str(e.value) and "H100-SXM-80GB" in str(e.value)
    with pytest.raises(GpumemInputError, match="unknown GPU 'quantum-9000'") as e:
        find_gpu("quantum-9000")
    assert "did you mean" not in str(e.value)


# ---- resources and broken catalogs -------------------------------------------------------------------


def test_resources_dir_is_the_top_level_folder_in_a_source_checkout() -> None:
    d = resources_dir()
    assert (d / "models.json").is_file() and (d / "gpus.json").is_file()


def test_resources_dir_prefers_the_packaged_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "resources").mkdir()
    monkeypatch.setattr(catalog, "files", lambda package: tmp_path)
    assert resources_dir() == tmp_path / "resources"


def _install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, doc: object) -> Path:
    for f in ("models.json", "gpus.json"):
        (tmp_path / f).write_text((resources_dir() / f).read_text(encoding="utf-8"), encoding="utf-8")
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    monkeypatch.setattr(catalog, "resources_dir", lambda: tmp_path)
    return path


def test_broken_model_entry_names_file_and_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_caches: None
) -> None:
    doc = _raw("models.json")
    doc["models"][3]["spec"]["hidden_size"] = -1
    path = _install(tmp_path, monkeypatch, "models.json", doc)
    with pytest.raises(GpumemInputError) as e:
        load_model_catalog()
    msg = str(e.value)
    assert str(path) in msg and f"models[3] ({doc['models'][3]['id']})" in msg and "hidden_size" in msg


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d["models"][0].pop("published_params"), "published_params"),
        (lambda d: d["models"][0]["spec"].update(name="x"), "spec.name"),
        (lambda d: d["models"][0]["spec"].update(bogus=1), "bogus"),
        (lambda d: d["models"][1].update(id=d["models"][0]["id"]), "already used"),
        (lambda d: d["models"][0].update(moe=True), "moe"),
        (lambda d: d.update(version=2), "version"),
        (lambda d: d.update(models=[]), "non-empty"),
    ],
)
def test_model_catalog_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_caches: None, change, words: str
) -> None:
    doc = _raw("models.json")
    change(doc)
    path = _install(tmp_path, monkeypatch, "models.json", doc)
    with pytest.raises(GpumemInputError, match=re.escape(words)) as e:
        load_model_catalog()
    assert str(path) in str(e.value)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d["gpus"][2].update(memory_bytes=0), "memory_bytes"),
        (lambda d: d["gpus"][2]["aliases"].append(d["gpus"][0]["id"]), "already used"),
        (lambda d: d["gpus"][2].pop("compute_capability"), "compute_capability"),
        (lambda d: d["gpus"][2].update(vendor="intel"), "vendor"),
        (lambda d: d.update(format="something-else"), "format"),
    ],
)
def test_gpu_catalog_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_caches: None, change, words: str
) -> None:
    doc = _raw("gpus.json")
    change(doc)
    path = _install(tmp_path, monkeypatch, "gpus.json", doc)
    with pytest.raises(GpumemInputError, match=re.escape(words)) as e:
        load_gpu_catalog()
    assert str(path) in str(e.value)


def test_malformed_catalog_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_caches: None) -> None:
    path = _install(tmp_path, monkeypatch, "gpus.json", "{not json")
    with pytest.raises(GpumemInputError, match="malformed JSON") as e:
        load_gpu_catalog()
    assert str(path) in str(e.value)
