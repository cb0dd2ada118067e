"""LowerScans: replace each ``scanweaver`` scan call with ``call_tir`` of a scheduled PrimFunc.

Sits after FuseAffineRecurrences and before TVM's default pipeline.  With ``realization="tir"``
the schedule is chosen for the target (CUDA -> GPU schedules, LLVM -> CPU) by
``tir_schedules.realize``; with ``"mlir"`` the kernel comes from ``mlir_bridge`` (LLVM IR linked
into TVM's LLVM module on the CPU; on CUDA a host launcher plus a PTX device module added to
``external_mods``, which the build imports into the executable).  The PrimFunc joins the
module, so ``mod.script()`` shows every scan.  Each PrimFunc is marked scheduled and opaque
(``op_pattern`` 8) so FuseOps/FuseTIR and DLight leave it alone.
"""
import tvm
from tvm import relax

import tir_schedules
from scanweaver_core.scan_op import output_types, parse_scan
from scanweaver_core.spec import DeltaScanSpec, MatrixScanSpec, MLSTMScanSpec, StabilizedScanSpec
from tir_schedules import instance

REALIZATIONS = ("tir", "mlir")


@relax.expr_functor.mutator
class _Lowerer(relax.PyExprMutator):
    def __init__(self, mod, target, realization, schedule, database=None):
        super().__init__(mod)
        self.target, self.realization, self.schedule = target, realization, schedule
        self.database = database  # MetaSchedule tuning records (tir_schedules.search)
        self.cache = {}  # spec -> GlobalVar: equal scans share one PrimFunc
        self.device_modules = []  # runtime modules the executable must import (MLIR on CUDA)

    def _realize(self, spec):
        # (the MLIR bridge has no stabilized, mLSTM or delta-rule kernel: TIR's serves them)
        if self.realization == "tir" or isinstance(spec, (StabilizedScanSpec, MLSTMScanSpec, DeltaScanSpec)):
            if self.database is not None and self.schedule is None:
                from tir_schedules import search

                choice = search.best_choice(self.database, spec, self.target)
                if choice is not None:
                    return search.realize_choice(choice, self.target)
            return tir_schedules.realize(spec, self.target, self.schedule)
        from mlir_bridge import tvm_wrap

        # a matrix scan in Mamba's form takes the selective kernel, on its own buffers
        other = instance.counterpart(spec) if isinstance(spec, MatrixScanSpec) else None
        kernel_spec = spec if other is None else other
        if tir_schedules.target_kind(self.target) == "cpu":
            func = tvm_wrap.cpu_primfunc(kernel_spec)
        else:
            host = self.target.host or tvm.target.Target("llvm")
            func, device = tvm_wrap.cuda_primfunc(kernel_spec, self.target, host)
            self.device_modules.append(device)
        return func if other is None else instance.retarget(func, spec)

    def visit_call_(self, call):
        call = super().visit_call_(call)
        parsed = parse_scan(call)
        if parsed is None:
            return call
        spec, operands = parsed
        gvar = self.cache.get(spec)
        if gvar is None:
            func = self._realize(spec)
            name = self.builder_.get_unique_name("scanweaver_scan")
            func = func.with_attrs({"op_pattern": 8, "tirx.is_scheduled": True, "global_symbol": name})
            gvar = self.builder_.add_func(func, name)
            self.cache[spec] = gvar
        return relax.op.call_tir(gvar, relax.Tuple(operands), _out_types(call, spec))


def _out_types(call, spec):
    """``call_tir``'s output types: the scan call's own (they carry the function's symbolic
    shape vars, which the PrimFunc's own vars are bound to at call time); the spec's types when
    the call has none."""
    ty = call.ty_args[0] if len(call.ty_args) == 1 else None
    if isinstance(ty, relax.TupleType):
        return list(ty.fields)
    if isinstance(ty, relax.TensorType):
        return ty
    types = output_types(spec)
    return types if len(types) > 1 else types[0]


def LowerScans(target, realization="tir", schedule=None, database=None):  # noqa: N802 (TVM pass naming)
    """The module pass lowering every scan for ``target`` with ``realization``.  With a
    MetaSchedule ``database`` (``sw.tune``), a scan with a record uses its best recorded
    realization and knobs (TIR only); others keep the defaults."""
    if realization not in REALIZATIONS:
        raise ValueError(f"realization: {realization!r} is not available; choose from {REALIZATIONS}")
    if realization == "mlir" and schedule is not None:
        raise ValueError("schedule: names a TIR realization; the MLIR realization has one schedule")
    target = tir_schedules.resolve_target(target)

    @tvm.ir.transform.module_pass(opt_level=0, name="scanweaver.LowerScans")
    def lower(mod, _ctx):
        lowerer = _Lowerer(mod, target, realization, schedule, database)
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                lowerer.builder_.update_func(gvar, lowerer.visit_expr(func))
        lowered = lowerer.builder_.get()
        if lowerer.device_modules:
            known = list(lowered.attrs["external_mods"]) if lowered.attrs and "external_mods" in lowered.attrs else []
            lowered = lowered.with_attr("external_mods", known + lowerer.device_modules)
        return lowered

    return lower
