"""The Hub client offline and on bad cached files (gpumem_gui/hub_client.py), and the real huggingface_hub
against a local Hub stand-in (tests/hub_server.py) through the CLI.

Offline (``HF_HUB_OFFLINE=1``, or the Hub's host unreachable) with nothing cached is one line that says so
and what to do, at once (no retries); a cached JSON file that is huge, deeply nested, holds a 4,301-digit
integer or is not a regular file is one line too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from gpumem_gui.core import GpumemInputError, load_model
from gpumem_gui.hub_client import HfHubClient, probe_endpoint, read_json_capped
from tests.fuzz_strategies import DEEP_LIST, HUGE_INT
from tests.hub_server import serve_hub
from tests.safetensors_files import LLAMA, header_json, raw_file
from tests.test_fuzz_weights import TINY_CONFIG

REPO_ID = "someorg/not-cached"


class RecordingHub(types.ModuleType):
    """A stand-in huggingface_hub that records its calls and fails every request."""

    def __init__(self, offline: bool = False) -> None:
        super().__init__("huggingface_hub")
        self.calls: list[str] = []
        self.constants = types.SimpleNamespace(HF_HUB_OFFLINE=offline, ENDPOINT="http://127.0.0.1:9")

    def hf_hub_download(self, repo_id: str, filename: str, **kw: Any) -> str:
        self.calls.append(f"download {filename} {kw}")
        raise OSError("no network")

    def get_safetensors_metadata(self, repo_id: str) -> Any:
        self.calls.append("metadata")
        raise OSError("no network")


def _one_line(e: pytest.ExceptionInfo[GpumemInputError]) -> str:
    text = str(e.value)
    assert "\n" not in text and "pip install" not in text, text
    return text


def test_hf_hub_offline_is_one_line_saying_so(tmp_path: Path) -> None:
    hub = RecordingHub(offline=True)
    with pytest.raises(GpumemInputError) as e:
        load_model(REPO_ID, hub_client=HfHubClient(cache_dir=tmp_path, hub_module=hub))
    text = _one_line(e)
    assert "offline (HF_HUB_OFFLINE=1 is set)" in text and "unset it" in text and "catalog id" in text
    assert all("local_files_only" in c for c in hub.calls), hub.calls  # only its own cache was asked


def test_unreachable_hub_is_refused_before_any_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    hub = RecordingHub()
    client = HfHubClient(cache_dir=tmp_path, hub_module=hub, probe=lambda: "cannot resolve huggingface.co")
    with pytest.raises(GpumemInputError) as e:
        load_model(REPO_ID, hub_client=client)
    assert "offline (cannot resolve huggingface.co)" in _one_line(e) and "connect to the network" in str(
        e.value
    )
    assert not any(c.startswith("download config.json {}") for c in hub.calls)


def test_probe_names_what_failed() -> None:
    assert (
        probe_endpoint("http://127.0.0.1:9", timeout=2) == "cannot connect to 127.0.0.1: Connection refused"
    )
    assert (probe_endpoint("https://no-such-host.invalid", timeout=2) or "").startswith("cannot resolve")


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ('{"model_type": "llama", "hidden_size": ' + HUGE_INT + "}", "more than 4,300 digits"),
        ('{"x": ' + DEEP_LIST + "}", "nested too deeply"),
        ('{"model_type": ', "malformed JSON at line 1"),
        ("[1, 2]", "does not hold a JSON object"),
        (b"\xff\xfe{}", "not a UTF-8 text file"),
    ],
)
def test_a_bad_cached_config_is_one_line(tmp_path: Path, content: str | bytes, words: str) -> None:
    cached = tmp_path / REPO_ID.replace("/", "__") / "config.json"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(content if isinstance(content, bytes) else content.encode())
    client = HfHubClient(cache_dir=tmp_path, hub_module=RecordingHub(offline=True))
    with pytest.raises(GpumemInputError, match=words) as e:
        load_model(REPO_ID, hub_client=client)
    assert len(_one_line(e)) < 300


def test_cached_headers_must_be_header_objects(tmp_path: Path) -> None:
    folder = tmp_path / REPO_ID.replace("/", "__")
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG))
    (folder / "safetensors_headers.json").write_text('{"model.safetensors": [1, 2]}')
    client = HfHubClient(cache_dir=tmp_path, hub_module=RecordingHub(offline=True))
    with pytest.raises(GpumemInputError, match="not a JSON object of headers"):
        load_model(REPO_ID, hub_client=client)


def test_capped_reads_refuse_big_files_and_fifos(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 600 + "0]")
    with pytest.raises(GpumemInputError, match="larger than 0 MiB"):
        read_json_capped(big, 1000, "where")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # a FIFO nobody writes: opening it must not block
    with pytest.raises(GpumemInputError, match="not a regular file"):
        read_json_capped(fifo, 1000, "where")


# ---- the real huggingface_hub, through the CLI, against a local Hub ----------------------------------------


def _gpumem(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # a subprocess: huggingface_hub reads HF_ENDPOINT and HF_HUB_OFFLINE when it is imported
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from gpumem_gui.cli import main; sys.exit(main(sys.argv[1:]))",
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_real_client_reads_a_hub_then_its_cache(tmp_path: Path) -> None:
    header, size = header_json(LLAMA)
    repos = {
        "tiny-org/tiny-llama": {
            "config.json": json.dumps(TINY_CONFIG).encode(),
            "model.safetensors": raw_file(header, size),
        }
    }
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env |= {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "hf")}
    with serve_hub(repos) as (url, log):
        online = _gpumem(["inspect", "tiny-org/tiny-llama", "--json"], {**env, "HF_ENDPOINT": url})
        missing = _gpumem(["inspect", "tiny-org/nope"], {**env, "HF_ENDPOINT": url})
    assert online.returncode == 0 and not online.stderr.strip(), online.stderr[-800:]
    doc = json.loads(online.stdout)
    assert doc["source_kind"] == "hub" and doc["weights_bytes_by_dtype"] == {"BF16": 5888, "F32": 192}
    assert any("resolve/main/model.safetensors" in r for r in log)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no such repo" in missing.stderr
    offline = _gpumem(["inspect", "tiny-org/tiny-llama", "--json"], {**env, "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 0 and json.loads(offline.stdout) == doc, offline.stderr[-500:]


@pytest.mark.parametrize("setting", [{"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "http://127.0.0.1:9"}])
def test_offline_cli_is_one_line_without_retries(tmp_path: Path, setting: dict[str, str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"} | {"HOME": str(tmp_path), **setting}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    r = _gpumem(["inspect", "Qwen/Qwen3-8B-Base"], env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-800:]
    assert (
        r.stderr.startswith("gpumem: error: Qwen/Qwen3-8B-Base: offline (") and "pip install" not in r.stderr
    )
