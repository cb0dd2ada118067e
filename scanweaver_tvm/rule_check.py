"""Tuned records against the rules, kernel by kernel: what ``sw.tune`` hands to ``sw.compile``.

MetaSchedule tunes a model's kernels as the pipeline has them before our rules run, so its
schedules cannot pack constant weights, which ``DenseCPU`` does once at compile time.  With a
small budget a tuned schedule can lose to the rule, by a lot: HF Mamba's lm head (256 x 768 x
50280) ran 217 ms with its best record after 64 trials against 93 ms with the rule, and the
tuned model 2x slower than the untuned one.  So each task's record is kept only where the
kernel it gives, as ``sw.compile`` lowers it, is faster than the rule's kernel, both timed here
the same way (built alone, random inputs, medians of interleaved rounds).
"""
import json
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx

ROUNDS = 5
_SUFFIXES = re.compile(r"(_weights)?(_prepacked)?$")   # the pipeline's copies of a task's PrimFunc


class KernelComparison(NamedTuple):
    """One tuned task: its kernel's time with the rule's schedule and with its best record."""
    task: str
    rule_us: float
    tuned_us: float

    @property
    def kept(self):
        return self.tuned_us < self.rule_us


def compiled_kernels(mod, target, database, names):
    """``{task name: PrimFunc}``: the kernels ``sw.compile(mod, target, database=database)``
    builds for the tasks ``names`` (the pipeline's copies, ``*_weights``/``*_prepacked``,
    found by their task's name), scheduled, weights packed where the rule packs them."""
    from .api import pipeline

    lowered = pipeline(target, "tir", database)(mod)
    found = {}
    for gv, func in sorted(lowered.functions_items(), key=lambda item: not item[0].name_hint.endswith("_prepacked")):
        name = _SUFFIXES.sub("", gv.name_hint)
        if isinstance(func, tirx.PrimFunc) and name in names:
            found.setdefault(name, func)          # (the packed kernel where the rule packed a weight)
    return found


def _timer(func, target):
    from tvm.s_tir import meta_schedule as ms

    from tir_schedules.world_model.measure import random_input

    ex = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(random_input(a.shape, a.dtype), dev) for a in ms.arg_info.ArgInfo.from_prim_func(func)]
    evaluator = ex.jit().time_evaluator("main", dev, number=1, repeat=3, min_repeat_ms=20)
    return lambda: float(np.median(evaluator(*args).results))


def compare(mod, target, database, names):
    """``[KernelComparison]`` for the tasks ``names`` found in both builds (interleaved rounds)."""
    rule = compiled_kernels(mod, target, None, names)
    tuned = compiled_kernels(mod, target, database, names)
    timers = {n: (_timer(rule[n], target), _timer(tuned[n], target)) for n in sorted(set(rule) & set(tuned))}
    times = {n: ([], []) for n in timers}
    for _ in range(ROUNDS):
        for n, (with_rule, with_record) in timers.items():
            times[n][0].append(with_rule())
            times[n][1].append(with_record())
    return [KernelComparison(n, 1e6 * float(np.median(r)), 1e6 * float(np.median(t))) for n, (r, t) in times.items()]


def winning_records(database, tasks, comparisons, out_dir):
    """A ``JSONDatabase`` in ``out_dir`` (made anew) with each workload's best record, except
    the tasks whose rule kernel was faster; the comparisons go next to it
    (``comparison.json``)."""
    from tvm.s_tir import meta_schedule as ms

    losers = {c.task for c in comparisons if not c.kept}
    dropped = [t.dispatched[0] for t in tasks if t.task_name in losers]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("database_workload.json", "database_tuning_record.json"):
        (out / name).unlink(missing_ok=True)
    kept = ms.database.JSONDatabase(work_dir=str(out))
    workloads = {tvm_ffi.structural_hash(r.workload.mod): r.workload for r in database.get_all_tuning_records()}
    for workload in workloads.values():
        if any(tvm_ffi.structural_equal(workload.mod, m) for m in dropped):
            continue
        for record in database.get_top_k(workload, 1):
            kept.commit_tuning_record(ms.database.TuningRecord(
                record.trace, kept.commit_workload(workload.mod), record.run_secs, record.target,
                record.args_info))
    with open(out / "comparison.json", "w") as f:
        json.dump([{**c._asdict(), "kept": c.kept} for c in comparisons], f, indent=1)
    return kept
