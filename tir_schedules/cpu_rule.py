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
    (``RuntimeError``), which would otherwise stop the whole pipeline."""

    def __init__(self, rule):
        super().__init__()
        self.rule = rule

    def schedule(self, func, target):
        return self.rule.apply(func, target, False)
