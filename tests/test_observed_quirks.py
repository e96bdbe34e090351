"""What a GPU said that is not a measurement: PyTorch prints "this process has 0 bytes memory in use" where
NVML gives no per-process figure (WSL, Windows WDDM, virtualised GPUs). Read as a figure it made every used
byte "other processes" and the diagnosis advised freeing memory no other process held."""

from __future__ import annotations

from pathlib import Path

from gpumem_gui.core import diagnose, read_observed

OOM = Path(__file__).parent / "reference" / "published_ooms" / "mistralfinetune69_mistral7b_lora_a10g.txt"


def test_zero_bytes_for_this_process_is_left_unread() -> None:
    o = read_observed(OOM.read_text()).records[0]
    assert "this process has 0 bytes" in OOM.read_text()
    assert o.process_bytes is None and not any(p.this_process for p in o.processes)
    assert o.allocated_bytes == round(20.52 * 2**30)
    assert sum("says 0 bytes" in line for line in o.unread) == 1
    assert not any("has no 'Including non-PyTorch memory" in line for line in o.unread)
    d = diagnose(o)
    keys = {p.key for p in d.parts}
    assert "other_processes" not in keys and "outside_pytorch_or_others" in keys
    assert not any("other processes hold" in line for line in d.causes.lines)
    assert not any("other processes" in c.description for c in d.changes)


def test_the_record_explained_first_is_the_last_failure_else_the_last_report() -> None:
    """One rule for the CLI's diagnose and the window's picker (core ``latest_record``)."""
    from gpumem_gui.core import ObservedMemory, latest_record

    plain = ObservedMemory(source_format="nvidia_smi_table", used_bytes=1)
    failed = ObservedMemory(source_format="torch_oom", requested_bytes=2)
    assert latest_record((plain, failed, plain)) == 1
    assert latest_record((failed, plain, failed, plain)) == 2
    assert latest_record((plain, plain)) == 1
