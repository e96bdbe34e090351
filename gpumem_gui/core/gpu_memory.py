"""One GPU's memory as two figures: the total nvidia-smi (NVML) shows and the total CUDA reports.

The driver reserves a few hundred MiB that CUDA never hands out: ``cudaMemGetInfo``
(``torch.cuda.mem_get_info()[1]``) reports nvidia-smi's total less ``nvidia-smi -q``'s "Reserved" (H100 80GB
HBM3: 81559 MiB shown, about 81089 MiB to CUDA; resources/gpus.json). Each engine reads the figure its own
source reads (each runtime's ``estimate`` says which); a fit verdict compares against CUDA's, the memory a
process can allocate.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from gpumem_gui.core.spec.model import Frozen

NonNegInt = Annotated[int, Field(ge=0)]  # 0: no GPU memory at all (a CPU-only point)


class GpuMemory(Frozen):
    """``driver_bytes``: nvidia-smi's / NVML's total; ``cuda_bytes``: cudaMemGetInfo's total (at most it)."""

    driver_bytes: NonNegInt = Field(description="the total nvidia-smi / NVML reports")
    cuda_bytes: NonNegInt = Field(description="the total CUDA reports (cudaMemGetInfo)")

    @model_validator(mode="after")
    def _check(self) -> GpuMemory:
        if self.cuda_bytes > self.driver_bytes:
            raise ValueError("cuda_bytes: CUDA's total cannot exceed the driver's total (driver_bytes)")
        return self

    @classmethod
    def of(cls, gpu: int | GpuMemory | None) -> GpuMemory | None:
        """``gpu`` as a :class:`GpuMemory`; a bare byte count is a GPU whose two totals are equal (a custom
        capacity: the user states the memory the engine sees)."""
        if gpu is None or isinstance(gpu, GpuMemory):
            return gpu
        return cls(driver_bytes=gpu, cuda_bytes=gpu)
