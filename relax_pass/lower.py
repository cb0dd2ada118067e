"""LowerScans: replace each ``scanweaver`` scan call with ``call_tir`` of a scheduled PrimFunc.

Sits after FuseAffineRecurrences and before TVM's default pipeline.  The realization is chosen
for the target (CUDA -> GPU schedules, LLVM -> CPU) by ``tir_schedules.realize``; the PrimFunc
joins the module, so ``mod.script()`` shows the scheduled TIR of every scan.  Each PrimFunc is
marked scheduled and opaque (``op_pattern`` 8) so FuseOps/FuseTIR and DLight leave it alone.
"""
import tvm
from tvm import relax

import tir_schedules

from .scan_op import output_types, parse_scan

REALIZATIONS = ("tir",)


@relax.expr_functor.mutator
class _Lowerer(relax.PyExprMutator):
    def __init__(self, mod, target, schedule):
        super().__init__(mod)
        self.target, self.schedule = target, schedule
        self.cache = {}  # spec -> GlobalVar: equal scans share one PrimFunc

    def visit_call_(self, call):
        call = super().visit_call_(call)
        parsed = parse_scan(call)
        if parsed is None:
            return call
        spec, operands = parsed
        gvar = self.cache.get(spec)
        if gvar is None:
            func = tir_schedules.realize(spec, self.target, self.schedule)
            name = self.builder_.get_unique_name("scanweaver_scan")
            func = func.with_attrs({"op_pattern": 8, "tirx.is_scheduled": True, "global_symbol": name})
            gvar = self.builder_.add_func(func, name)
            self.cache[spec] = gvar
        types = output_types(spec)
        return relax.op.call_tir(gvar, relax.Tuple(operands), types if len(types) > 1 else types[0])


def LowerScans(target, realization="tir", schedule=None):  # noqa: N802 (TVM pass naming)
    """The module pass lowering every scan for ``target`` with ``realization``."""
    if realization not in REALIZATIONS:
        raise ValueError(f"realization: {realization!r} is not available; choose from {REALIZATIONS}")
    target = tir_schedules.resolve_target(target)

    @tvm.ir.transform.module_pass(opt_level=0, name="scanweaver.LowerScans")
    def lower(mod, _ctx):
        lowerer = _Lowerer(mod, target, schedule)
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                lowerer.builder_.update_func(gvar, lowerer.visit_expr(func))
        return lowerer.builder_.get()

    return lower
