"""The GPUs a plan must fit on (:class:`GpuTarget`): how many, their two totals (the driver's and CUDA's),
their free memory now, and the calibration measured on them, if any."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from gpumem_gui.core.gpu_memory import GpuMemory
from gpumem_gui.core.observed.apply import apply_calibration
from gpumem_gui.core.observed.calibration import Calibration
from gpumem_gui.core.results.estimate import Estimate
from gpumem_gui.core.spec.model import Frozen


class GpuTarget(Frozen):
    """The GPUs a plan must fit on: ``count`` GPUs of ``capacity_bytes`` each (nvidia-smi's total), of which
    CUDA reports ``cuda_bytes`` (None: the same figure, a GPU given by its memory)."""

    name: str
    capacity_bytes: Annotated[int, Field(gt=0)] = Field(description="the total nvidia-smi / NVML shows")
    cuda_bytes: Annotated[int, Field(gt=0)] | None = Field(
        None, description="the total CUDA reports (cudaMemGetInfo); None: capacity_bytes"
    )
    count: Annotated[int, Field(ge=1, le=4096)] = 1
    free_bytes: tuple[int, ...] | None = Field(None, description="free memory per GPU now (local GPUs)")
    calibration: Calibration | None = Field(
        None, description="a measurement on this GPU that replaces the default overheads of every estimate"
    )

    @model_validator(mode="after")
    def _check(self) -> GpuTarget:
        if self.cuda_bytes is not None and self.cuda_bytes > self.capacity_bytes:
            raise ValueError("cuda_bytes: CUDA's total cannot exceed the driver's total (capacity_bytes)")
        return self

    @model_serializer(mode="wrap")
    def _calibration_when_set(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """A target without a calibration serializes as it did before targets could carry one."""
        data: dict[str, object] = handler(self)
        if self.calibration is None:
            data.pop("calibration", None)
        return data

    def calibrated(self, est: Estimate) -> Estimate:
        """``est`` with this target's calibration applied (core/observed/apply.py); as is without one."""
        return est if self.calibration is None else apply_calibration(est, self.calibration)

    @property
    def memory(self) -> GpuMemory:
        """One GPU's two totals, as the engines read them."""
        return GpuMemory(driver_bytes=self.capacity_bytes, cuda_bytes=self.cuda_capacity)

    @property
    def cuda_capacity(self) -> int:
        """What a process can allocate on one GPU at most: CUDA's total. Every engine measures its room
        against it: PyTorch's caching allocator gets its blocks from cudaMalloc within cudaMemGetInfo's
        total, llama.cpp's --fit reads cudaMemGetInfo (ggml-cuda.cu ggml_backend_cuda_get_device_memory),
        vLLM and SGLang torch.cuda.mem_get_info."""
        return self.capacity_bytes if self.cuda_bytes is None else self.cuda_bytes

    def available(self, i: int) -> int:
        if self.free_bytes is not None and i < len(self.free_bytes):
            return self.free_bytes[i]
        return self.cuda_capacity
