"""In-process MetaSchedule builder and runner.

MetaSchedule's ``LocalBuilder``/``LocalRunner`` build and time in popen workers that each import
TVM first (~13 s on our loaded 2-core machine), which made 8 builds time out.  These keep
MetaSchedule's protocol (``PyBuilder``/``PyRunner``, ``BuilderResult``/``RunnerResult``) but
compile with ``tvm.compile`` and time with ``time_evaluator`` in the tuning process itself.
The artifact path names an empty temporary folder (MetaSchedule's ``RemoveBuildArtifact``
callback deletes it) and keys a process-local table of built modules.
"""
import os
import tempfile

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerResult

_BUILT = {}


@derived_object
class InProcessBuilder(PyBuilder):
    """Compiles each candidate with ``tvm.compile`` in this process."""

    def build(self, build_inputs):
        from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
        results = []
        for inp in build_inputs:
            try:
                mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(inp.mod)
                key = os.path.join(tempfile.mkdtemp(prefix="wm_build_"), "module")
                _BUILT[key] = tvm.compile(mod, target=inp.target)
                results.append(BuilderResult(key, None))
            except Exception as err:  # a bad candidate is reported, not fatal (as LocalBuilder)
                results.append(BuilderResult(None, f"{type(err).__name__}: {err}"))
        return results


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
    """Times a built candidate on the CPU: ``repeat`` medians of ``number`` runs (random inputs)."""

    def __init__(self, number=3, repeat=3, min_repeat_ms=10):
        super().__init__()
        self.number, self.repeat, self.min_repeat_ms = number, repeat, min_repeat_ms

    def run(self, runner_inputs):
        dev = tvm.cpu()
        futures = []
        for inp in runner_inputs:
            rt = _BUILT.pop(inp.artifact_path, None)
            if rt is None:
                futures.append(_Done(None, f"artifact {inp.artifact_path!r} was not built here"))
                continue
            try:
                args = [tvm.runtime.tensor(_random(info.shape, info.dtype), dev)
                        for info in inp.args_info]
                mod = rt.mod if hasattr(rt, "mod") else rt
                name = mod.entry_name if getattr(mod, "entry_name", None) else "main"
                evaluator = mod.time_evaluator(name, dev, number=self.number, repeat=self.repeat,
                                               min_repeat_ms=self.min_repeat_ms)
                futures.append(_Done([float(x) for x in evaluator(*args).results], None))
            except Exception as err:
                futures.append(_Done(None, f"{type(err).__name__}: {err}"))
        return futures


def _random(shape, dtype):
    shape = [int(s) for s in shape]
    rng = np.random.default_rng(0)
    if "int" in str(dtype):
        return rng.integers(0, 4, size=shape).astype(str(dtype))
    return rng.uniform(-1, 1, size=shape).astype(str(dtype))
