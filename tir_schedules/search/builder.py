"""The builder of scan candidates: realize the annotated workload, then compile it.

MetaSchedule's ``LocalBuilder`` runs ``build_candidate`` in its worker processes (it pickles
the function by reference; the worker imports this module).  The kernel is compiled as the
module's ``main``, the entry the ``LocalRunner`` times, with the workload's arguments.
"""
import tvm
from tvm.s_tir import meta_schedule as ms

from .realize import realize_module


def build_candidate(mod, target, _params=None):
    """``f_build`` for ``LocalBuilder``: annotated workload -> compiled realized kernel."""
    return tvm.compile(realize_module(mod, target), target=target).mod


def scan_builder(max_workers=1, timeout_sec=60.0):
    """A ``LocalBuilder`` that builds realized scan kernels (one worker by default: this
    project's CI machines have two cores, and the runner measures on them)."""
    return ms.builder.LocalBuilder(f_build=build_candidate, max_workers=max_workers,
                                   timeout_sec=timeout_sec)
