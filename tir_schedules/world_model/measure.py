"""In-process MetaSchedule runner for the dataset and the evaluation.

Candidates are built by ``tir_schedules.search.PooledBuilder`` (the builder ``sw.tune``
uses: MetaSchedule's ``default_build`` in a long-lived worker, exported to a shared library)
and timed here, in the same process, with ``time_evaluator``: no worker process to start
(MetaSchedule's ``LocalRunner`` pays a TVM import per worker on this 2-core machine).  It keeps
MetaSchedule's protocol (``PyRunner``, ``RunnerResult``).
"""
import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerResult


@derived_object
class _Done(PyRunnerFuture):
    def __init__(self, secs, error):
        super().__init__()
        self.secs, self.error = secs, error

    def done(self):
        return True

    def result(self):
        return RunnerResult(self.secs, self.error)


@derived_object
class InProcessRunner(PyRunner):
    """Times a built candidate on the CPU: ``repeat`` timings, each of ``number`` runs (grown
    until a timing lasts ``min_repeat_ms``), on random inputs.  One run: a slow candidate is
    timed 3 times, a fast one often enough to rise above the timer's noise."""

    def __init__(self, number=1, repeat=3, min_repeat_ms=10):
        super().__init__()
        self.number, self.repeat, self.min_repeat_ms = number, repeat, min_repeat_ms

    def run(self, runner_inputs):
        dev = tvm.cpu()
        futures = []
        for inp in runner_inputs:
            try:
                mod = tvm.runtime.load_module(inp.artifact_path)
                args = [tvm.runtime.tensor(random_input(info.shape, info.dtype), dev) for info in inp.args_info]
                evaluator = mod.time_evaluator("main", dev, number=self.number, repeat=self.repeat,
                                               min_repeat_ms=self.min_repeat_ms)
                futures.append(_Done([float(x) for x in evaluator(*args).results], None))
            except Exception as err:  # pylint: disable=broad-except (the candidate's error, as LocalRunner)
                futures.append(_Done(None, f"InProcessRunner: {type(err).__name__}: {err}"))
        return futures


def random_input(shape, dtype):
    """A seeded random array to time a kernel on (small ints for index inputs)."""
    shape = [int(s) for s in shape]
    rng = np.random.default_rng(0)
    if "int" in str(dtype):
        return rng.integers(0, 4, size=shape).astype(str(dtype))
    return rng.uniform(-1, 1, size=shape).astype(str(dtype))
