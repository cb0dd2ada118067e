"""TVM's CUDA pipeline with its DLight rules guarded against scratch buffers of symbolic size.

With a symbolic length, DLight's reduction rules stage a whole operand in shared memory, e.g. a
causal ``conv1d`` fused with its slice gets a shared buffer of ``batch x 64 x (L + 3)``, which
TVM 0.27's CUDA codegen rejects ("Can only handle constant size stack allocation for now").
Each rule here is DLight's own, refused when its schedule allocates a shared or local buffer
whose shape is not constant, so the next rule (in the end ``Fallback``) takes the function.
"""
import tvm
from tvm import tirx
from tvm.s_tir import dlight as dl

_SCRATCH = ("shared", "shared.dyn", "local", "warp")


class StaticScratch(dl.ScheduleRule):
    """``rule``, except where its schedule needs scratch memory of symbolic size."""

    def __init__(self, rule):
        self.rule = rule

    def is_target_available(self, target):
        return self.rule.is_target_available(target)

    def apply(self, func, target, tunable):
        sch = self.rule.apply(func, target, tunable)
        if sch is None:
            return None
        if any(_symbolic_scratch(one) for one in (sch if isinstance(sch, list) else [sch])):
            return None
        return sch


def _symbolic_scratch(sch):
    """A block of the scheduled function allocates shared/local memory of non-constant shape."""
    try:
        todo = [sch.get_sblock("root")]
    except (RuntimeError, ValueError):
        return False
    while todo:
        block = todo.pop()
        for buf in sch.get(block).alloc_buffers:
            if buf.scope() in _SCRATCH and not all(isinstance(d, tirx.IntImm) for d in buf.shape):
                return True
        todo.extend(sch.get_child_blocks(block))
    return False


def legalize_passes():
    """``relax.backend.cuda``'s legalization with each DLight rule guarded."""
    from tvm import relax

    rules = [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction()]
    return [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR(),
            dl.ApplyDefaultSchedule(*[StaticScratch(r) for r in rules], dl.gpu.Fallback())]


def cuda_pipeline(target):
    """TVM's default CUDA pipeline with ``legalize_passes`` in place of its own."""
    from tvm.relax.backend.cuda import pipeline as cuda  # pylint: disable=import-outside-toplevel

    @tvm.transform.module_pass(opt_level=0, name="scanweaver.CUDAPipeline")
    def _pipeline(mod, _ctx):
        with target:
            return tvm.transform.Sequential(
                cuda.library_dispatch_passes(target) + legalize_passes()
                + cuda.dataflow_lower_passes(target) + cuda.finalize_passes(target))(mod)

    return _pipeline
