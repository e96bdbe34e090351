"""Ollama's own server lines about a GPU's memory (its runner's lines are llama.cpp's: llamacpp.py).

Sources (ollama/ollama; sizes by ``format.HumanBytes2``: "%.1f GiB|MiB|KiB" of 2^30 / 2^20 / 2^10, "N B"):

* ``discover/types.go`` (``LogDetails``): ``msg="inference compute" id=GPU-... library=cuda ...
  name=... [description="NVIDIA ..."] total="T" available="F"``, one line per GPU at startup: the GPU's total
  and free memory as the driver reports them (older releases print the GPU's name in ``name``, newer ones the
  device, "CUDA0", and the name in ``description``);
* the scheduler's ``msg="offload to cuda"`` / ``msg=offload library=cuda`` line of releases before the
  llama-server runner: ``memory.available="[F0 F1 ...]"``, the free memory of each GPU it considers (in
  order), followed by ``memory.required.*`` / ``memory.weights.*`` / ``memory.graph.*``: Ollama's own
  estimate of the model, not a measurement, so not read (named in unread).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpumem_gui.core.observed.draft import MAX_LINE_CHARS, Draft

_SIZE = r"(\d+(?:\.\d+)?) (GiB|MiB|KiB|B)"
_COMPUTE = re.compile(
    r'msg="inference compute"(.{0,1000}?)\btotal="' + _SIZE + r'" available="' + _SIZE + '"'
)
_FIELD = re.compile(r'\b(id|name|description)=("[^"]{0,200}"|\S{1,200})')
_DEVICE = re.compile(r"^(?:CUDA|ROCm|Vulkan)(\d{1,4})$")
_OFFLOAD = re.compile(r'msg="?offload\b.{0,400}?memory\.available="\[([^\]]{0,2000})\]"')
_LIST_SIZE = re.compile(_SIZE)


def find(text: str) -> Iterator[tuple[int, Draft]]:
    """Every GPU an Ollama server line describes: (offset of the line, record)."""
    offset = 0
    for raw in text.splitlines(keepends=True):
        start, offset = offset, offset + len(raw)
        if len(raw) > MAX_LINE_CHARS or "msg=" not in raw:
            continue
        if (m := _COMPUTE.search(raw)) is not None:
            yield start, _compute(m, raw)
        elif (m := _OFFLOAD.search(raw)) is not None:
            yield from ((start, d) for d in _offload(m, raw))


def _compute(m: re.Match[str], raw: str) -> Draft:
    fields = {k: v.strip('"') for k, v in _FIELD.findall(m.group(1))}
    d = Draft(source_format="ollama", excerpt=raw, gpu_name=fields.get("description") or fields.get("name"))
    if (device := _DEVICE.match(fields.get("name", ""))) is not None:
        d.gpu_index = int(device.group(1))
        d.gpu_name = fields.get("description")
    d.size("total_bytes", m.group(2), m.group(3), "Ollama total")
    d.size("free_bytes", m.group(4), m.group(5), "Ollama available")
    return d


def _offload(m: re.Match[str], raw: str) -> list[Draft]:
    drafts = []
    for n, size in enumerate(_LIST_SIZE.finditer(m.group(1))):
        d = Draft(source_format="ollama", excerpt=raw)
        d.size("free_bytes", size.group(1), size.group(2), f"Ollama memory.available[{n}]")
        d.unread.append(f"which GPU: the line lists free memory by position ({n}), not by CUDA index")
        d.unread.append("memory.required / weights / graph: Ollama's own estimate of the model, not read")
        drafts.append(d)
    return drafts
