"""``sw.tune``: MetaSchedule search over the scan realizations of a model (or one spec).

Each scan that ``FuseAffineRecurrences`` finds becomes one MetaSchedule task
(``tir_schedules.search``): its knobs are sampled decisions, candidates are realized, built
and timed on the target, and the records go to a ``JSONDatabase`` in ``work_dir``.
``sw.compile(mod, target, database=db)`` then lowers every tuned scan with its best record.
"""
from pathlib import Path

import tvm
from tvm import relax

import tir_schedules
from tir_schedules import search

from scanweaver_core.spec import AffineScanSpec, MatrixScanSpec, SelectiveScanSpec, StabilizedScanSpec

COST_MODELS = ("xgb", "world", "random")


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


def tune(mod_or_spec, target="llvm", trials=64, cost_model="xgb", work_dir="scanweaver_tuning",
         seed=0, progress=True, world_model=None):
    """Tune every scan of ``mod_or_spec`` (a Relax ``IRModule`` or a scan spec) on ``target``
    with ``trials`` measured candidates per scan; returns the MetaSchedule ``JSONDatabase`` in
    ``work_dir`` (pass it to ``sw.compile(..., database=db)``).

    ``cost_model``: ``"xgb"`` (XGBoost on the realized kernels' ``PerStoreFeature``s),
    ``"world"`` (``tir_schedules.world_model``, loaded from ``world_model`` when given),
    ``"random"``, or a ``tvm.s_tir.meta_schedule.cost_model.CostModel``.  ``"llvm"`` means this
    CPU (candidates are timed here); a CUDA target needs a GPU on this machine."""
    if isinstance(mod_or_spec, (AffineScanSpec, SelectiveScanSpec, MatrixScanSpec, StabilizedScanSpec)):
        specs = [mod_or_spec]
    elif isinstance(mod_or_spec, tvm.IRModule):
        specs = scan_specs(mod_or_spec)
        if not specs:
            raise ValueError("mod: FuseAffineRecurrences finds no scan in this module; nothing to tune")
    else:
        raise TypeError("mod_or_spec: expected a Relax IRModule or a scan spec, "
                        f"got {type(mod_or_spec).__name__}")
    for spec in specs:
        if spec.is_symbolic:
            raise ValueError(f"spec: {spec} has symbolic extents; tuning times kernels, give concrete "
                             "sizes (tune a fixed-size import; its records serve only those sizes)")
    if isinstance(cost_model, str) and cost_model not in COST_MODELS:
        raise ValueError(f"cost_model: {cost_model!r} is not one of {COST_MODELS} or a CostModel")
    target = tir_schedules.resolve_target(target)
    # one cost model for all scans, as MetaSchedule shares one across a model's tasks
    model = world_cost_model(world_model) if cost_model == "world" else search.make_cost_model(cost_model)
    builder, runner = search.scan_builder(), search.scan_runner(target)
    database = None
    for spec in specs:
        database = search.tune_task(spec, target, model, trials=trials, seed=seed, work_dir=work_dir,
                                    progress=progress, builder=builder, runner=runner)
    return database
