"""Read what a GPU said: every report found in a pasted text (or a snapshot pickle), in text order.

:func:`read_observed` runs each format's reader over the text; a paste may hold several reports (an OOM
traceback and an ``nvidia-smi`` table): a record per report (per GPU for a table), in the order they start.
Text that holds no report is refused with one line saying what was expected. The input is bounded
(:data:`MAX_TEXT_CHARS`, :data:`MAX_RECORDS`) and each bound is named in its error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.observed import (
    llamacpp,
    nvidia_csv,
    nvidia_smi,
    ollama,
    sglang,
    snapshot,
    torch_oom,
    torch_stats,
    torch_summary,
    vllm,
)
from gpumem_gui.core.observed.draft import Draft
from gpumem_gui.core.observed.model import ObservedReport

# a pasted log of 4 Mi characters: far over any report; bounds the readers' time (tests/test_fuzz_observed.py)
MAX_TEXT_CHARS = 4 * 1024 * 1024
MAX_FILE_BYTES = 64 * 1024 * 1024  # a snapshot pickle of a long run is tens of MiB; bounds what is decoded
MAX_RECORDS = 1024  # the model's bound on records (observed/model.py, ObservedReport.records)

Finder = Callable[[str], Iterable[tuple[int, Draft]]]

# every format family's reader; each yields (offset in the text, record); observed/<family>.py says its source
FINDERS: tuple[Finder, ...] = (
    torch_oom.find,
    nvidia_smi.find,
    nvidia_csv.find,
    torch_summary.find,
    torch_stats.find,
    vllm.find,
    sglang.find,
    llamacpp.find,
    ollama.find,
)

EXPECTED = (
    "expected a GPU memory report: a PyTorch CUDA out-of-memory message, an nvidia-smi table or "
    "--query-gpu csv, torch.cuda.memory_summary() / memory_stats(), or a vLLM, SGLang, llama.cpp or Ollama "
    "memory line"
)


def read_observed(text: str) -> ObservedReport:
    """Every report in ``text``, in text order; :class:`GpumemInputError` when none is found."""
    if not isinstance(text, str):
        raise GpumemInputError(f"the observed text must be a string, not {type(text).__name__}")
    if len(text) > MAX_TEXT_CHARS:
        raise GpumemInputError(
            f"the text is {len(text):,} characters; gpumem reads at most {MAX_TEXT_CHARS:,} "
            "(paste the report, not the whole log)"
        )
    if not text.strip():
        raise GpumemInputError(f"the text is empty: {EXPECTED}")
    return report_from(_found(text))


def report_from(found: Iterable[tuple[int, Draft]]) -> ObservedReport:
    """The report from the readers' (offset, draft) pairs, sorted by offset; refuses none or too many."""
    drafts = sorted(found, key=lambda pair: pair[0])
    if not drafts:
        raise GpumemInputError(f"no memory report found: {EXPECTED}")
    if len(drafts) > MAX_RECORDS:
        raise GpumemInputError(
            f"the text holds {len(drafts):,} reports; gpumem reads at most {MAX_RECORDS:,} at once"
        )
    return ObservedReport(records=tuple(d.build() for _, d in drafts))


def _found(text: str) -> Iterator[tuple[int, Draft]]:
    for finder in FINDERS:
        for n, pair in enumerate(finder(text)):
            if n > MAX_RECORDS:  # enough to refuse; stop reading more of a hostile paste
                break
            yield pair


def read_observed_bytes(data: bytes) -> ObservedReport:
    """A file's bytes: a ``torch.cuda.memory._snapshot()`` pickle (by its magic) or UTF-8 text."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise GpumemInputError(f"the observed file must be bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_FILE_BYTES:
        raise GpumemInputError(f"the file is {len(data):,} bytes; gpumem reads at most {MAX_FILE_BYTES:,}")
    if snapshot.is_snapshot_pickle(data):
        return report_from(snapshot.records(snapshot.load_plain(data)))
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise GpumemInputError(
            f"the file is neither UTF-8 text nor a memory snapshot pickle (byte {e.start:,}): {EXPECTED}"
        ) from None
    return read_observed(text)


def observed_file_bytes(path: str | Path) -> bytes:
    """A report file's bytes, read to one past :data:`MAX_FILE_BYTES` (the readers' bound names it; a device
    such as /dev/zero does not hang); a folder, a missing or unreadable file is one line naming it."""
    p = Path(path)
    try:
        folder = p.is_dir()
        data = b"" if folder else _read_at_most(p)
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        why = e.strerror if isinstance(e, OSError) and e.strerror else "not a path"
        raise GpumemInputError(f"cannot read it: {why}", source=str(path)) from None
    if folder:
        raise GpumemInputError("is a folder; give the file the report is in", source=str(path))
    return data


def _read_at_most(p: Path) -> bytes:
    with p.open("rb") as f:
        return f.read(MAX_FILE_BYTES + 1)


def read_observed_file(path: str | Path) -> ObservedReport:
    """:func:`read_observed_bytes` of a report file, errors naming the file."""
    data = observed_file_bytes(path)
    try:
        return read_observed_bytes(data)
    except GpumemInputError as e:
        raise GpumemInputError(e.message, source=str(path)) from None
