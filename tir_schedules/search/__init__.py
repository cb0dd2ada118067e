"""MetaSchedule search over the scan realizations (stable API; other modules build on it).

A scan spec becomes an ordinary MetaSchedule task:

- workload (``scan_workload`` / ``workload_module``): a canonical, unscheduled sequential scan
  with ``T.sblock``s and the realizations' exact arguments; it carries the spec as the
  function attribute ``scanweaver.spec`` and is the database key of the spec;
- space (``ScanSpace``, a ``PySpaceGenerator``): one design space per realization that applies
  to (spec, target); each knob is a ``sample_categorical`` over its legal values, recorded as
  ``sch.annotate(scan_block, "scanweaver.<knob>", decision)`` (``knob_values`` lists them);
  ``MutateKnob`` re-samples one decision for the evolutionary search; where knobs bind each
  other (the matrix kernels) ``legal`` / ``violation`` say which combinations are points of
  the space and the postprocessor ``RejectIllegal`` drops the others;
- realization (``choice_of``, ``realize_choice``, ``realize_module``): annotated workload ->
  ``Choice(spec, schedule, config)`` -> the scheduled PrimFunc ``tir_schedules.realize`` would
  make with that config;
- builder (``scan_builder``: ``PooledBuilder``: ``build_candidate`` in one long-lived worker, with a time limit) and features
  (``RealizedFeatures``: ``PerStoreFeature`` of the realized kernel, cached per choice);
- ``tune_task(spec, target, cost_model, trials, seed, work_dir)`` -> ``JSONDatabase``: takes
  any ``ms.cost_model.CostModel`` (or ``"xgb"`` / ``"random"``); ``evolutionary_search()``: the
  strategy ``sw.tune`` runs on a model's other kernels;
- ``best_choice(database, spec, target)``: the fastest recorded choice, or None;
- ``load_tensor_intrin()``: call before making a ``TuneContext`` yourself (it imports
  ``tvm.s_tir.tensor_intrin``, 100+ s on our machines without this).

A tuning record is a normal MetaSchedule record: the trace (samples + annotations) and the
measured run times of the realized kernel, in ``work_dir/database_{workload,tuning_record}.json``.
"""
from .builder import build_candidate, scan_builder
from .features import RealizedFeatures
from .mutate import MutateKnob
from .realize import (Choice, RejectIllegal, best_choice, choice_of, choice_of_trace, default_choice,
                      realize_choice, realize_module)
from .space import ScanSpace, knob_values, legal, realizations, sample, violation
from .task import evolutionary_search, load_tensor_intrin, make_cost_model, scan_runner, scan_task, tune_task
from .workload import form_of, scan_workload, spec_from_json, spec_to_json, workload_module, workload_spec

__all__ = ["Choice", "MutateKnob", "RealizedFeatures", "RejectIllegal", "ScanSpace", "best_choice",
           "build_candidate", "choice_of", "evolutionary_search", "choice_of_trace", "default_choice", "form_of", "knob_values", "legal",
           "load_tensor_intrin", "make_cost_model",
           "realizations", "realize_choice", "realize_module", "sample", "scan_builder",
           "scan_runner", "scan_task", "scan_workload", "spec_from_json", "spec_to_json",
           "tune_task", "violation", "workload_module", "workload_spec"]
