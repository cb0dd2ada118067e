"""One rank's part of a scan, compiled and run: ``compile_part`` (``relax_pass.split.scan.build``
through ``scanweaver_tvm.compile``) and ``run_part``."""
import numpy as np
import tvm
from tvm import relax

from relax_pass.split.scan import build
from scanweaver_core.sequence_parts import split_operands, view

from . import collective  # noqa: F401  (registers the all-gather extern the module calls)


def compile_part(spec, world_size, target="llvm"):
    """A ``relax.VirtualMachine`` with ``summarize``, ``finish`` and ``main`` of one rank's part
    of ``spec`` (the whole scan's spec) among ``world_size`` ranks, compiled for ``target``
    (any part's length: it is symbolic)."""
    from .. import api   # pylint: disable=import-outside-toplevel

    target = api._target(target)     # pylint: disable=protected-access
    ex = api.compile(build(spec, world_size), target)
    device = tvm.device(target.kind.name if target.kind.name != "llvm" else "cpu")
    return relax.VirtualMachine(ex, device)


def run_part(vm, spec, part, rank):
    """``{output name: array}`` of this rank's part: ``part`` is its operands (``{name:
    array}``, per-step inputs sliced to its steps as ``split_operands`` does; initial states
    whole), run through ``main`` (whose all-gather waits for every rank)."""
    shown = view(spec)
    missing = [n for n in shown.operands if n not in part]
    if missing:
        raise ValueError(f"{type(spec).__name__}: missing operands {', '.join(missing)}")
    res = vm["main"](*[tvm.runtime.tensor(np.array(part[n], order="C")) for n in shown.operands],
                     tvm.runtime.tensor(np.array(rank, dtype=np.int64)))
    res = [res] if hasattr(res, "numpy") else list(res)
    return dict(zip(shown.outputs, (r.numpy() for r in res)))


def run_whole_split(spec, operands, rank, world_size, target="llvm"):
    """This rank's outputs of ``spec`` over the whole ``operands`` (every rank passes the same):
    its part cut out (``split_operands``), compiled and run."""
    return run_part(compile_part(spec, world_size, target), spec, split_operands(spec, operands, world_size)[rank],
                    rank)
