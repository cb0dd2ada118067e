"""Features of scan candidates for learned cost models: ``PerStoreFeature`` of the kernel.

A candidate's own module is the workload plus annotations, the same program for every
decision, so ``PerStoreFeature`` on it would give XGBoost identical rows.  ``RealizedFeatures``
realizes each candidate first and extracts from the real kernel (loop nests, vector widths,
thread extents, shared-memory traffic all change with the knobs).  Features are cached per
choice: the evolutionary search scores the same few hundred points many times.
"""
from tvm.ir.utils import derived_object
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.feature_extractor import PyFeatureExtractor

from .realize import choice_of, realize_choice
from .workload import SPEC_ATTR


def is_scan_workload(mod):
    """Whether ``mod``'s ``main`` is a scan workload (``scan_workload``), i.e. needs realizing."""
    func = mod["main"] if mod is not None and "main" in [g.name_hint for g in mod.get_global_vars()] else None
    return func is not None and func.attrs is not None and SPEC_ATTR in func.attrs


@derived_object
class RealizedFeatures(PyFeatureExtractor):
    """``PerStoreFeature`` (or ``inner``) applied to the realized kernel of each candidate."""

    def __init__(self, inner=None):
        self.inner = inner if inner is not None else ms.feature_extractor.PerStoreFeature()
        self.cache = {}

    def extract_from(self, context, candidates):
        if not is_scan_workload(context.mod):      # an ordinary task: its own program is the kernel
            return self.inner.extract_from(context, candidates)
        choices = [choice_of(c.sch.mod) for c in candidates]
        missing = {}
        for choice, cand in zip(choices, candidates):
            if choice not in self.cache and choice not in missing:
                sch = Schedule(realize_choice(choice, context.target).with_attr("global_symbol", "main"))
                missing[choice] = ms.MeasureCandidate(sch, cand.args_info)
        if missing:
            feats = self.inner.extract_from(context, list(missing.values()))
            self.cache.update(zip(missing, feats))
        return [self.cache[c] for c in choices]
