"""The shared shell of our DLight-style CPU rules (``dense_cpu``, ``elementwise_cpu``)."""
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
