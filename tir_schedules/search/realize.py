"""From a point of the space (an annotated workload, a trace, a tuning record) to the kernel.

The annotations on the workload's ``scan`` block name the realization and its knob values;
``realize_choice`` turns them into the realization's scheduled PrimFunc, exactly what
``tir_schedules.realize`` makes with that config.  The builder, the feature extractor and
``LowerScans`` (through ``best_choice``) all go through here, so what is measured, what the
cost model sees and what gets compiled are the same kernel.
"""
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.postproc import PyPostproc

import tir_schedules

from .space import PREFIX, SCHEDULE_KEY, knob_values, legal, realizations
from .workload import BLOCK, workload_module, workload_spec


@dataclass(frozen=True)
class Choice:
    """One point of the space: a spec, a realization name and its knob values."""

    spec: object
    schedule: str
    config: tuple  # ((knob, value), ...) sorted by knob

    @property
    def knobs(self):
        return dict(self.config)

    def __str__(self):
        return f"{self.schedule}(" + ", ".join(f"{k}={v}" for k, v in self.config) + ")"


def default_choice(spec, target):
    """The choice ``tir_schedules.realize(spec, target)`` makes without tuning (the first of
    the spec's own realizations: the space holds no borrowed one)."""
    kind = tir_schedules.target_kind(target)
    own = tir_schedules._native(spec, kind)  # noqa: SLF001 (realize's own preference)
    if not own:
        raise ValueError(f"spec: no {kind} realization of its own form to tune for {spec}")
    name = own[0]
    config = tir_schedules.REALIZATIONS[name].default_config(spec)
    return Choice(spec, name, tuple(sorted((k, int(v)) for k, v in config.items())))


def _scan_block(func):
    found = []
    tvm_ffi.structural_walk(func.body, lambda node: found.append(node) if (
        isinstance(node, s_tir.SBlock) and node.name_hint == BLOCK) else None)
    if len(found) != 1:
        raise ValueError(f"workload: expected one block {BLOCK!r}, found {len(found)}")
    return found[0]


def choice_of(mod):
    """The ``Choice`` annotated on a workload module (``sch.mod`` of a sampled schedule)."""
    func = mod["main"]
    spec = workload_spec(func)
    ann = _scan_block(func).annotations
    if SCHEDULE_KEY not in ann:
        raise ValueError(f"workload: block {BLOCK!r} has no {SCHEDULE_KEY!r} annotation (not sampled)")
    name = str(ann[SCHEDULE_KEY])
    knobs = knob_values(name, spec)
    config = []
    for knob in knobs:
        key = PREFIX + knob
        if key not in ann:
            raise ValueError(f"workload: block {BLOCK!r} lacks the {key!r} annotation of {name}")
        config.append((knob, int(ann[key])))
    return Choice(spec, name, tuple(sorted(config)))


@derived_object
class RejectIllegal(PyPostproc):
    """Fails a candidate whose knobs do not go together (``space.legal``: too many threads,
    too much shared memory, a combination the kernel would clamp into another), so the
    evolutionary search drops it before it is built or scored."""

    def _initialize_with_tune_context(self, context):
        pass

    def apply(self, sch):
        choice = choice_of(sch.mod)
        return legal(choice.schedule, choice.spec, choice.knobs)

    def clone(self):
        return RejectIllegal()


def realize_choice(choice, target=None):
    """The scheduled PrimFunc of ``choice`` (function name ``scanweaver_scan``).  With a target,
    the realization must be one of that target's."""
    if target is not None and choice.schedule not in realizations(choice.spec, target):
        raise ValueError(f"schedule: {choice.schedule!r} is not a realization of this spec "
                         f"for target {tvm.target.Target(target).kind.name}")
    module = tir_schedules.REALIZATIONS[choice.schedule]
    defaults = module.default_config(choice.spec)
    config = {k: (bool(v) if isinstance(defaults[k], bool) else v) for k, v in choice.config}
    return module.generate(choice.spec, **config)


def realize_module(mod, target=None):
    """An annotated workload module -> an IRModule whose ``main`` is the realized kernel."""
    func = realize_choice(choice_of(mod), target)
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def choice_of_trace(trace, spec):
    """Replay ``trace`` (a tuning record's) on the spec's workload and read its choice."""
    sch = tvm.s_tir.Schedule(workload_module(spec))
    trace.apply_to_schedule(sch, remove_postproc=True)
    return choice_of(sch.mod)


def best_choice(database, spec, target):
    """The fastest recorded choice for ``spec`` on ``target``'s kind in ``database``, or None.

    Records are keyed by the canonical workload; those whose realization belongs to another
    target kind (a CUDA record in a shared database) are skipped."""
    if spec.is_symbolic:
        return None  # symbolic extents: nothing was (or can be) measured
    workload_mod = workload_module(spec)
    if not database.has_workload(workload_mod):
        return None
    workload = database.commit_workload(workload_mod)
    allowed = set(realizations(spec, target))
    for record in database.get_top_k(workload, 64):
        choice = choice_of_trace(record.trace, spec)
        if choice.schedule in allowed:
            return choice
    return None
