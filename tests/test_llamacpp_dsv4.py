"""llama.cpp's DeepSeek-V4 cache (``core/runtimes/llamacpp_dsv4.py``, src/llama-kv-cache-dsv4.cpp at
035aa95): the raw sliding cache, the CSA / HCA / indexer caches and the compressor states at the byte,
against a published start-up log and the source's arithmetic; their placement with -ngl and -nkvo."""

from __future__ import annotations

import json

from gpumem_gui.core import estimate_inference
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.runtimes import llamacpp_dsv4 as ld
from gpumem_gui.core.runtimes.inference import make_run
from tests.conftest import REPO

EXTRA = REPO / "tests" / "reference" / "extra"
FLASH = json.loads((EXTRA / "compressed_cache.json").read_text())["configs"][
    "deepseek-ai__DeepSeek-V4-Flash-Base"
]
MIB = 1 << 20


def _spec():
    return spec_from_config(FLASH, name="flash")


def _run(**kw):
    base = {"engine": "llama.cpp", "seq": 64_000, "kv_dtype": "bf16", "n_batch": 4096, "n_ubatch": 4096}
    return make_run(**(base | kw))


def test_published_start_up_log() -> None:
    """ggml-org/llama.cpp issue #27680 (DeepSeek-V4-Flash on CUDA, n_ctx_seq 64000, 1/1 seqs, bf16 K,
    n_ubatch 4096): "creating SWA KV cache, size = 4352 cells", "CUDA0 KV buffer size = 182.75 MiB (4352
    cells, 43 layers", "csa state buffer size = 1.31 MiB ... state = 8 x 1024, ... layers = 21", "hca state
    buffer size = 10.00 MiB ... state = 128 x 512, ... layers = 20", "lid state buffer size = 0.33 MiB ...
    state = 8 x 256, ... layers = 21"."""
    got = ld.caches(_spec(), _run(), "bf16")
    layers = {k: len(v[0]) for k, v in got.items()}
    mib = {k: f"{len(v[0]) * v[1] / MIB:.2f}" for k, v in got.items()}
    assert layers["raw"] == 43 and got["raw"][1] == 4352 * 512 * 2
    assert mib["raw"] == "182.75"
    assert (mib["csa_state"], mib["hca_state"], mib["lid_state"]) == ("1.31", "10.00", "0.33")
    assert (layers["csa_state"], layers["hca_state"], layers["lid_state"]) == (21, 20, 21)


def test_compressed_caches_from_the_source() -> None:
    """The same run: CSA and indexer caches GGML_PAD(ceil(64000 / 4), 256) = 16,128 cells, HCA
    GGML_PAD(ceil(64000 / 128), 256) = 512 cells, K only (head_dim 512, index_head_dim 128)."""
    got = ld.caches(_spec(), _run(), "bf16")
    assert got["csa"][1] == 16_128 * 512 * 2 and got["lid"][1] == 16_128 * 128 * 2
    assert got["hca"][1] == 512 * 512 * 2
    q8 = ld.caches(_spec(), _run(), "q8_0")  # -ctk q8_0: 34 B per 32 elements
    assert q8["csa"][1] == 16_128 * 512 // 32 * 34


def test_streams_swa_full_and_placement() -> None:
    """One stream per sequence (-np 2 doubles every buffer); --swa-full keeps n_ctx_seq raw cells; the
    layers left on the CPU (-ngl) keep their part in host memory, all of it with -nkvo."""
    spec = _spec()
    one, two = ld.caches(spec, _run(), "bf16"), ld.caches(spec, _run(batch=2), "bf16")
    assert all(two[k][1] == 2 * one[k][1] for k in one)
    assert ld.caches(spec, _run(swa_full=True), "bf16")["raw"][1] == 64_000 * 512 * 2
    total = sum(len(v[0]) * v[1] for v in one.values())
    assert ld.kv_buffers(spec, _run(), 43, "bf16") == (total, 0)
    gpu, host = ld.kv_buffers(spec, _run(), 20, "bf16")  # layers 23..42 on the GPU
    assert gpu + host == total and gpu == sum(sum(i >= 23 for i in v[0]) * v[1] for v in one.values())
    assert ld.kv_buffers(spec, _run(kv_offload=False), 43, "bf16") == (0, total)


def test_estimate_uses_the_dsv4_cache() -> None:
    spec = _spec()
    est = estimate_inference(spec, _run())
    kv = next(c for c in est.components if c.key == "kv_cache")
    assert kv.bytes == ld.kv_buffers(spec, _run(), spec.num_layers, "bf16")[0]
    assert any("compute buffer" in w for w in est.warnings)
