"""SGLang's DeepSeek-V4 pools (``core/runtimes/sglang_dsv4.py``, sglang main 003fca8): the configurator's
bytes per full token, the request-scoped ratio-128 state, the pool sizes and the buffers at the byte, against
SGLang's own arithmetic on worked examples, published start-up log lines and a published allocation table;
the estimate that uses them; what SGLang's path refuses."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core import estimate_inference, load_model
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.catalog import find_gpu, find_model
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.runtimes import sglang_dsv4 as s4
from gpumem_gui.core.runtimes.inference import make_run
from tests.conftest import REPO

EXTRA = REPO / "tests" / "reference" / "extra"
FLASH = json.loads((EXTRA / "compressed_cache.json").read_text())["configs"][
    "deepseek-ai__DeepSeek-V4-Flash-Base"
]
GIB = 1 << 30


def _shape() -> s4.Dsv4Shape:
    return s4.shape(spec_from_config(FLASH, name="flash"))


def test_shape_of_flash() -> None:
    """DeepSeek-V4-Flash: 43 layers (2 sliding only, 21 CSA, 20 HCA), 448 + 64 head split, 584 B entries
    (DeepSeekV4SingleKVPool asserts 448 + 64 x 2 + 8), 132 B indexer keys."""
    sh = _shape()
    assert (sh.layers, sh.csa, sh.hca, sh.nope, sh.rope, sh.window) == (43, 21, 20, 448, 64, 128)
    assert (sh.entry, sh.indexer_entry) == (584, 132)


# Published SGLang start-up logs, "DSV4 memory calculation: bytes_per_full_token=7705.45, ..." with the
# default fp32 compressor state (e.g. DeepSeek-V4-Flash-0731-w4a8 on four Ascend NPUs, 2026-08-10: stored
# public log, index id 57615238133; the same figure in 57382202304 and 57616064554), and 7033.45 from a run
# with SGLANG_DSV4_COMPRESS_STATE_DTYPE=bf16 (a published reproduction script quoting its run's
# sglang_dsv4.log, index id 57363862497). No URL is kept in the index for these files.
def test_bytes_per_full_token_as_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    assert f"{_shape().bytes_per_full_token(0.1):.2f}" == "7705.45"
    monkeypatch.setattr(s4, "STATE_BYTES", 2)  # SGLANG_DSV4_COMPRESS_STATE_DTYPE=bf16
    assert f"{_shape().bytes_per_full_token(0.1):.2f}" == "7033.45"


def test_c128_state_as_logged() -> None:
    """The same NPU log: ``max_running_requests=4`` gives "c128_state_fixed=0.07 GB" (GB = 2^30 B there):
    5 slots x 128 + 129 rows padded to 896, x 2 x 512 x 4 B, x 20 HCA layers."""
    sh = _shape()
    assert sh.c128_state_bytes(5) == 896 * 4096 * 20
    assert f"{sh.c128_state_bytes(5) / GIB:.2f}" == "0.07"


def test_pool_sizes_as_logged() -> None:
    """The same log at page 128 (the NPU's page): "DSV4 memory calculation: ... available_bytes=1.57 GB,
    c128_state_fixed=0.07 GB, full_token=209280", "DSV4 pool sizes: full=209280, swa=20864, c4=52320,
    c128=1635, c4_state=1304", then --max-total-tokens 32768: "full=32768, swa=3200, c4=8192, c128=256,
    c4_state=200"."""
    sh = _shape()
    got = s4.sizes(sh, 209_280, 0.1, 128, 5)
    assert (got.full, got.swa, got.c4, got.c128, got.c4_state) == (209_280, 20_864, 52_320, 1635, 1304)
    capped = s4.sizes(sh, 32_768, 0.1, 128, 5)
    assert (capped.full, capped.swa, capped.c4, capped.c128, capped.c4_state) == (
        32_768,
        3200,
        8192,
        256,
        200,
    )
    # the logged available bytes are rounded to 0.01 GiB: 209,280 lies in the band they allow
    lo, hi = (int((a * GIB - sh.c128_state_bytes(5)) / sh.bytes_per_full_token(0.1)) for a in (1.565, 1.575))
    assert lo // 128 * 128 <= 209_280 <= hi // 128 * 128


def test_compress_state_rows_as_published() -> None:
    """sgl-project/sglang PR #40337 (2026-09-19), measured on a GPU with the production CompressStatePool:
    swa_tokens 262,144 and 524,288 without speculative decoding (ring 8) allocate 16,396 and 32,780 rows
    (``swa // 128 x 8 + 8 + 1``, padded to 4)."""
    sh = _shape()
    for swa, rows in ((262_144, 16_396), (524_288, 32_780)):
        assert s4._state_rows(swa // sh.window * s4.RING[4], 4) == rows


def test_buffers_at_the_byte() -> None:
    """A worked example from the source: full 32,768 at page 256, 256 running requests (257 slots)."""
    sh = _shape()
    s = s4.sizes(sh, 32_768, 0.1, 256, 257)
    assert (s.swa, s.c4, s.c128, s.c4_state, s.c128_state) == (3072, 8192, 256, 192, 257 * 128)
    got = s4.buffers(sh, s, 256)
    assert got == {
        "swa": 43 * 13 * 149_760,  # (3072 + 257) // 256 pages of 256 x 584 B padded to 260 x 576
        "csa": 21 * 129 * 37_440,  # (8192 + 65) // 64 pages of 64 entries, 65 x 576 B
        "hca": 20 * 129 * 1728,  # (256 + 3) // 2 pages of 2 entries, 3 x 576 B
        "indexer": 21 * 129 * 64 * 132,  # 256 x 32 keys in pages of 64
        "csa_state": 21 * 204 * 4 * (512 + 128) * 4,  # 192 + 9 rows padded to 204, two states
        "hca_state": 20 * 33_152 * 2 * 512 * 4,  # 257 x 128 + 129 rows padded to 33,152
    }


def test_estimate_on_eight_h200() -> None:
    """DeepSeek-V4-Flash on 8 x H200 in SGLang: SGLang's defaults (page 256, fp8_e4m3, 256 requests,
    SWA ratio 0.1), max_total_num_tokens from the rest after the weights less the c128 state, the KV
    component the pools' bytes."""
    entry = find_model("deepseek-ai/DeepSeek-V4-Flash-Base")
    assert entry is not None
    run = make_run(engine="sglang", tp=8, seq=2048)
    est = estimate_inference(entry.spec, run, find_gpu("H200").gpu_memory)
    f, sh = est.facts, _shape()
    assert (f["page_size"], f["max_running_requests"], f["swa_full_tokens_ratio"]) == (256, 256, 0.1)
    weights = next(c for c in est.components if c.key == "weights").bytes
    free, frac = int(f["pre_load_free_bytes"]), float(f["mem_fraction_static"])  # type: ignore[call-overload]
    usable = int(free * frac - weights) - sh.c128_state_bytes(257)
    assert f["max_total_num_tokens"] == int(usable / sh.bytes_per_full_token(0.1)) // 256 * 256
    s = s4.sizes(sh, int(f["max_total_num_tokens"]), 0.1, 256, 257)  # type: ignore[call-overload]
    assert f["swa_max_total_num_tokens"] == s.swa
    assert f["kv_pool_bytes"] == sum(s4.buffers(sh, s, 256).values())
    assert any("fp8_e4m3" in w for w in est.warnings)  # auto: SGLang's fp8_e4m3, said once
    assert "DSV4PoolConfigurator" in str(f["swa_pool"])
    capped = estimate_inference(
        entry.spec,
        make_run(engine="sglang", tp=8, seq=2048, max_total_tokens=100_000),
        find_gpu("H200").gpu_memory,
    )
    assert capped.facts["max_total_num_tokens"] == 99_840  # whole pages of 256
    assert capped.facts["tokens_before_max_total_tokens"] == f["max_total_num_tokens"]


def test_without_a_gpu_the_pool_holds_the_batch() -> None:
    entry = find_model("deepseek-ai/DeepSeek-V4-Flash-Base")
    assert entry is not None
    est = estimate_inference(entry.spec, make_run(engine="sglang", tp=8, seq=1000, batch=3))
    assert est.facts["max_total_num_tokens"] == 3072  # 3 x 1000 in whole pages of 256


@pytest.mark.parametrize(
    ("change", "field"),
    [({"kv_dtype": "bf16"}, "kv_dtype"), ({"kv_dtype": "fp8_e5m2"}, "kv_dtype"), ({"pp": 2}, "pp")],
)
def test_sglang_refuses_what_it_cannot_run(change: dict, field: str) -> None:
    spec = spec_from_config(FLASH, name="flash")
    with pytest.raises(GpumemInputError) as e:
        estimate_inference(spec, make_run(engine="sglang", tp=8, seq=64, **change))
    assert e.value.field == field and "\n" not in str(e.value)


def test_page_size_is_sglangs_and_tiny_heads_are_refused() -> None:
    spec = spec_from_config(FLASH, name="flash")
    est = estimate_inference(spec, make_run(engine="sglang", tp=8, seq=64, page_size=64))
    assert est.facts["page_size"] == 256 and any("--page-size 256" in w for w in est.warnings)
    tiny = load_model(str(EXTRA / "configs" / "synthetic__deepseek_v4-tiny.json")).spec
    with pytest.raises(GpumemInputError) as e:  # DeepSeekV4SingleKVPool asserts 584 B entries
        estimate_inference(tiny, make_run(engine="sglang", seq=64))
    assert e.value.field == "model" and "584" in str(e.value) and "\n" not in str(e.value)
