"""The builder of candidates: a scan's annotated workload realized, then compiled; any other
task's scheduled PrimFunc built as MetaSchedule's own builder builds it.

Built in the tuning process (``InProcessBuilder``): MetaSchedule's ``LocalBuilder`` starts a
fresh worker pool for every batch, and a fresh process imports TVM (~5 s on this project's
2-core machines) before building a kernel in a fraction of that: a whole-model run of 3
trials a task spent 280 of its 310 s starting builders.  The kernel is compiled as the
module's ``main``, the entry the ``LocalRunner`` times, with the workload's arguments.
"""
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.builder.local_builder import default_build, default_export

from .features import is_scan_workload
from .realize import realize_module


def build_candidate(mod, target, params=None):
    """``f_build``: annotated scan workload -> compiled realized kernel; another task's
    candidate -> MetaSchedule's ``default_build``."""
    if not is_scan_workload(mod):
        return default_build(mod, target, params)
    return tvm.compile(realize_module(mod, target), target=target).mod


@derived_object
class InProcessBuilder(PyBuilder):
    """Builds each candidate with ``build_candidate`` in this process and exports it for the
    runner; a build that raises is that candidate's error (an LLVM crash would end the run:
    CPU builds of scheduled TIR do not crash in practice, and the time saved is the run's)."""

    def build(self, build_inputs):
        results = []
        for item in build_inputs:
            try:
                results.append(BuilderResult(default_export(build_candidate(item.mod, item.target)), None))
            except Exception as err:          # pylint: disable=broad-except (the candidate's error)
                results.append(BuilderResult(None, f"InProcessBuilder: {type(err).__name__}: {err}"))
        return results


def scan_builder():
    """The builder of every candidate ``sw.tune`` measures (``InProcessBuilder``)."""
    return InProcessBuilder()
