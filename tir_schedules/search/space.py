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

Where the rule binds knobs together (the matrix kernels: threads = v_tile * col_threads,
shared memory and registers from all three; a CPU lane count the V tile would round), each
knob lists the values legal for some choice of the others and ``legal`` rejects the
combinations that break the rule or that the kernel would clamp into another one;
``ScanSpace`` applies it as a postprocessor (``RejectIllegal``), so the search never measures
them, as MetaSchedule's own ``VerifyGPUCode`` does for its sketches.
"""
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.space_generator import PySpaceGenerator

import tir_schedules
from .workload import BLOCK, form_of, require_static, workload_spec

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


def _matrix_cpu(spec):
    # V tiles and register blocks (lanes) of powers of two up to V's, blocks of at most 16
    # rows and 4 readout sums (past K the kernel clamps them to K), time tiles of 8 .. 128
    # steps up to the first one holding all of L, rescaled pieces up to the longest tile (the
    # selective decay has none: only 0)
    v_cap, tiles = _ceil_pow2(spec.value), [t for t in _pow2(8, 128) if t < spec.length]
    tiles += [t for t in [_ceil_pow2(spec.length)] if t <= 128]
    return {"vtile": _pow2(4, v_cap), "lanes": _pow2(4, min(64, v_cap)),
            "rows": _pow2(1, min(16, spec.key)), "parts": _pow2(1, min(4, spec.key)),
            "tile": tiles, "chunk": {"none": [], "selective": [0]}.get(
                spec.decay, [0] + _pow2(4, min(64, max(tiles)))),
            "prefetch": [0, 1], "locality": [1, 2, 3]}


def _matrix_gpu(spec):
    # tiles of V's columns (V itself, not a power of two past it), pow2 threads per column up
    # to one row each, time tiles below 2L (longer ones are all padding)
    return {"v_tile": [t for t in _pow2(1, 64) if t < spec.value] + [spec.value] * (spec.value <= 64),
            "col_threads": _pow2(1, min(32, _ceil_pow2(spec.key))),
            "t_tile": [t for t in _pow2(1, 64) if t < 2 * spec.length]}


def _stabilized_cpu(spec):
    # packs of 1 .. 32 lanes (up to C's), packs per task (time-major) up to all of a row,
    # channel-major tiles of 16 .. 256 steps (up to the first holding all of L)
    lanes = _pow2(1, min(32, _ceil_pow2(spec.channels)))
    groups = _pow2(1, _ceil_pow2(spec.channels)) if spec.layout == "time_major" else [1]
    return {"lanes": lanes, "group": groups,
            "tile": _pow2(16, max(16, min(256, _ceil_pow2(spec.length))))}


def _stabilized_cpu_rule(spec, k):
    """None, or what the kernel clamps: more packs per task than a row has."""
    if k["group"] > -(-spec.channels // k["lanes"]):
        return f"group {k['group']} > the {-(-spec.channels // k['lanes'])} packs of a row"
    return None


def _stabilized_gpu(spec):
    return {"tile": _pow2(1, min(32, _ceil_pow2(spec.channels))),
            "chunks": [c for c in _pow2(1, 16) if c <= max(1, spec.length // 8)]}


def _column_lanes(spec):
    # columns a task (mLSTM, delta rule): 1 .. 32 lanes (up to V's)
    return {"lanes": _pow2(1, min(32, _ceil_pow2(spec.value)))}


def _mlstm_gpu(spec):
    # threads (columns) a block: half a warp .. 256, past V only to round it up to a warp
    return {"threads": [t for t in (16, 32, 64, 128, 256) if t < spec.value + 32]}


def _matrix_cpu_rule(spec, k):
    """None, or what the kernel would clamp: lanes past (or not dividing) the V tile, readout
    sums past the rows, a rescaled piece past the tile; the locality of no prefetch."""
    rows = min(k["rows"], spec.key)
    if k["lanes"] > k["vtile"] or k["vtile"] % k["lanes"]:
        return f"vtile {k['vtile']} is not a multiple of lanes {k['lanes']}"
    if k["parts"] > rows:
        return f"parts {k['parts']} > rows {rows}"
    if spec.decay in tir_schedules.matrix_cpu.RESCALABLE and k["chunk"] > k["tile"]:
        return f"chunk {k['chunk']} > tile {k['tile']}"
    if not k["prefetch"] and k["locality"] != _default("matrix_cpu", spec)["locality"]:
        return "locality without prefetch"
    return None


def _matrix_gpu_rule(spec, k):
    """None, or the limit broken: ``generate``'s threads <= 1024, 48 KB of static shared
    memory, or registers: a thread holds its prefetched operands and state rows (and A's rows
    under the selective decay; plus ~32 working registers) in at most 255 registers and 64K
    per block."""
    threads = k["v_tile"] * k["col_threads"]
    if threads > 1024:
        return f"{threads} threads > 1024"
    items, shared = tir_schedules.matrix_gpu.footprint(spec, k["v_tile"], k["col_threads"], k["t_tile"])
    if shared > SMEM_LIMIT:
        return f"{shared} bytes of shared memory > {SMEM_LIMIT}"
    rows = -(-spec.key // k["col_threads"])
    regs = items + rows * (2 if spec.decay == "selective" else 1) + 32   # selective: A's rows too
    if regs > min(255, 65536 // threads):
        return f"~{regs} registers per thread > {min(255, 65536 // threads)}"
    return None


_KNOBS = {"cpu": _cpu, "selective_cpu": _selective_cpu, "blelloch": _blelloch,
          "warp": _warp, "chunked": _chunked, "selective_gpu": _selective_gpu,
          "matrix_cpu": _matrix_cpu, "matrix_gpu": _matrix_gpu,
          "stabilized_cpu": _stabilized_cpu, "stabilized_gpu": _stabilized_gpu,
          "mlstm_cpu": _column_lanes, "mlstm_gpu": _mlstm_gpu, "delta_cpu": _column_lanes}
_RULES = {"matrix_cpu": _matrix_cpu_rule, "matrix_gpu": _matrix_gpu_rule,
          "stabilized_cpu": _stabilized_cpu_rule}


def _default(name, spec):
    return tir_schedules.REALIZATIONS[name].default_config(spec)


def knob_values(name, spec):
    """``{knob: [legal int values]}`` of realization ``name`` for ``spec`` (booleans as 0/1),
    the realization's default included."""
    if name not in _KNOBS:
        raise ValueError(f"schedule: {name!r} has no search space; known: {sorted(_KNOBS)}")
    require_static(spec)
    values = _KNOBS[name](spec)
    default = _default(name, spec)
    if set(default) != set(values):
        raise RuntimeError(f"{name}: search knobs {sorted(values)} differ from its config "
                           f"{sorted(default)}; update tir_schedules/search/space.py")
    return {k: sorted(set(v) | {int(default[k])}) for k, v in values.items()}


def violation(name, spec, knobs):
    """Why the knob values ``knobs`` (one of each) of realization ``name`` do not go together
    for ``spec``, or None when they do (always for independent knobs and for the default)."""
    knobs = {k: int(v) for k, v in knobs.items()}
    rule = _RULES.get(name)
    if rule is None or knobs == {k: int(v) for k, v in _default(name, spec).items()}:
        return None
    return rule(spec, knobs)


def legal(name, spec, knobs):
    """Whether the knob values ``knobs`` of realization ``name`` are a point of the space."""
    return violation(name, spec, knobs) is None


def realizations(spec, target):
    """Names of the realizations of ``spec`` on ``target`` (each one a design space)."""
    kind = tir_schedules.target_kind(target)
    form = form_of(spec)
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
    No schedule rules (the realizations are complete schedules); the one postprocessor,
    ``RejectIllegal``, drops candidates whose knobs break ``legal``; the mutator is
    ``MutateKnob``, which re-samples one decision.
    """

    def __init__(self, target=None, mutator_probs=None):
        from .mutate import MutateKnob
        from .realize import RejectIllegal

        self.target = None if target is None else tvm.target.Target(target)
        self.sch_rules, self.postprocs = [], [RejectIllegal()]
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
