"""One scan as a MetaSchedule tuning task, and its tuning with any cost model.

``scan_task`` gives the pieces (workload, space generator, builder, feature extractor);
``tune_task`` runs MetaSchedule's own loop (``ms.tune_tasks``: evolutionary search, the
given cost model, ``PooledBuilder`` + ``LocalRunner``, a ``JSONDatabase`` in ``work_dir``).
Before searching it measures the realization's default choice and commits it like any other
record, so the search starts from the hand-tuned point and its best is never worse than it.
"""
import importlib
import inspect
import os
import sys
import time

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from .builder import scan_builder
from .features import RealizedFeatures
from .realize import choice_of, default_choice
from .space import ScanSpace, sample
from .workload import form_of, require_static, workload_module


def scan_task(spec, target, with_builder=True):
    """``(workload, space_generator, builder, feature_extractor)`` for ``spec`` on ``target``:
    the canonical workload IRModule (the database key), a ``ScanSpace``, a builder
    that realizes before compiling, and ``RealizedFeatures`` (``PerStoreFeature`` of the
    realized kernel) for learned cost models."""
    target = tvm.target.Target(target)
    builder = scan_builder() if with_builder else None
    return workload_module(spec), ScanSpace(target), builder, RealizedFeatures()


def task_name(spec):
    """``affine_2x64x300`` / ``selective_1x1536x1024x16`` / ``matrix_1x16x2048x64x64_key``:
    the task's name in logs."""
    form = form_of(spec)
    if form == "affine":
        return "affine_" + "x".join(map(str, spec.shape))
    if form == "stabilized":
        return "stabilized_" + "x".join(map(str, (spec.batch, spec.channels, spec.length))) + f"_{spec.decay}"
    if form == "delta":
        dims = (spec.batch, spec.heads, spec.length, spec.key, spec.value)
        return "delta_" + "x".join(map(str, dims)) + f"_{spec.decay}"
    if form == "mlstm":
        dims = (spec.batch, spec.heads, spec.length, spec.key, spec.value)
        return "mlstm_" + "x".join(map(str, dims)) + ("_normalized" if spec.normalized else "")
    if form == "matrix":
        dims = (spec.batch, spec.heads, spec.length, spec.key, spec.value)
        return "matrix_" + "x".join(map(str, dims)) + f"_{spec.decay}"
    return "selective_" + "x".join(map(str, (spec.batch, spec.dim, spec.length, spec.dstate)))


def load_tensor_intrin():
    """Import ``tvm.s_tir.tensor_intrin`` (every ``TuneContext`` does) in seconds, not minutes.

    Its ~500 TVMScript functions each call ``inspect.stack()``, and for every frame of the
    import chain that is not a file (``<frozen importlib...>``) ``inspect.getmodule`` rescans
    all of ``sys.modules``: 100+ s on this project's 2-core machines.  While importing, the
    lookups are memoized per file name (no module can appear for a frozen name meanwhile)."""
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    original, memo = inspect.getmodule, {}

    def getmodule(obj, _filename=None):
        if _filename is None:
            return original(obj)
        if _filename not in memo:
            memo[_filename] = original(obj, _filename)
        return memo[_filename]

    inspect.getmodule = getmodule
    try:
        importlib.import_module("tvm.s_tir.tensor_intrin")
    finally:
        inspect.getmodule = original


def make_cost_model(kind, extractor=None):
    """``"xgb"`` (XGBoost on realized-kernel features), ``"random"``, or a ``CostModel``."""
    if isinstance(kind, ms.cost_model.CostModel):
        return kind
    if kind == "xgb":
        return ms.cost_model.XGBModel(extractor=extractor or RealizedFeatures(),
                                      num_warmup_samples=0, adaptive_training=False,
                                      num_tuning_cores=1)
    if kind == "random":
        return ms.cost_model.RandomModel()
    raise ValueError(f"cost_model: {kind!r} is not one of 'xgb', 'random' or a CostModel instance")


def evolutionary_search():
    """The search ``sw.tune`` runs on a model's kernels: MetaSchedule's evolutionary search,
    its population kept small for a 2-core machine.  It never looks at its trial budget except
    to stop, so the first n trials of a longer run are an n-trial run."""
    return ms.search_strategy.EvolutionarySearch(
        population_size=128, init_measured_ratio=0.2, init_min_unmeasured=32, genetic_num_iters=3,
        genetic_mutate_prob=0.85, max_fail_count=8)


def scan_runner(target):
    """A ``LocalRunner`` timing each kernel as the mean over >= 3 x 20 ms of calls."""
    config = ms.runner.EvaluatorConfig(number=1, repeat=3, min_repeat_ms=20)
    return ms.runner.LocalRunner(evaluator_config=config, timeout_sec=60)


@derived_object
class Progress(PyMeasureCallback):
    """Prints trials done and the best latency so far (with its choice) after each batch."""

    def __init__(self, name, total, stream=None):
        self.name, self.total, self.stream = name, total, stream or sys.stderr
        self.done, self.best, self.best_choice, self.start = 0, float("inf"), None, time.time()

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        for cand, built, ran in zip(measure_candidates, builder_results, runner_results):
            self.done += 1
            if built.error_msg is None and ran.error_msg is None and ran.run_secs:
                secs = float(np.mean([float(s) for s in ran.run_secs]))
                if secs < self.best:
                    self.best, self.best_choice = secs, choice_of(cand.sch.mod)
        best = "none yet" if self.best_choice is None else \
            f"{self.best * 1e3:.3f} ms {self.best_choice}"
        print(f"[tune {self.name}] {self.done}/{self.total} trials, best {best} "
              f"({time.time() - self.start:.0f} s)", file=self.stream, flush=True)


def _measure_default(spec, target, mod, builder, runner, database):
    """Build, time and commit the default choice (unless already in the database)."""
    choice = default_choice(spec, target)
    workload = database.commit_workload(mod)
    for record in database.get_top_k(workload, 1 << 16):
        sch = tvm.s_tir.Schedule(mod)
        record.trace.apply_to_schedule(sch, remove_postproc=True)
        if choice_of(sch.mod) == choice:
            return float(np.mean([float(s) for s in record.run_secs]))
    sch = sample(tvm.s_tir.Schedule(mod), choice.schedule, spec, fixed=choice.knobs)
    args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    (built,) = builder.build([ms.builder.BuilderInput(sch.mod, target)])
    if built.error_msg is not None:
        raise RuntimeError(f"default {choice} of {spec} failed to build: {built.error_msg}")
    device = "cuda" if target.kind.name == "cuda" else "cpu"
    (future,) = runner.run([ms.runner.RunnerInput(built.artifact_path, device, args_info)])
    ran = future.result()
    if ran.error_msg is not None:
        raise RuntimeError(f"default {choice} of {spec} failed to run: {ran.error_msg}")
    database.commit_tuning_record(ms.database.TuningRecord(
        sch.trace, workload, [float(s) for s in ran.run_secs], target, args_info))
    return float(np.mean([float(s) for s in ran.run_secs]))


def tune_task(spec, target, cost_model="xgb", trials=64, seed=0, work_dir="scanweaver_tuning",
              progress=True, num_trials_per_iter=None, measure_default=True, extractor=None,
              builder=None, runner=None):
    """Tune one scan spec with MetaSchedule; returns the ``JSONDatabase`` in ``work_dir``.

    ``cost_model``: any ``ms.cost_model.CostModel`` instance (e.g. a ``PyCostModel``
    subclass), ``"xgb"`` or ``"random"``.  ``trials`` counts measured candidates, the
    default choice included when ``measure_default``.  ``seed`` (>= 0) fixes the search's
    random state (MetaSchedule reserves 0, so it gets ``seed + 1``).  ``extractor`` overrides
    the features the built-in XGBoost model sees; ``builder``/``runner`` replace
    ``scan_builder()``/``scan_runner(target)`` (reuse the runner across calls: it starts a
    worker process).  Records are keyed by the spec's canonical
    workload, so ``tir_schedules.search.best_choice(db, spec, target)`` finds the best one."""
    if not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials: {trials!r} must be a positive int")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: {seed!r} must be a non-negative int")
    require_static(spec)        # before any worker process starts
    target = tvm.target.Target(target)
    mod, space, default_builder, features = scan_task(spec, target, builder is None)
    builder = builder or default_builder
    runner = runner or scan_runner(target)
    load_tensor_intrin()
    os.makedirs(work_dir, exist_ok=True)
    database = ms.database.JSONDatabase(work_dir=str(work_dir))
    name = task_name(spec)
    model = make_cost_model(cost_model, extractor or features)
    search_trials = trials
    if measure_default:
        secs = _measure_default(spec, target, mod, builder, runner, database)
        search_trials -= 1
        if progress:
            print(f"[tune {name}] default {default_choice(spec, target)}: {secs * 1e3:.3f} ms",
                  file=sys.stderr, flush=True)
    if search_trials < 1:
        return database
    per_iter = num_trials_per_iter or min(search_trials, 16)
    strategy = ms.search_strategy.EvolutionarySearch(
        population_size=64, init_measured_ratio=0.25, init_min_unmeasured=16,
        genetic_num_iters=3, genetic_mutate_prob=0.85, max_fail_count=8)
    context = ms.TuneContext(mod=mod, target=target, space_generator=space,
                             search_strategy=strategy, task_name=name, rand_state=seed + 1,
                             num_threads=1)
    callbacks = list(ms.measure_callback.MeasureCallback.create("default"))
    if progress:
        callbacks.append(Progress(name, search_trials))
    ms.tune_tasks(tasks=[context], task_weights=[1.0], work_dir=str(work_dir),
                  max_trials_global=search_trials, num_trials_per_iter=per_iter,
                  builder=builder, runner=runner, database=database, cost_model=model,
                  measure_callbacks=callbacks, task_scheduler="round-robin")
    return database
