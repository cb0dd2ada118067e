"""``sw.tune``: MetaSchedule search over every kernel of a model (or one scan spec).

Each scan that ``FuseAffineRecurrences`` finds becomes one MetaSchedule task
(``tir_schedules.search``): its knobs are sampled decisions, candidates are realized, built
and timed on the target.  On a CPU the model's other kernels (dense layers, convolutions,
norms, elementwise groups: the fused PrimFuncs that ``sw.compile``'s pipeline schedules with
its rules) are MetaSchedule tasks too (``model_tasks``), tuned together by its gradient task
scheduler, which shares the trials among them by their weight (calls x cost).  Records go to
one ``JSONDatabase`` in ``work_dir``; the one ``tune`` returns holds each kernel's best record
where it beats our rule (``rule_check``), and ``sw.compile(mod, target, database=db)`` lowers
every scan and kernel with a record by it and keeps the rules for the rest.
"""
import sys
from pathlib import Path

import tvm
from tvm import relax

import tir_schedules
from tir_schedules import search
from tir_schedules.tir_blocks import only_moves_data

from scanweaver_core.spec import AffineScanSpec, MatrixScanSpec, SelectiveScanSpec, StabilizedScanSpec
from scanweaver_core.targets import physical_cores

from . import rule_check

COST_MODELS = ("xgb", "world", "random")
APPLIED = "applied"   # work_dir's folder of the records sw.compile applies (rule_check)


def scan_specs(mod):
    """The distinct scan specs of a Relax module, after ``FuseAffineRecurrences``, in order."""
    from relax_pass.fuse import FuseAffineRecurrences
    from scanweaver_core.scan_op import parse_scan

    fused = FuseAffineRecurrences()(mod)
    specs = []

    def visit(expr):
        parsed = parse_scan(expr)
        if parsed is not None and parsed[0] not in specs:
            specs.append(parsed[0])

    for _, func in fused.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return specs


# weights pretrained by ``python -m tir_schedules.world_model.pretrain``, inside the package
PRETRAINED_WORLD_MODEL = Path(__file__).resolve().parents[1] / "tir_schedules" / "world_model" / "pretrained.pt"


def world_cost_model(path=None):
    """The latent-dynamics cost model (``tir_schedules.world_model``), loaded from ``path``;
    by default the pretrained weights shipped with it (untrained when they are absent)."""
    try:
        from tir_schedules.world_model import WorldModelCostModel
    except ImportError as err:
        raise RuntimeError("cost_model='world' needs tir_schedules.world_model.WorldModelCostModel, "
                           f"which cannot be imported here ({err}); use 'xgb' or 'random'") from err
    model = WorldModelCostModel()
    if path is None and PRETRAINED_WORLD_MODEL.exists():
        path = PRETRAINED_WORLD_MODEL
    if path is not None:
        model.load(str(path))
    return model


def model_tasks(mod, target="llvm"):
    """The MetaSchedule tasks (``ExtractedTask``) of a model's kernels other than its scans,
    on a CPU target: its fused PrimFuncs as ``sw.compile``'s pipeline has them just before it
    schedules them (``dense_cpu.tunable_passes``), each weighted by its calls.  Kernels
    already scheduled (the scans, realized by ``LowerScans``), kernels over symbolic shapes
    (MetaSchedule times a kernel at one size) and kernels that only move data
    (``only_moves_data``) are left out: the rules schedule them."""
    from tvm.s_tir import meta_schedule as ms

    from tir_schedules import dense_cpu

    from .api import _legalize_and_fold_at_once, passes

    target = tir_schedules.resolve_target(target)
    if target.kind.name != "llvm":
        raise NotImplementedError(f"target {target.kind.name}: whole-model tuning runs on a CPU target; "
                                  "tune the scans alone with sw.tune(spec, target)")
    with target:
        fused = tvm.transform.Sequential([passes(target), _legalize_and_fold_at_once(target)]
                                         + dense_cpu.tunable_passes(target))(mod)
    return [t for t in ms.relax_integration.extract_tasks(fused, target) if _tunable(t.dispatched[0]["main"])]


def _tunable(func):
    from tvm.s_tir import meta_schedule as ms

    if func.attrs is not None and "tirx.is_scheduled" in func.attrs:
        return False
    if only_moves_data(func):           # reshapes, transposes: a tiled copy from the rules is all they need
        return False
    try:
        args = ms.arg_info.ArgInfo.from_prim_func(func)
    except Exception:                 # pylint: disable=broad-except (a symbolic buffer: not tunable)
        return False
    return all(isinstance(d, (int, tvm.tirx.IntImm)) for a in args for d in getattr(a, "shape", ()))


def tune(mod_or_spec, target="llvm", trials=64, cost_model="xgb", work_dir="scanweaver_tuning",
         seed=0, progress=True, world_model=None):
    """Tune every kernel of ``mod_or_spec`` (a Relax ``IRModule``: its scans, and on a CPU
    every other kernel, ``model_tasks``; or one scan spec) on ``target`` with ``trials``
    measured candidates per task (all the model's other kernels share ``trials`` x their
    number, by MetaSchedule's gradient task scheduler); returns a MetaSchedule
    ``JSONDatabase`` to pass to ``sw.compile(..., database=db)``: for a scan spec, the one in
    ``work_dir``, every record; for a model, ``work_dir/applied``: each task's best record
    where its kernel beats the rule's (``rule_check``: both timed as compiled; the comparison
    in ``comparison.json`` there), and the scans' best.  ``work_dir`` keeps every measurement.

    ``cost_model``: ``"xgb"`` (XGBoost on ``PerStoreFeature``s; of the realized kernel for a
    scan), ``"world"`` (``tir_schedules.world_model``, loaded from ``world_model`` when
    given), ``"random"``, or a ``tvm.s_tir.meta_schedule.cost_model.CostModel``.  ``"llvm"``
    means this CPU (candidates are timed here); a CUDA target needs a GPU on this machine."""
    target = tir_schedules.resolve_target(target)
    if isinstance(mod_or_spec, (AffineScanSpec, SelectiveScanSpec, MatrixScanSpec, StabilizedScanSpec)):
        specs, tasks = [mod_or_spec], []
    elif isinstance(mod_or_spec, tvm.IRModule):
        specs = scan_specs(mod_or_spec)
        tasks = model_tasks(mod_or_spec, target) if target.kind.name == "llvm" else []
        if not specs and not tasks:
            raise ValueError("mod: no scan and no kernel with static shapes to tune in this module")
    else:
        raise TypeError("mod_or_spec: expected a Relax IRModule or a scan spec, "
                        f"got {type(mod_or_spec).__name__}")
    if not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials: {trials!r} must be a positive int")
    for spec in specs:
        if spec.is_symbolic:
            raise ValueError(f"spec: {spec} has symbolic extents; tuning times kernels, give concrete "
                             "sizes (tune a fixed-size import; its records serve only those sizes)")
    if isinstance(cost_model, str) and cost_model not in COST_MODELS:
        raise ValueError(f"cost_model: {cost_model!r} is not one of {COST_MODELS} or a CostModel")
    # one cost model for all tasks, as MetaSchedule shares one across a model's tasks
    model = world_cost_model(world_model) if cost_model == "world" else search.make_cost_model(cost_model)
    builder, runner = search.scan_builder(), search.scan_runner(target)
    for spec in specs:
        search.tune_task(spec, target, model, trials=trials, seed=seed, work_dir=work_dir,
                         progress=progress, builder=builder, runner=runner)
    if not tasks:
        return _database(work_dir)
    _tune_model_tasks(tasks, target, model, trials, seed, work_dir, builder, runner)
    every = _database(work_dir)
    comparisons = rule_check.compare(mod_or_spec, target, every, {t.task_name for t in tasks})
    if progress:
        for c in comparisons:
            print(f"[tune] {c.task}: rule {c.rule_us:.1f} us, best record {c.tuned_us:.1f} us: "
                  f"{'record' if c.kept else 'rule'} kept", file=sys.stderr, flush=True)
    return rule_check.winning_records(every, tasks, comparisons, Path(work_dir) / APPLIED)


def _tune_model_tasks(tasks, target, model, trials, seed, work_dir, builder, runner):
    """MetaSchedule's own loop over ``tasks``: its CPU design space and evolutionary search
    (the population kept small: this machine has two cores), its gradient task scheduler."""
    from tvm.s_tir import meta_schedule as ms

    search.load_tensor_intrin()
    if "num-cores" not in target.attrs:              # (MetaSchedule's CPU space needs it)
        target = tvm.target.Target({**target.export(), "num-cores": physical_cores()})
    strategy = search.evolutionary_search()
    contexts = [ms.TuneContext(mod=t.dispatched[0], target=target, space_generator="post-order-apply",
                               search_strategy=strategy.clone(), task_name=t.task_name, rand_state=seed + 1,
                               num_threads=1)
                for t in tasks]
    ms.tune_tasks(tasks=contexts, task_weights=[float(t.weight) for t in tasks], work_dir=str(work_dir),
                  max_trials_global=trials * len(tasks), max_trials_per_task=trials,
                  num_trials_per_iter=min(trials, 16), builder=builder, runner=runner,
                  database=_database(work_dir), cost_model=model, task_scheduler="gradient")


def _database(work_dir):
    from tvm.s_tir import meta_schedule as ms

    Path(work_dir).mkdir(parents=True, exist_ok=True)
    return ms.database.JSONDatabase(work_dir=str(work_dir))
