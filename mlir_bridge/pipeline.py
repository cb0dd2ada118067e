"""The lowering pipeline read top to bottom: each stage a function of the previous one."""

from . import stage_affine, stage_assoc, stage_blelloch, stage_cpu, stage_gpu, stage_scan
from .artifacts import CpuArtifact, Stage
from .operands import digest, operands, symbolic
from .tools import mlir_opt, mlir_translate

CPU_PASSES = ["--arith-expand=include-bf16=true", "--convert-scf-to-cf", "--expand-strided-metadata",
              "--finalize-memref-to-llvm", "--convert-math-to-llvm", "--convert-math-to-libm",
              "--convert-arith-to-llvm", "--convert-index-to-llvm", "--convert-cf-to-llvm",
              "--convert-func-to-llvm=use-bare-ptr-memref-call-conv=1", "--reconcile-unrealized-casts"]


def entry_symbol(spec):
    """Unique per spec, stable across processes."""
    return "scanweaver_mlir_" + digest(spec)


def gpu_stage(spec):
    scan = stage_scan.lower(spec)
    affine = stage_affine.lower(scan)
    assoc = stage_assoc.lower(affine)
    blelloch = stage_blelloch.lower(assoc)
    return [scan, affine, assoc, blelloch, stage_gpu.lower(blelloch)]


def llvm_dialect(cpu):
    return mlir_opt(cpu.text, CPU_PASSES, "cpu stage (to LLVM dialect)")


def all_stages(spec):
    hi = gpu_stage(spec)
    cpu = stage_cpu.lower(hi[-1], entry_symbol(spec))
    names = ["scanweaver.scan", "affine_scan", "assoc_scan", "blelloch", "gpu"]
    llvm_ir = mlir_translate(llvm_dialect(cpu))
    return [Stage(n, s.text) for n, s in zip(names, hi)] + [Stage("cpu", cpu.text), Stage("llvm", llvm_ir)]


def cpu_artifact(spec):
    cpu = stage_cpu.lower(gpu_stage(spec)[-1], entry_symbol(spec))
    return CpuArtifact(cpu.entry, mlir_translate(llvm_dialect(cpu)), [n for n, *_ in operands(spec)],
                       symbolic(spec))
