"""Stage 5: the Blelloch stage as a ``gpu.module`` kernel in upstream dialects only
(gpu, scf, memref, arith, math, func)."""
from dataclasses import dataclass

from . import emit
from .kernel_common import Kernel, gpu_module
from .tools import mlir_opt


@dataclass(frozen=True)
class GpuStage:
    spec: object
    kernel: Kernel
    text: str


def lower(blelloch_stage):
    """BlellochStage -> GpuStage (text verified by mlir-opt)."""
    if blelloch_stage.form == "affine":
        from .kernel_affine import generate
    else:
        from .kernel_selective import generate
    kernel = generate(blelloch_stage)
    text = emit.module([gpu_module(kernel)], attrs={"gpu.container_module": "unit"})
    return GpuStage(blelloch_stage.spec, kernel, mlir_opt(text, [], "gpu stage"))
