"""A message, not a silent wait, when TVM's build of what ``sw.compile`` hands it runs long.

Our CPU rules bound what they write (``tir_schedules.cpu_rule``), but TVM's own passes may still
take long on a function: a huge unrolled model, a function the rules left to TVM, a TVM bug.
``watch(budget_s)`` follows the passes TVM runs (a ``PassInstrument`` on the current
``PassContext``); once one pass has run ``budget_s`` seconds, a warning (logger ``scanweaver``)
names it, the module's largest PrimFuncs written out as trees (``tree_size``) and the rule
that scheduled each (``scanweaver.rule``), and it says so again every further ``budget_s``.
The compile goes on: TVM's C++ cannot be interrupted from Python, and a slow compile that
finishes is still a result.
"""
import contextlib
import logging
import threading
import time

import tvm
from tvm import tirx

from tir_schedules.cpu_rule import RULE_ATTR
from tir_schedules.tree_size import tree_size

LOG = logging.getLogger("scanweaver")
BUDGET_S = 120.0


@contextlib.contextmanager
def watch(budget_s=BUDGET_S, largest=3):
    """Within the block, a pass of TVM's that runs over ``budget_s`` is reported as it runs."""
    running = []                                  # (pass name, start, module), innermost last
    done = threading.Event()

    @tvm.instrument.pass_instrument
    class _Follow:  # pylint: disable=too-few-public-methods
        def run_before_pass(self, mod, info):
            running.append((info.name, time.monotonic(), mod))

        def run_after_pass(self, _mod, _info):
            running.pop()

    def watcher():
        next_report = {}                          # (pass, start) -> seconds at which to report
        while not done.wait(min(budget_s, 5.0)):
            if not running:
                continue
            name, start, mod = running[-1]
            elapsed = time.monotonic() - start
            if elapsed >= next_report.get((name, start), budget_s):
                next_report[(name, start)] = elapsed + budget_s
                LOG.warning(message(name, elapsed, mod, largest))

    current = tvm.transform.PassContext.current()
    context = tvm.transform.PassContext(
        opt_level=current.opt_level, required_pass=list(current.required_pass),
        disabled_pass=list(current.disabled_pass), instruments=list(current.instruments) + [_Follow()],
        config=dict(current.config))
    thread = threading.Thread(target=watcher, daemon=True, name="scanweaver-compile-watch")
    with context:
        thread.start()
        try:
            yield
        finally:
            done.set()


def message(pass_name, elapsed, mod, largest=3):
    """What the warning says: the pass, how long, and the largest PrimFuncs with their rules."""
    sizes = sorted(((tree_size(f), gv.name_hint, (f.attrs or {}).get(RULE_ATTR))
                    for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)), reverse=True)
    funcs = "; ".join(f"{_short(name)} ({size} nodes as a tree, scheduled by {rule or 'no rule of ours'})"
                      for size, name, rule in sizes[:largest])
    return (f"sw.compile: TVM's pass {pass_name} has run {elapsed:.0f} s (the compile goes on). "
            f"Largest functions: {funcs or 'none'}")


def _short(name, most=60):
    """A fused function's name (one word per op fused: thousands of characters) cut short."""
    return name if len(name) <= most else f"{name[:most - 20]}...{name[-17:]}"
