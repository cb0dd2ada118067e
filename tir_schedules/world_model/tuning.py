"""Tune one task with MetaSchedule and record every measured trial in order.

``tune`` builds a ``TuneContext`` on the task's initial program (MetaSchedule's default CPU
design space, ``post-order-apply``) and runs ``ms.tune_tasks`` with the in-process builder
(``sw.tune``'s ``PooledBuilder``, one per process) and runner (``measure.py``), a given search strategy and cost model.  ``Recorder`` keeps
``(trace JSON, run seconds)`` per trial in measurement order, which the dataset stores and the
evaluation turns into best-so-far curves.
"""
import tempfile

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from tir_schedules.search.builder import scan_builder

from .measure import InProcessRunner
from .trace_json import plain


def tuning_target(cores=1):
    """The host LLVM target with ``num-cores`` (MetaSchedule's CPU rules need it)."""
    from tir_schedules import host_target
    return tvm.target.Target({**host_target().export(), "num-cores": cores})


@derived_object
class Recorder(PyMeasureCallback):
    """Appends ``{"trace": JSON, "secs": [...] or None}`` for each measured candidate."""

    def __init__(self):
        self.trials = []

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        for cand, built, ran in zip(measure_candidates, builder_results, runner_results):
            ok = built.error_msg is None and ran.error_msg is None and ran.run_secs
            self.trials.append({"trace": plain(cand.sch.trace.as_json()),
                                "secs": [float(s) for s in ran.run_secs] if ok else None})


def strategy(kind):
    """``"random"``: ``ReplayTrace`` (uniform samples of the design space); ``"evolutionary"``:
    the evolutionary search ``sw.tune`` runs (``tir_schedules.search.evolutionary_search``)."""
    if kind == "random":
        return ms.search_strategy.ReplayTrace()
    if kind == "evolutionary":
        from tir_schedules.search import evolutionary_search
        return evolutionary_search()
    raise ValueError(f"strategy {kind!r}: expected 'random' or 'evolutionary'")


def tune(mod, target, search="evolutionary", cost_model="random", trials=64, seed=0,
         per_iter=16, work_dir=None, runner=None, database=None):
    """Tune ``mod`` (IRModule with ``main``); returns the ``Recorder``'s trial list.

    ``database``: where MetaSchedule commits the records (default: in memory)."""
    from tir_schedules.search.task import load_tensor_intrin

    load_tensor_intrin()   # what every TuneContext imports, in seconds instead of minutes
    recorder = Recorder()
    with tempfile.TemporaryDirectory(prefix="wm_tune_") as tmp:
        work_dir = work_dir or tmp
        context = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                                 search_strategy=strategy(search), task_name="main",
                                 rand_state=seed + 1, num_threads=1)
        callbacks = list(ms.measure_callback.MeasureCallback.create("default")) + [recorder]
        ms.tune_tasks(tasks=[context], task_weights=[1.0], work_dir=work_dir,
                      max_trials_global=trials, num_trials_per_iter=per_iter,
                      builder=scan_builder(), runner=InProcessRunner() if runner is None else runner,
                      database=ms.database.MemoryDatabase() if database is None else database,
                      cost_model=cost_model,
                      measure_callbacks=callbacks, task_scheduler="round-robin")
    return recorder.trials


def median_secs(trial):
    return float(np.median(trial["secs"])) if trial["secs"] else float("inf")
