"""Issue 32 "Measured": the published CUDA OOM reports that state their setup stay runnable, are read from
their verbatim messages, and section (j) of docs/validation.md renders from them.

The reports, their commands and what was assumed are in validation/data/published_ooms.json (each with the
issue it comes from); the messages in tests/reference/published_ooms/.
"""

from __future__ import annotations

import json
import sys

import pytest

from gpumem_gui.core import read_observed
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "validation"))  # validate_report is a package beside validate.py

from validate_report import data, published_ooms
from validate_report.common import REASON_THRESHOLD

GiB = 1 << 30
MiB = 1 << 20


@pytest.fixture(scope="module")
def rows() -> list[published_ooms.OomRow]:
    return published_ooms.published_oom_rows()


def test_at_least_fifteen_reports_each_with_a_fixture_and_a_source() -> None:
    reports = published_ooms.published_ooms().reports
    assert len(reports) >= 15
    for e in reports:
        assert (published_ooms.FIXTURES / e.fixture).read_text(encoding="utf-8").strip(), e.id
        assert e.url.startswith("https://github.com/"), e.id
    on_disk = {p.name for p in published_ooms.FIXTURES.glob("*.txt")}
    assert on_disk == {e.fixture for e in reports}, "a fixture no report names, or a report without one"


def test_every_command_parses_and_estimates(rows) -> None:  # type: ignore[no-untyped-def]
    assert [r.entry.id for r in rows] == [e.id for e in published_ooms.published_ooms().reports]
    for r in rows:
        assert r.ours > 0 and r.peak > 0 and r.weights > 0, r.entry.id
        assert r.peak <= r.ours, r.entry.id
        assert r.capacity > 0, r.entry.id


def test_the_command_runs_on_the_capacity_the_message_states(rows) -> None:  # type: ignore[no-untyped-def]
    stated = [r for r in rows if r.rec is not None and r.rec.total_bytes is not None]
    assert len(stated) >= 14
    for r in stated:
        assert r.rec is not None and r.rec.total_bytes is not None
        assert abs(r.capacity - r.rec.total_bytes) < MiB, f"{r.entry.id}: --gpu is not the message's total"


def test_each_message_is_read_by_read_observed(rows) -> None:  # type: ignore[no-untyped-def]
    unread = {r.entry.id for r in rows if r.rec is None}
    assert unread == {"vllm-2348"}  # a raw 'CUDA error: out of memory' states no figures
    for r in rows:
        if r.rec is not None:
            assert r.rec.requested_bytes, f"{r.entry.id}: the failed request"
            assert r.needed is not None and r.needed > r.rec.requested_bytes, r.entry.id


def test_what_the_run_held_is_this_runs_own_figure() -> None:
    """'this process has 0 bytes' (NVML sees nothing: WSL, containers) is no figure; one listed process is
    the process itself (another pid namespace); with two listed, only its own allocator figures count."""

    def held(fixture: str) -> tuple[int | None, str]:
        rec = read_observed((published_ooms.FIXTURES / fixture).read_text()).records[0]
        return published_ooms.held_by_run(rec)

    assert held("mistralfinetune69_mistral7b_lora_a10g.txt")[1] == "reserved"
    assert held("unsloth465_llama3_8b_qlora_t4.txt") == (round(10.95 * GiB), "the process it lists")
    assert held("vllm751_llama2_70b_tp2_h100.txt")[1] == "reserved"
    assert held("whatsappclone12_llama3_8b_qlora_torchtune.txt") == (round(13.87 * GiB), "this process")


def test_every_miss_carries_a_reason_and_no_reason_is_stale(rows) -> None:  # type: ignore[no-untyped-def]
    for r in rows:
        miss = not r.predicted or (r.gap is not None and r.gap < -REASON_THRESHOLD)
        assert bool(r.entry.reason) == miss, (
            f"{r.entry.id}: {'a miss without a reason' if miss else 'a reason for a report gpumem gets'}"
        )


def test_deepspeed_zero2_for_loop_adamw_failure_is_predicted(rows) -> None:  # type: ignore[no-untyped-def]
    """llamafactory-1221 (LLaMA 7B, DeepSpeed ZeRO-2, 8 x V100 32 GB): the failed 3.14 GiB is the for-loop
    AdamW's ``exp_avg_sq.sqrt()`` over this rank's flat fp32 partition (6.74e9 / 8 elements); sized over the
    partition (issue 31 item 4), not the largest parameter, the step does not fit and ours is above what the
    run held plus its request."""
    r = next(r for r in rows if r.entry.id == "llamafactory-1221")
    assert r.predicted and not r.entry.reason
    assert r.needed is not None and r.ours >= r.needed
    assert r.rec is not None and r.rec.requested_bytes is not None
    doc = published_ooms.estimate_doc(r.entry)
    temps = next(c for c in doc["components"] if c["key"] == "optimizer_temporaries")
    partition = 4 * 6_738_415_616 // 8  # fp32 bytes of one rank's partition (the model's trainable params)
    assert temps["bytes"] == 2 * partition  # exp_avg_sq.sqrt() and its quotient, live together
    assert abs(partition - r.rec.requested_bytes) < 0.005 * GiB  # the message's '3.14 GiB', rounded


def test_section_renders_a_row_per_report_and_its_summary(rows) -> None:  # type: ignore[no-untyped-def]
    lines: list[str] = []
    published_ooms.render_ooms(rows, lines.append)
    text = "\n".join(lines)
    assert text.startswith("## (j) Published CUDA out-of-memory reports")
    for r in rows:
        assert f"[{r.entry.id}]({r.entry.url})" in text
        assert f"`{r.entry.command}`" in text
    predicted = sum(r.predicted for r in rows)
    assert f"gpumem predicts {predicted} of the {len(rows)} failures" in text
    assert "{" not in text.split("| report | the setup")[0], "a reason template left unfilled"
    # inside the whole report (tests/test_validation_script.py renders it, section and summary line)


def test_a_bad_entry_is_one_line_naming_it(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    good = json.loads((data.DATA_DIR / published_ooms.DATA_FILE).read_text())
    bad = {**good, "reports": [{**good["reports"][0], "fixture": "missing.txt"}]}
    (tmp_path / published_ooms.DATA_FILE).write_text(json.dumps(bad))
    monkeypatch.setattr(data, "DATA_DIR", tmp_path)
    with pytest.raises(data.DataFileError) as err:
        data.load(published_ooms.DATA_FILE, published_ooms.PublishedOoms)
    assert "reports[0] (vllm-4408).fixture" in str(err.value) and "\n" not in str(err.value)


def test_a_command_that_stops_parsing_fails_naming_the_report() -> None:
    e = published_ooms.published_ooms().reports[0]
    broken = e.model_copy(
        update={"command": e.command.replace("--engine vllm", "--engine vllm --no-such-flag")}
    )
    with pytest.raises(data.DataFileError) as err:
        published_ooms.estimate_doc(broken)
    assert e.id in str(err.value) and "no-such-flag" in str(err.value)


def test_alpaca_223_is_predicted_with_the_trainers_no_sync() -> None:
    """Issue 31 item 4: Stanford Alpaca's 7B FSDP1 run on 5 x V100 (stanford_alpaca issue 223) ran 7 of its 8
    micro-batches under the Trainer's model.no_sync(), each rank keeping the whole model's unsharded fp16
    gradients (6.74e9 x 2 bytes). With that setting gpumem predicts the failure, above what the run held
    plus its request; with a sync on every micro-batch it would say the run fits."""
    (row,) = published_ooms.published_oom_rows({"alpaca-223"})
    assert "--grad-sync last" in row.entry.command and not row.entry.reason
    assert row.predicted and row.gap is not None and row.gap >= 0
    each = row.entry.model_copy(update={"command": row.entry.command.replace("last", "each")})
    doc = published_ooms.estimate_doc(each)
    assert doc["fit"]["fits"] and doc["per_gpu"][0]["total_bytes"] < row.needed  # type: ignore[operator]
    assert row.ours - doc["per_gpu"][0]["total_bytes"] > 6 * GiB  # unsharded fp16 minus fp32 shards: 7.5 GiB
