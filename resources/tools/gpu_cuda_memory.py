"""Writes each GPU's CUDA total (``cuda_memory_bytes``) into ``resources/gpus.json``.

``memory_bytes`` is the total nvidia-smi (NVML) reports; vLLM, SGLang, llama.cpp and PyTorch budget on the
total CUDA reports (``cudaMemGetInfo`` / ``torch.cuda.mem_get_info()[1]``, equal to
``cudaDeviceProp.totalGlobalMem`` that ``torch.cuda.get_device_properties(i).total_memory`` prints), which
leaves out what the driver reserves
(``nvidia-smi -q`` "FB Memory Usage / Reserved"). PUBLISHED holds the figures found in public files (through
the gpumem search index: its ``find_string`` ids); every other entry is derived by the rule of
``gpumem_gui.core.readers.catalog.derived_cuda_bytes`` (the median reserved share of the published cards of
the same architecture family), and its ``cuda_memory_source`` says so.

Run from the repository root: ``python resources/tools/gpu_cuda_memory.py`` (rewrites gpus.json in place).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MiB = 1 << 20
GiB = 1 << 30


def _gib(x: float) -> int:
    """A figure printed in GiB with two decimals, to the nearest whole MiB (it is known to +-5 MiB)."""
    return round(x * GiB / MiB) * MiB


# (bytes, source). torch prints total_memory in MiB ("MB" in its repr is total_memory / 2^20); its OOM
# message ("GPU 0 has a total capacity of X GiB") prints cudaMemGetInfo's total in GiB with two decimals.
PUBLISHED: dict[str, tuple[int, str]] = {
    "H100-SXM-80GB": (
        81089 * MiB,
        "81089 MiB: median of torch.cuda.get_device_properties(0).total_memory on 'NVIDIA H100 80GB HBM3' "
        "(81082, 81089, 81090 MiB; find_string ids 16920867219, 43466784132, 53763892014); vLLM logs "
        "total_gpu_memory 79.22 GiB (validation/data/engine_logs/vllm.json); the driver's reserve "
        "varies by driver version (nvidia-smi -q Reserved 328-551 MiB, ids 23243314046, 60269138900)",
    ),
    "H100-PCIe-80GB": (
        81008 * MiB,
        "81008 MiB: torch.cuda.get_device_properties total_memory on 'NVIDIA H100 PCIe' (find_string id "
        "33356850601)",
    ),
    "H200-SXM-141GB": (
        143156 * MiB,
        "143156 MiB: torch.cuda.get_device_properties total_memory on 'NVIDIA H200' (find_string id "
        "2097843420); torch OOM messages 'total capacity of 139.80 GiB' on H200 (ids 68960789045, "
        "47349552184)",
    ),
    "B200-180GB": (
        _gib(178.36),
        "178.36 GiB: torch OOM 'GPU 5 has a total capacity of 178.36 GiB' in a run list on 8x B200 "
        "(find_string id 47349552184)",
    ),
    "A100-80GB": (
        _gib(79.15),
        "79.15 GiB: torch OOM 'GPU 0 has a total capacity of 79.15 GiB' with nvidia-smi '0MiB / 81920MiB' "
        "on the same page (find_string id 12686617020; the same figure in ids 69504446189, 58593559756)",
    ),
    "A100-40GB": (
        40536 * MiB,
        "40536 MiB: total_memory of 'A100-SXM4-40GB' (Paddle's get_device_properties, cudaDeviceProp."
        "totalGlobalMem as torch's; find_string id 15187234989)",
    ),
    "L40S": (
        45589 * MiB,
        "45589 MiB: torch.cuda.get_device_properties total_memory on 'NVIDIA L40S' (find_string id "
        "22161947869); vLLM 0.10.2 logs 'Free memory on device (43.93/44.42 GiB)' on an L40S "
        "(validation/data/engine_logs/vllm.json, id 38962983769)",
    ),
    "A10G": (
        22587 * MiB,
        "22587 MiB: torch.cuda.get_device_properties total_memory on 'NVIDIA A10G' (find_string id "
        "67234836605)",
    ),
    "A40": (
        45416 * MiB,
        "45416 MiB: torch.cuda.get_device_properties total_memory on 'NVIDIA A40' (find_string id "
        "31224020222)",
    ),
    "T4": (
        15102 * MiB,
        "15102 MiB: median of ten torch.cuda.get_device_properties total_memory prints on 'Tesla T4' "
        "(14930-15109 MiB; find_string ids 38205499461, 27278034639, 20237628113, 29453122987, 4574323283)",
    ),
    "V100-16GB": (
        16160 * MiB,
        "16160 MiB: torch.cuda.get_device_properties total_memory on 'Tesla V100-SXM2-16GB' (find_string "
        "ids 18215037660, 3846184127, 37216869158)",
    ),
    "RTX-A6000": (
        48676 * MiB,
        "48676 MiB: torch.cuda.get_device_properties total_memory on 'NVIDIA RTX A6000' (find_string id "
        "11265254500)",
    ),
    "RTX-4090": (
        _gib(23.64),
        "23.64 GiB: torch OOM 'total capacity of 23.64 GiB' on an RTX 4090 (find_string ids 67233294023, "
        "70153872234, the latter with nvidia-smi's 24564 MiB beside it)",
    ),
    "RTX-3090": (
        24259 * MiB,
        "24259 MiB: torch.cuda.get_device_properties total_memory on 'NVIDIA GeForce RTX 3090' (find_string "
        "id 31224020222); torch OOM 'total capacity of 23.69 GiB' on RTX 3090 (ids 13177228156, 63597397677)",
    ),
    "RTX-3060-12GB": (
        12044 * MiB,
        "12044 MiB: torch.cuda.get_device_properties total_memory on 'NVIDIA GeForce RTX 3060' (find_string "
        "id 31224020222)",
    ),
    "MI300X": (
        _gib(191.98),
        "191.98 GiB: torch (ROCm) OOM 'GPU 0 has a total capacity of 191.98 GiB' on MI300X (find_string ids "
        "61935719682, 56916239378); hipMemGetInfo leaves out only ~20 MiB of rocm-smi's total",
    ),
}


def main() -> None:
    from gpumem_gui.core.readers.catalog import RESERVE_RULE, derived_cuda_bytes, family

    path = ROOT / "resources" / "gpus.json"
    doc = json.loads(path.read_text())
    shares: dict[str, list[float]] = {}
    for g in doc["gpus"]:
        if g["id"] in PUBLISHED:
            b, _ = PUBLISHED[g["id"]]
            shares.setdefault(family(g["arch"]), []).append(1 - b / g["memory_bytes"])
    for i, g in enumerate(doc["gpus"]):
        if g["id"] in PUBLISHED:
            b, src = PUBLISHED[g["id"]]
            new = {"cuda_memory_bytes": b, "cuda_memory_kind": "published", "cuda_memory_source": src}
        else:
            b, share, basis = derived_cuda_bytes(g["memory_bytes"], g["arch"], shares)
            src = f"{RESERVE_RULE}: {share * 100:.3f} % of {g['memory_bytes'] // MiB} MiB ({basis})"
            new = {"cuda_memory_bytes": b, "cuda_memory_kind": "derived", "cuda_memory_source": src}
        kept = {k: v for k, v in g.items() if not k.startswith("cuda_memory_")}
        keys = list(kept)
        at = keys.index("memory_source") + 1
        doc["gpus"][i] = {k: kept[k] for k in keys[:at]} | new | {k: kept[k] for k in keys[at:]}
    path.write_text(_dump(doc))


def _dump(doc: dict) -> str:
    """gpus.json as it is written: one key per line, lists on one line."""
    entries = [
        "    {\n"
        + ",\n".join(f"      {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in g.items())
        + "\n    }"
        for g in doc["gpus"]
    ]
    head = f'{{\n  "format": {json.dumps(doc["format"])},\n  "version": {json.dumps(doc["version"])},\n'
    return head + '  "gpus": [\n' + ",\n".join(entries) + "\n  ]\n}\n"


if __name__ == "__main__":
    main()
