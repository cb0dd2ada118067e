"""The latent-dynamics cost model: encoders, save/load, and a real MetaSchedule run with it.

One small MetaSchedule tuning run (matmul 32x32x32, 8 trials, ``WorldModelCostModel``) feeds
every test; most of this file's time is TVM importing its tensor intrinsics for the
``TuneContext``, once.
"""
import os

import numpy as np
import pytest

os.environ.setdefault("TVM_NUM_THREADS", "1")

import tvm  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

from tir_schedules.world_model import WorldModelCostModel, workloads  # noqa: E402
from tir_schedules.world_model.action_encoder import ACTION_DIM, encode_actions  # noqa: E402
from tir_schedules.world_model.state_encoder import STATE_DIM, block_loop_extents, encode_state  # noqa: E402
from tir_schedules.world_model.trace_json import trace_to_json  # noqa: E402
from tir_schedules.world_model.tuning import tune, tuning_target  # noqa: E402

MATMUL = ("matmul", [32, 32, 32])


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A JSONDatabase written by a real tuning run whose cost model is the world model."""
    work = tmp_path_factory.mktemp("wm_tune")
    mod = workloads.module(*MATMUL)
    target = tuning_target()
    db = ms.database.JSONDatabase(work_dir=str(work))
    model = WorldModelCostModel(seed=0)
    trials = tune(mod, target, search="evolutionary", cost_model=model, trials=8, seed=0,
                  per_iter=4, database=db)
    return {"mod": mod, "target": target, "db": db, "work": work, "trials": trials, "model": model}


def test_tuning_with_world_model_writes_records(tuned):
    records = tuned["db"].get_all_tuning_records()
    assert len(records) >= 4
    assert all(len(r.run_secs) > 0 and float(r.run_secs[0]) > 0 for r in records)
    assert os.path.getsize(tuned["work"] / "database_tuning_record.json") > 0
    # the online update fine-tuned on the measured trials
    assert sum(len(e[2]) for e in tuned["model"].online.values()) == len(records)


def _record_trace(tuned):
    rec = tuned["db"].get_all_tuning_records()[0]
    return rec.trace


def test_state_encoding_deterministic_and_shaped(tuned):
    a, b = encode_state(tuned["mod"]), encode_state(workloads.module(*MATMUL))
    assert a.shape == (STATE_DIM,) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, encode_state(workloads.module("matmul", [32, 64, 32])))


def test_action_encoding_follows_decisions(tuned):
    trace = _record_trace(tuned)
    extents = block_loop_extents(tuned["mod"])
    rows = encode_actions(trace_to_json(trace), extents)
    n_search = next(i for i, inst in enumerate(trace.insts) if inst.kind.name == "EnterPostproc") \
        if any(i.kind.name == "EnterPostproc" for i in trace.insts) else len(trace.insts)
    assert rows.shape == (n_search, ACTION_DIM) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows, encode_actions(trace_to_json(trace), extents))
    # change one split decision through TVM's own Trace API: the rows must change
    inst = next(i for i in trace.insts if i.kind.name == "SamplePerfectTile")
    old = [int(x) for x in trace.get_decision(inst)]
    new = list(reversed(old)) if old != list(reversed(old)) else [int(np.prod(old))] + [1] * (len(old) - 1)
    changed = trace.with_decision(inst, [tvm.tirx.IntImm("int64", v) for v in new], remove_postproc=True)
    assert not np.array_equal(rows, encode_actions(trace_to_json(changed), extents))


def test_save_load_round_trip_predicts_identically(tuned, tmp_path):
    context = ms.TuneContext(mod=tuned["mod"], target=tuned["target"], num_threads=1)
    cands = [ms.MeasureCandidate(tvm.s_tir.Schedule(tuned["mod"]), [])]
    sch_list = []
    for rec in tuned["db"].get_all_tuning_records():
        sch = tvm.s_tir.Schedule(tuned["mod"])
        rec.trace.apply_to_schedule(sch, remove_postproc=False)
        sch_list.append(ms.MeasureCandidate(sch, cands[0].args_info))
    model = tuned["model"]
    before = model.predict(context, sch_list)
    path = str(tmp_path / "wm.pt")
    model.save(path)
    loaded = WorldModelCostModel(path=path)
    np.testing.assert_array_equal(before, loaded.predict(context, sch_list))
    fresh = WorldModelCostModel(seed=1)          # other weights give other scores
    assert not np.array_equal(before, fresh.predict(context, sch_list))
    assert before.dtype == np.float64 and np.all((before > 0) & (before <= 1))


def test_realized_features_pass_ordinary_tasks_through(tuned):
    """XGBoost in the evaluation uses ``RealizedFeatures`` for every task: on a task that is not
    a scan workload it must give exactly ``PerStoreFeature``'s rows."""
    from tir_schedules.search import RealizedFeatures

    context = ms.TuneContext(mod=tuned["mod"], target=tuned["target"], num_threads=1)
    args = ms.arg_info.ArgInfo.from_prim_func(tuned["mod"]["main"])
    cands = []
    for rec in tuned["db"].get_all_tuning_records()[:3]:
        sch = tvm.s_tir.Schedule(tuned["mod"])
        rec.trace.apply_to_schedule(sch, remove_postproc=False)
        cands.append(ms.MeasureCandidate(sch, args))
    ours = RealizedFeatures().extract_from(context, cands)
    plain = ms.feature_extractor.PerStoreFeature().extract_from(context, cands)
    assert len(ours) == len(plain) == len(cands)
    for a, b in zip(ours, plain):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
