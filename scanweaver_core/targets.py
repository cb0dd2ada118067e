"""Targets, resolved once for every layer (part of the shared vocabulary: imports only TVM)."""
import tvm


def host_target():
    """The LLVM target for this machine's CPU (plain ``"llvm"`` means generic x86-64: SSE2 only)."""
    from tvm.target import codegen  # pylint: disable=import-outside-toplevel

    return tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()})


def physical_cores():
    """This machine's physical cores (psutil's count; the logical ones where it has none)."""
    import os

    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def resolve_target(target):
    """A ``tvm.target.Target``; a bare ``"llvm"`` becomes the host CPU's target."""
    if isinstance(target, str) and target == "llvm":
        return host_target()
    return tvm.target.Target(target)
