"""The MLIR realization of ScanWeaver scans: a second realization of the same spec objects.

A spec is lowered stage by stage, each stage a function of the previous one's structure:
``scanweaver.scan`` -> ``scanweaver.affine_scan`` (normalized layout) -> ``scanweaver.assoc_scan``
(pair combine) -> ``scanweaver.blelloch_up/down`` (tiles, carries) -> a ``gpu.module`` kernel in
upstream dialects (Blelloch on affine pairs in workgroup memory).  The custom stages verify with
``mlir-opt --irdl-file=scanweaver.irdl.mlir``.  From the kernel: PTX through
``--gpu-lower-to-nvvm-pipeline`` (checked with ptxas), and a CPU route derived mechanically
from the same kernel IR (barrier stretches become loops over the thread id), emitted as LLVM IR
with one C-ABI entry ``i32 @scanweaver_mlir_<hash>(ptr op0, ..., i64 L)``.

Public API (stable): ``stages``, ``cpu_llvm_ir``, ``cuda_ptx``, ``ptxas_check``,
``build_shared_library``, ``run_cpu``; artifacts ``Stage``, ``CpuArtifact``, ``PtxArtifact``,
``KernelInfo``; errors ``MlirToolsMissing``, ``MlirError``.
"""
import functools

from .artifacts import CpuArtifact, KernelInfo, PtxArtifact, Stage
from .tools import MlirError, MlirToolsMissing, version_key

__all__ = ["stages", "cpu_llvm_ir", "cuda_ptx", "ptxas_check", "build_shared_library", "run_cpu",
           "Stage", "CpuArtifact", "PtxArtifact", "KernelInfo", "MlirError", "MlirToolsMissing"]


def stages(spec):
    """The IR evolution of ``spec``: Stages named "scanweaver.scan", "affine_scan",
    "assoc_scan", "blelloch", "gpu", "cpu", "llvm" (each text verified by mlir-opt)."""
    from . import pipeline
    return list(_cached(pipeline.all_stages, spec))


def cpu_llvm_ir(spec):
    """LLVM IR text defining one C-ABI entry for ``spec`` (see the module docstring)."""
    from . import pipeline
    return _cached(pipeline.cpu_artifact, spec)


def cuda_ptx(spec, arch="sm_90"):
    """PTX of the scan's kernel(s) plus launch descriptions and the ptxas report."""
    from . import ptx
    return _cached(ptx.cuda_ptx, spec, arch)


def ptxas_check(ptx_text, arch="sm_90"):
    """ptxas -v report: {kernel: {"registers", "spill_stores", "spill_loads", "shared_bytes"}}."""
    from . import ptx
    return ptx.ptxas_check(ptx_text, arch)


def build_shared_library(artifact, path):
    """llc -O3 -relocation-model=pic + cc -shared of a ``CpuArtifact``; returns ``path``."""
    from . import native
    return native.build_shared_library(artifact, path)


def run_cpu(spec, *arrays):
    """Run the CPU route on numpy operands (the kernel's input order, ``None`` for absent
    optional ones allowed); returns the outputs (numpy, the spec's dtype) in kernel order."""
    from . import native
    return native.run_cpu(spec, *arrays)


@functools.lru_cache(maxsize=256)
def _cached_call(fn, key, *args):
    return fn(*args)


def _cached(fn, spec, *args):
    """One build per (spec, toolchain version) in this process (a supported symbolic spec in
    its MLIR form: ``operands.mlir_spec``)."""
    from .operands import mlir_spec
    spec = mlir_spec(spec)
    return _cached_call(fn, (spec, version_key()), spec, *args)
