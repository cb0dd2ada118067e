"""The schedule space of a scan: each realization's knobs as MetaSchedule decisions.

One design space per realization that applies to (spec, target) -- the schedule family is the
choice between design spaces, as MetaSchedule's own generators offer several sketches.  In
each, every knob is one ``sample_categorical`` over its legal values, annotated on the
workload's ``scan`` block as ``scanweaver.<knob>``, so a trace holds exactly the decisions and
replaying it with other decisions gives another kernel.  The legal values follow each
realization's own rules (``generate``'s checks: threads a power of two <= 1024, 1 <= warps
<= 32, 1 <= items <= 16; shared memory <= 48 KB); values that only repeat another one for this
spec (a tile far longer than L, more chunks than steps) are left out, and the realization's
default is always a candidate, so the hand-tuned choice is in the space.
"""
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.space_generator import PySpaceGenerator

import tir_schedules
from scanweaver_core.spec import AffineScanSpec

from .workload import BLOCK, require_static, workload_spec

PREFIX = "scanweaver."
SCHEDULE_KEY = PREFIX + "schedule"
SMEM_LIMIT = 48 * 1024
_POW2 = tuple(1 << i for i in range(11))  # 1 .. 1024


def _pow2(lo, hi):
    return [v for v in _POW2 if lo <= v <= hi]


def _ceil_pow2(n):
    return 1 << max(0, (int(n) - 1).bit_length())


def _cpu(spec):
    length = spec.length
    return {"group": _pow2(1, min(32, _ceil_pow2(spec.lanes))),
            "chunks": _pow2(1, min(64, length))}


def _selective_cpu(spec):
    per_group = spec.dim // (spec.groups or 1)
    return {"lanes": _pow2(1, min(32, _ceil_pow2(per_group))),
            "tile": _pow2(16, max(16, min(256, _ceil_pow2(spec.length)))),
            "unroll": [0, 1] if spec.dstate <= 32 else [0]}


def _blelloch(spec):
    # two float32 tiles of 2*threads pairs in shared memory
    return {"threads": [t for t in _pow2(32, min(1024, max(32, _ceil_pow2(spec.length))))
                        if 2 * 2 * t * 4 <= SMEM_LIMIT]}


def _warp(spec):
    return {"warps": _pow2(1, 32), "items": _pow2(1, 16)}


def _chunked(spec):
    return {**_warp(spec), "chunks": _pow2(1, max(1, min(128, spec.length // 512)))}


def _selective_gpu(spec):
    # shared: warp totals (2 parities x warps x pair) and carries (2 parities x N)
    return {"warps": [w for w in _pow2(1, 32) if (4 * w + 2 * spec.dstate) * 4 <= SMEM_LIMIT],
            "items": _pow2(1, 16)}


_KNOBS = {"cpu": _cpu, "selective_cpu": _selective_cpu, "blelloch": _blelloch,
          "warp": _warp, "chunked": _chunked, "selective_gpu": _selective_gpu}


def knob_values(name, spec):
    """``{knob: [legal int values]}`` of realization ``name`` for ``spec`` (booleans as 0/1),
    the realization's default included."""
    if name not in _KNOBS:
        raise ValueError(f"schedule: {name!r} has no search space; known: {sorted(_KNOBS)}")
    require_static(spec)
    values = _KNOBS[name](spec)
    default = tir_schedules.REALIZATIONS[name].default_config(spec)
    if set(default) != set(values):
        raise RuntimeError(f"{name}: search knobs {sorted(values)} differ from its config "
                           f"{sorted(default)}; update tir_schedules/search/space.py")
    return {k: sorted(set(v) | {int(default[k])}) for k, v in values.items()}


def realizations(spec, target):
    """Names of the realizations of ``spec`` on ``target`` (each one a design space)."""
    kind = tir_schedules.target_kind(target)
    form = "affine" if isinstance(spec, AffineScanSpec) else "selective"
    return [n for n, m in tir_schedules.REALIZATIONS.items()
            if m.TARGET == kind and m.FORM == form and m.applies(spec)]


def sample(sch, name, spec, fixed=None):
    """Annotate the ``scan`` block of ``sch`` with realization ``name`` and one sampled value
    per knob (uniform over the legal values; ``fixed`` sets decisions); returns ``sch``."""
    block = sch.get_sblock(BLOCK)
    sch.annotate(block, SCHEDULE_KEY, name)
    fixed = fixed or {}
    for knob, values in knob_values(name, spec).items():
        decision = values.index(int(fixed[knob])) if knob in fixed else None
        choice = sch.sample_categorical(values, [1.0 / len(values)] * len(values), decision)
        sch.annotate(block, PREFIX + knob, choice)
    return sch


@derived_object
class ScanSpace(PySpaceGenerator):
    """Design spaces of a scan workload: one per applicable realization of its spec.

    The spec is read from the workload, the target from the tuning context (or given here).
    No schedule rules or postprocessors (the realizations are complete schedules); the mutator
    is ``MutateKnob``, which re-samples one decision.
    """

    def __init__(self, target=None, mutator_probs=None):
        from .mutate import MutateKnob

        self.target = None if target is None else tvm.target.Target(target)
        self.sch_rules, self.postprocs = [], []
        self.mutator_probs = mutator_probs if mutator_probs is not None else {MutateKnob(): 1.0}

    def _initialize_with_tune_context(self, context):
        if context.target is not None:
            self.target = context.target

    def generate_design_space(self, mod):
        if self.target is None:
            raise ValueError("target: ScanSpace needs a target (from the TuneContext or its constructor)")
        spec = workload_spec(mod)
        names = realizations(spec, self.target)
        if not names:
            raise ValueError(f"spec: no realization of {spec} for target {self.target}")
        spaces = []
        for name in names:
            sch = tvm.s_tir.Schedule(mod)
            spaces.append(sample(sch, name, spec))
        return spaces

    def clone(self):
        return ScanSpace(self.target, self.mutator_probs)
