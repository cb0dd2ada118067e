"""The MLIR realization inside TVM's build flow: each scan becomes a PrimFunc for ``call_tir``.

CPU: the bridge's LLVM IR is linked into TVM's own LLVM module (``pragma_import_llvm``, TVM's
hook for external LLVM IR) and called with ``call_extern``, so the kernel is part of the
executable's object code and ``export_library`` / ``load_module`` carry it like any PrimFunc.

CUDA: the PTX becomes a ``cuda`` device module made by TVM's own CUDA build (``target.build.cuda``
on signature-only kernel stubs, with the compile hook answering with our PTX). Like TVM's CUDA
codegen, it stays serialized until the library is loaded on a machine with a GPU (creating a
live CUDA module needs ``libcuda``). A host PrimFunc launches its kernels by name, the way
TVM's split host code does; the device module rides in ``external_mods`` into the executable.
"""
import threading

import tvm
import tvm_ffi
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from .operands import mlir_spec, operands

_LAUNCH_TAGS = ["blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z"]


def operand_signature(spec):
    """``[(name, shape, dtype)]`` of the kernel arguments (``operands.operands`` order), a
    symbolic L as the int64 variable ``L`` that the PrimFunc's buffers share."""
    length = tirx.Var("L", "int64")
    return [(name, tuple(length if d is None else d for d in shape), dtype)
            for name, shape, dtype, _ in operands(spec)]


def _symbolic_vars(sig):
    """Name -> tirx.Var of the symbolic extents in a signature, in first-use order."""
    found = {}
    for _, shape, _ in sig:
        for extent in shape:
            if isinstance(extent, tirx.Var):
                found.setdefault(extent.name, extent)
    return found


def _buffer(shape, dtype):
    """An argument buffer; no layout when symbolic (TVM's default layout names the shape's vars,
    which Relax's AttachAttrLayoutFreeBuffers does not rename when it copies a PrimFunc)."""
    return T.buffer(shape, dtype, layout="default" if all(isinstance(d, int) for d in shape) else None)


def _declare(sig, expected_names):
    names = [name for name, _, _ in sig]
    if list(expected_names) != names:
        raise RuntimeError(f"mlir_bridge: artifact operands {list(expected_names)} differ from the "
                           f"kernel argument convention {names}")
    return {name: T.arg(name, _buffer(shape, dtype)) for name, shape, dtype in sig}


def cpu_primfunc(spec):
    """A PrimFunc whose body calls the bridge's CPU entry, the LLVM IR imported alongside.
    Raises ``ValueError`` for a symbolic extent other than an affine scan's L."""
    import mlir_bridge

    spec = mlir_spec(spec)
    art = mlir_bridge.cpu_llvm_ir(spec)
    sig = operand_signature(spec)
    scalars = _symbolic_vars(sig)
    if sorted(art.symbolic) != sorted(scalars):
        raise RuntimeError(f"mlir_bridge: entry {art.entry} takes scalars {art.symbolic}, "
                           f"the spec has symbolic extents {list(scalars)}")
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scanweaver_scan")
            T.func_attr({"tirx.noalias": True, "scanweaver.realization": "mlir",
                         "scanweaver.entry": art.entry})
            bufs = _declare(sig, art.operand_names)
            args = [buf.data for buf in bufs.values()]
            args += [tirx.Cast("int64", scalars[name]) for name in art.symbolic]
            with T.attr(tirx.const(0, "int32"), "pragma_import_llvm", tvm.ir.StringImm(art.llvm_ir)):
                T.evaluate(T.call_extern("int32", art.entry, *args))
    return ib.get()


def build_cpu(spec, target="llvm"):
    """``cpu_primfunc`` compiled by TVM alone (function ``scanweaver_scan``): the MLIR route's
    counterpart of ``tir_schedules.build``, for benchmarks and kernel-level tests."""
    from scanweaver_core.targets import resolve_target

    func = cpu_primfunc(spec)
    return tvm.compile(tvm.IRModule({"scanweaver_scan": func}), target=resolve_target(target)).mod


def _kernel_stub(kernel, target):
    """A body-less device PrimFunc with ``kernel``'s name and parameters: what TVM's CUDA
    module records per kernel (argument types, launch tags) is read from it."""
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name(kernel.name)
            for kind, name in kernel.params:
                T.arg(name, T.handle() if kind == "ptr" else T.int32() if kind == "i32" else T.int64())
            T.func_attr({"target": target, "calling_conv": 2, "global_symbol": kernel.name,
                         "tirx.kernel_launch_params": _LAUNCH_TAGS, "tirx.is_global_func": True})
            T.evaluate(0)
    return ib.get()


_HOOKS = ("tvm_callback_cuda_compile", "tvm_callback_cuda_postproc")
_HOOK_LOCK = threading.Lock()    # one build at a time answers TVM's hooks with its PTX


def device_module(art, target):
    """A ``cuda`` runtime module holding the artifact's PTX, built by TVM's CUDA build.

    TVM asks process-global hooks for the compiled code.  They are swapped for the build only,
    under a lock (two of our builds never share them), and answer only on the thread that
    builds: any other thread's CUDA build meanwhile gets the hooks it had (the code unchanged,
    for a missing postproc hook).  Restored afterwards, also when the build fails."""
    stubs = tvm.IRModule({k.name: _kernel_stub(k, target) for k in art.kernels})
    source = "// ScanWeaver MLIR kernels: PTX from mlir-opt --gpu-lower-to-nvvm-pipeline\n" + art.ptx
    ours = {_HOOKS[0]: lambda *_: art.ptx.encode(), _HOOKS[1]: lambda *_: source}
    with _HOOK_LOCK:
        saved = {h: tvm.get_global_func(h, allow_missing=True) for h in _HOOKS}
        builder = threading.get_ident()
        for hook in _HOOKS:
            tvm_ffi.register_global_func(hook, _only_on(builder, ours[hook], saved[hook], hook), override=True)
        try:
            return tvm.get_global_func("target.build.cuda")(stubs, target)
        finally:
            for hook, func in saved.items():
                if func is not None:
                    tvm_ffi.register_global_func(hook, func, override=True)
                else:
                    tvm_ffi.remove_global_func(hook)


def _only_on(thread, ours, theirs, hook):
    def answer(*args):
        if threading.get_ident() == thread:
            return ours(*args)
        if theirs is not None:
            return theirs(*args)
        if hook == _HOOKS[1]:
            return args[0]                  # no postproc: the code as it is
        raise RuntimeError(f"{hook} is not registered")
    return answer


def _dims(value, env):
    dims = value(env) if callable(value) else value
    dims = list(dims) + [1] * (3 - len(dims))
    return [tirx.const(d, "int64") if isinstance(d, int) else tirx.Cast("int64", d) for d in dims]


def cuda_primfunc(spec, target, host):
    """``(host PrimFunc, device module)``: the host function launches the artifact's kernels
    in order on the current stream.  Raises ``ValueError`` for a symbolic extent other than
    an affine scan's L."""
    import mlir_bridge

    spec = mlir_spec(spec)
    arch = target.attrs.get("arch", "sm_90")
    art = mlir_bridge.cuda_ptx(spec, arch=str(arch))
    sig = operand_signature(spec)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scanweaver_scan")
            T.func_attr({"target": host, "tirx.noalias": True, "scanweaver.realization": "mlir",
                         "scanweaver.kernels": [k.name for k in art.kernels]})
            bufs = {name: T.arg(name, _buffer(shape, dtype)) for name, shape, dtype in sig}
            env = {"L": spec.length, **_symbolic_vars(sig)}
            for kernel in art.kernels:
                args = []
                for kind, name in kernel.params:
                    if kind == "ptr":
                        args.append(bufs[name].data)
                    else:
                        args.append(tirx.Cast("int32" if kind == "i32" else "int64", env[name]))
                args += _dims(kernel.grid, env) + _dims(kernel.block, env)
                T.evaluate(T.call_packed(kernel.name, *args))
    return ib.get(), device_module(art, target)
