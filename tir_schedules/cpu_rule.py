"""The shared shell of our DLight-style CPU rules (``dense_cpu``, ``elementwise_cpu``), and
DLight's own CPU rules behind the same guard."""
from tvm import tirx
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule


class GuardedCPURule(CPUScheduleRule):
    """A rule for LLVM targets whose ``schedule(func, target)`` returns a schedule or None;
    a primitive that refuses the function (``RuntimeError``) leaves it as it was (None)."""

    def schedule(self, func, target):
        raise NotImplementedError

    def apply(self, func, target, _tunable):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            return self.schedule(func, target)
        except RuntimeError:
            return None


class Guarded(GuardedCPURule):
    """One of DLight's CPU rules (``dl.cpu.Reduction``: norms, softmax, small reductions with
    their epilogue) behind the guard: some of its primitives refuse functions it accepted
    (``RuntimeError``), which would otherwise stop the whole pipeline.  A function whose
    buffers all hold fewer than ``min_elements`` is left serial: waking the thread pool costs
    more than it saves (a decode step's RMS norm of 768 values: 0.26 ms parallel, a few us
    serial)."""

    def __init__(self, rule, min_elements=0):
        super().__init__()
        self.rule, self.min_elements = rule, min_elements

    def schedule(self, func, target):
        if _largest_buffer(func) < self.min_elements:
            return None
        return self.rule.apply(func, target, False)


def elements(extents):
    """The product of ``extents`` (ints or PrimExprs); a symbolic one makes it unbounded."""
    total = 1
    for e in extents:
        if isinstance(e, tirx.IntImm):
            total *= int(e.value)
        elif isinstance(e, int):
            total *= e
        else:
            return float("inf")
    return total


def _largest_buffer(func):
    """Elements of the largest parameter buffer (a symbolic one counts as unbounded)."""
    shapes = [getattr(getattr(p, "ty", None), "shape", None) for p in func.params]
    return max([elements(shape) for shape in shapes if shape is not None], default=0)
