"""Hub ids: the loader against a fake client, and the real client against a fake huggingface_hub module."""

from __future__ import annotations

import json
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpumem_gui.core import load_model
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hub import HubClient, looks_like_hub_id
from gpumem_gui.hub_client import HfHubClient
from tests.conftest import reference_dir

LLAMA_CFG = json.loads((reference_dir() / "configs" / "meta-llama__Llama-3.2-1B.json").read_text())
HEADERS = {
    "model.safetensors": {
        "model.embed_tokens.weight": {
            "dtype": "BF16",
            "shape": [128256, 2048],
            "data_offsets": [0, 525336576],
        },
        "model.norm.weight": {"dtype": "BF16", "shape": [2048], "data_offsets": [525336576, 525340672]},
    }
}


class FakeHub:
    def __init__(self, cfg: Mapping[str, Any], headers: Mapping[str, Any] | None) -> None:
        self.cfg, self.headers, self.calls = cfg, headers, 0

    def fetch_config(self, repo_id: str) -> Mapping[str, Any]:
        self.calls += 1
        return self.cfg

    def fetch_safetensors_headers(self, repo_id: str) -> Mapping[str, Mapping[str, Any]] | None:
        return self.headers


def test_fake_satisfies_protocol() -> None:
    assert isinstance(FakeHub({}, None), HubClient)


def test_hub_id_shapes() -> None:
    assert looks_like_hub_id("meta-llama/Llama-3.2-1B")
    assert not looks_like_hub_id("just-a-name")
    assert not looks_like_hub_id("a/b/c")
    assert not looks_like_hub_id("../etc")


def test_load_from_hub_with_fake_client() -> None:
    fake = FakeHub(LLAMA_CFG, HEADERS)
    m = load_model("someorg/some-llama", hub_client=fake)
    assert m.source_kind == "hub"
    assert m.params is not None and m.params.total == 1235814400
    assert m.weights is not None
    assert m.weights.bytes_by_dtype == {"BF16": 525340672}


def test_hub_without_safetensors() -> None:
    m = load_model("someorg/some-llama", hub_client=FakeHub(LLAMA_CFG, None))
    assert m.weights is None and m.params is not None


def _fake_module(tmp_path: Path, *, fail: Exception | None = None) -> types.ModuleType:
    mod = types.ModuleType("huggingface_hub")
    cfg_file = tmp_path / "downloaded-config.json"
    cfg_file.write_text(json.dumps(LLAMA_CFG))

    def hf_hub_download(repo_id: str, filename: str) -> str:
        if fail:
            raise fail
        return str(cfg_file)

    def get_safetensors_metadata(repo_id: str) -> Any:
        if fail:
            raise fail
        tensors = {
            n: types.SimpleNamespace(dtype=t["dtype"], shape=t["shape"], data_offsets=t["data_offsets"])
            for n, t in HEADERS["model.safetensors"].items()
        }
        return types.SimpleNamespace(
            files_metadata={"model.safetensors": types.SimpleNamespace(tensors=tensors)}
        )

    mod.hf_hub_download = hf_hub_download  # type: ignore[attr-defined]
    mod.get_safetensors_metadata = get_safetensors_metadata  # type: ignore[attr-defined]
    return mod


def test_real_client_fetches_and_caches(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    client = HfHubClient(cache_dir=cache, hub_module=_fake_module(tmp_path))
    m = load_model("meta-llama/Llama-3.2-1B-fake", hub_client=client)
    assert m.params is not None and m.params.total == 1235814400
    assert (cache / "meta-llama__Llama-3.2-1B-fake" / "config.json").is_file()
    assert (cache / "meta-llama__Llama-3.2-1B-fake" / "safetensors_headers.json").is_file()
    # then offline: the cached copy answers
    offline = HfHubClient(cache_dir=cache, hub_module=_fake_module(tmp_path, fail=OSError("network down")))
    m2 = load_model("meta-llama/Llama-3.2-1B-fake", hub_client=offline)
    assert m2.params == m.params and m2.weights == m.weights


class GatedRepoError(Exception):
    pass


@pytest.mark.parametrize(
    ("exc", "words"),
    [(OSError("unreachable"), "cannot be reached"), (GatedRepoError("401"), "gated")],
)
def test_real_client_errors_are_clear(tmp_path: Path, exc: Exception, words: str) -> None:
    client = HfHubClient(cache_dir=tmp_path / "c", hub_module=_fake_module(tmp_path, fail=exc))
    with pytest.raises(GpumemInputError, match=words):
        load_model("org/not-cached", hub_client=client)


def test_missing_extra_is_a_clear_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpumem_gui.hub_client as hc

    def no_module(name: str) -> types.ModuleType:
        raise ImportError(name)

    monkeypatch.setattr(hc.importlib, "import_module", no_module)
    with pytest.raises(GpumemInputError, match=r"gpumem\[hub\]"):
        load_model("org/name", hub_client=HfHubClient(cache_dir=tmp_path))


def test_hub_model_type_the_readers_do_not_know() -> None:
    """With the standard fields: an approximate generic decoder. With recurrent state: refused for an estimate
    (one line naming the field), kept with its config for trace mode."""
    cfg = {**LLAMA_CFG, "model_type": "not_a_real_arch"}
    m = load_model("someorg/new-arch", hub_client=FakeHub(cfg, None))
    assert m.spec is not None and m.spec.approximate and "not modelled" in m.spec.approximate
    hybrid = {**cfg, "mamba_d_state": 16}
    with pytest.raises(GpumemInputError, match="mamba_d_state"):
        load_model("someorg/new-arch", hub_client=FakeHub(hybrid, None))
    m = load_model("someorg/new-arch", hub_client=FakeHub(hybrid, None), unknown_architecture_ok=True)
    assert m.spec is None and m.config is not None and m.config["model_type"] == "not_a_real_arch"
    assert any("trace" in n or "model_type" in n for n in m.notes)
