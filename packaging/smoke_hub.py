"""The smoke test's Hub checks (``packaging/smoke_test.py``): the frozen ``gpumem`` reads Hub ids.

huggingface_hub is bundled (a default dependency): offline, a Hub id that nothing has cached is one line that
says it is offline (never "needs pip install", never a traceback or huggingface_hub's retry warnings); with a
Hub to talk to (``tests/hub_server.py``, a stand-in on 127.0.0.1 reached through ``HF_ENDPOINT``) the frozen
program fetches config.json and the safetensors header and prints the same JSON as the source install, and
afterwards answers from its cache with ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from smoke_checks import CLI_TIMEOUT_S, Bundle, json_differences, run  # noqa: E402

from tests.hub_server import serve_hub  # noqa: E402
from tests.safetensors_files import LLAMA, header_json, raw_file  # noqa: E402

# a Hub id that is not in the catalog (the catalog would answer without the Hub)
NOT_CACHED = "hub-smoke/not-in-the-catalog"
TINY_REPO = "hub-smoke/tiny-llama"
# a llama config matching tests/safetensors_files.LLAMA (vocab 32, hidden 16, 4 heads of 4, 2 KV heads)
TINY_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 32,
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}


def _one_offline_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, f"exit {r.returncode} (want 2): {r.stderr[-600:]}"
    assert len(lines) == 1, f"{len(lines)} lines on stderr (want one): {r.stderr[-600:]}"
    line = lines[0]
    assert line.startswith("gpumem: error: ") and "offline" in line, f"not an offline message: {line}"
    assert "pip install" not in line, f"the frozen app says to install something: {line}"
    return line


def hub_offline(b: Bundle) -> str:
    """HF_HUB_OFFLINE=1, and (separately) a Hub whose host does not answer: one line each, at once."""
    r = run(
        [str(b.gpumem), "inspect", NOT_CACHED], {**b.env, "HF_HUB_OFFLINE": "1"}, b.scratch, CLI_TIMEOUT_S
    )
    line = _one_offline_line(r)
    assert "HF_HUB_OFFLINE" in line, line
    # port 9 on the loopback address: nothing listens there (the discard service is never enabled)
    unreachable = {**b.env, "HF_ENDPOINT": "http://127.0.0.1:9"}
    _one_offline_line(run([str(b.gpumem), "inspect", NOT_CACHED], unreachable, b.scratch, CLI_TIMEOUT_S))
    return line[:110]


def hub_client(b: Bundle) -> str:
    """The frozen client against a local Hub stand-in: the same JSON as the source install, then cached."""
    header, size = header_json(LLAMA)
    repos = {
        TINY_REPO: {
            "config.json": json.dumps(TINY_CONFIG).encode(),
            "model.safetensors": raw_file(header, size),
        }
    }
    command = ["inspect", TINY_REPO, "--json"]
    with serve_hub(repos) as (url, log):
        frozen_env = {**b.env, "HF_ENDPOINT": url, "HOME": str(b.scratch / "hub-home")}
        frozen = run([str(b.gpumem), *command], frozen_env, b.scratch, CLI_TIMEOUT_S)
        assert frozen.returncode == 0, f"frozen: exit {frozen.returncode}: {frozen.stderr[-800:]}"
        assert not frozen.stderr.strip(), f"frozen printed on stderr: {frozen.stderr[-400:]}"
        source_env = {**b.env, "HF_ENDPOINT": url, "HOME": str(b.scratch / "hub-home-source")}
        source = run([str(b.source_gpumem), *command], source_env, b.scratch, CLI_TIMEOUT_S)
        assert source.returncode == 0, f"source install: exit {source.returncode}: {source.stderr[-800:]}"
        requests = len(log)
    x, y = json.loads(frozen.stdout), json.loads(source.stdout)
    diffs = json_differences(x, y)
    assert not diffs, "frozen and source differ: " + "; ".join(diffs[:5])
    assert x["source_kind"] == "hub" and x["weights_bytes_by_dtype"], x.get("weights_bytes_by_dtype")
    cached = run([str(b.gpumem), *command], {**frozen_env, "HF_HUB_OFFLINE": "1"}, b.scratch, CLI_TIMEOUT_S)
    assert cached.returncode == 0, f"offline from the cache: exit {cached.returncode}: {cached.stderr[-400:]}"
    assert json.loads(cached.stdout) == x, "the cached answer differs from the online one"
    return f"{x['params']['total']} params, {x['weights_bytes_by_dtype']} in {requests} requests; then cached"
