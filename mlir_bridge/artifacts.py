"""The objects the bridge hands out: stage dumps, the CPU LLVM IR, the PTX and its kernels."""
from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass(frozen=True)
class Stage:
    """One step of the IR evolution: ``name`` and its (verified) MLIR or LLVM text."""

    name: str
    text: str


@dataclass(frozen=True)
class CpuArtifact:
    """LLVM IR with one entry ``i32 @entry(ptr op..., i64 sym...)``; every other symbol private.

    ``operand_names``: one pointer per name, in tir_schedules' argument order (inputs then
    outputs); ``symbolic``: the trailing i64 scalars (``["L"]`` for a symbolic length)."""

    entry: str
    llvm_ir: str
    operand_names: list
    symbolic: list


@dataclass(frozen=True)
class KernelInfo:
    """What a launcher needs: ``params`` in order, each ("ptr", operand) or ("i64", scalar);
    ``grid(shape_env)`` and ``block`` as (x, y, z); static workgroup memory in bytes."""

    name: str
    params: list
    grid: Callable
    block: tuple
    shared_bytes: int


@dataclass(frozen=True)
class PtxArtifact:
    ptx: str
    kernels: list
    ptxas: Optional[dict] = field(default=None)
