"""The builder of candidates: a scan's annotated workload realized, then compiled; any other
task's scheduled PrimFunc built as MetaSchedule's own builder builds it.

Built in one long-lived worker process (``PooledBuilder``), with a time limit per candidate.
MetaSchedule's ``LocalBuilder`` starts a fresh worker pool for every batch, and a fresh
process imports TVM (~5 s on this project's 2-core machines) before building a kernel in a
fraction of that: a whole-model run of 3 trials a task spent 280 of its 310 s starting
builders.  Building in the tuning process itself avoids that but has no time limit, and some
candidates never finish: a softmax whose sampled unrolling makes TVM's lowering recurse for
more than 15 minutes stalled a dataset run.  One worker kept across batches has both: it
starts once (and again after ``max_uses`` builds, for the worker leak ``LocalBuilder``
restarts its pool for, or after a candidate ran out of time and was killed).
"""
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.builder.local_builder import default_build, default_export
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

from .features import is_scan_workload
from .realize import realize_module


def build_candidate(mod, target, params=None):
    """``f_build``: annotated scan workload -> compiled realized kernel; another task's
    candidate -> MetaSchedule's ``default_build``."""
    if not is_scan_workload(mod):
        return default_build(mod, target, params)
    return tvm.compile(realize_module(mod, target), target=target).mod


def _start_worker():
    """The worker's first step, before any time limit: TVM's tensor intrinsics, which some
    build imports (25 s the plain way, 3 s through ``load_tensor_intrin``)."""
    from .task import load_tensor_intrin
    load_tensor_intrin()


def build_and_export(mod, target):
    """What the worker runs: the candidate built and exported as a shared library (the
    module's ``main`` is the entry MetaSchedule's runners time)."""
    return default_export(build_candidate(mod, target))


@derived_object
class PooledBuilder(PyBuilder):
    """Builds each candidate with ``build_and_export`` in one worker process kept across
    batches; a candidate that raises or takes over ``timeout_sec`` is that candidate's error."""

    def __init__(self, timeout_sec=30.0, max_uses=256):
        super().__init__()
        self.timeout_sec, self.max_uses = timeout_sec, max_uses
        self.pool = None

    def build(self, build_inputs):
        if self.pool is None:
            self.pool = PopenPoolExecutor(max_workers=1, timeout=self.timeout_sec,
                                          maximum_process_uses=self.max_uses, initializer=_start_worker)
        results = []
        jobs = [(item.mod, item.target) for item in build_inputs]
        for done in self.pool.map_with_error_catching(lambda job: build_and_export(*job), jobs):
            if done.status == StatusKind.COMPLETE:
                results.append(BuilderResult(done.value, None))
            elif done.status == StatusKind.TIMEOUT:
                results.append(BuilderResult(None, f"PooledBuilder: timeout, killed after {self.timeout_sec} s"))
            else:
                results.append(BuilderResult(None, f"PooledBuilder: {done.value}"))
        return results


_SHARED = []


def scan_builder():
    """The builder of every candidate ``sw.tune`` measures: one ``PooledBuilder`` per process,
    so its worker starts once however many tunings run (each start costs ~6 s here)."""
    if not _SHARED:
        _SHARED.append(PooledBuilder())
    return _SHARED[0]
