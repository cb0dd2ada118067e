"""MetaSchedule search over the scan realizations (tir_schedules.search, sw.tune).

The space covers every realization's knobs; sampled decisions give correct kernels (against
the float64 reference, NaN-poisoned outputs) on the CPU and CUDA source with the sampled
block size, for the affine, selective and matrix forms; a tiny real tuning run (random and
XGBoost cost models; a matrix spec too) writes a MetaSchedule database whose best record
``sw.compile(..., database=db)`` uses, still correct."""
import os
import random

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.s_tir import meta_schedule as ms

import scanweaver_tvm as sw
import tir_schedules
from harness import check_plain, plain_expected, plain_operands
from scanweaver_core.scan_op import make_scan
from scanweaver_core.reference import matrix_scan
from scanweaver_core.spec import DeltaScanSpec, MatrixScanSpec, MLSTMScanSpec, StabilizedScanSpec
from scanweaver_tvm import AffineScanSpec, SelectiveScanSpec
from test_delta_rule import check_kernel as check_delta_rule
from test_dplr_rule import check_kernel as check_dplr
from test_matrix_cpu import check as check_matrix
from test_matrix_cpu import operands as matrix_operands
from test_mlstm import check as check_mlstm
from test_selective import check as check_selective
from test_stabilized_cpu import check as check_stabilized
from tir_schedules import search

CUDA = {"kind": "cuda", "arch": "sm_90"}
AFFINE = AffineScanSpec.create((2, 5, 37), a_shape=(5, 1), axis=-1, reverse=True, has_h0=True,
                               outputs=("states", "last"))
SELECTIVE = SelectiveScanSpec(1, 5, 37, 3, has_D=True, has_z=True, has_delta_bias=True,
                              delta_softplus=True, has_h0=True, return_last_state=True)
MATRIX = MatrixScanSpec.create(2, 3, 37, 5, 7, decay="key", reverse=True, has_h0=True,
                               q_shape=(1, 3, 37, 5), return_last_state=True)
MATRIX_VALUE = MatrixScanSpec.create(2, 3, 37, 5, 7, decay="value", g_shape=(2, 1, 1, 7),
                                     dtype="float16")
MATRIX_SELECTIVE = SelectiveScanSpec(2, 6, 37, 3, 3, has_D=True, has_z=True, has_delta_bias=True,
                                     delta_softplus=True, has_h0=True,
                                     return_last_state=True).as_matrix()   # Mamba-1, groups
STABILIZED = StabilizedScanSpec(2, 20, 37, "step", True, True, True, True, True)   # RWKV-like, reversed
STABILIZED_CM = StabilizedScanSpec(2, 9, 37, "none", False, False, layout="channel_major")  # logcumsumexp
MLSTM = MLSTMScanSpec(2, 3, 21, 8, 20, has_h0=True, return_last_state=True)   # xLSTM, states in and out
MLSTM_PLAIN = MLSTMScanSpec(1, 2, 13, 4, 6, normalized=False, reverse=True)
DELTA = DeltaScanSpec(2, 4, 19, 8, 20, "key", qk_heads=2, scale=0.5, l2norm=True, has_h0=True,
                      return_last_state=True)          # KDA-like: grouped heads, norms in the kernel
DELTA_COMBA = DeltaScanSpec(1, 2, 11, 4, 6, "head", separate_read=True, reverse=True, dtype="float16")
DPLR = DeltaScanSpec(2, 2, 13, 8, 12, "key", has_h0=True, return_last_state=True, rule="dplr")   # RWKV-7-like
SPECS = {"affine": AFFINE, "selective": SELECTIVE, "matrix": MATRIX, "stabilized": STABILIZED, "mlstm": MLSTM,
         "delta": DELTA}
CHECKS = {"affine": check_plain, "selective": check_selective, "matrix": check_matrix,
          "stabilized": check_stabilized, "mlstm": check_mlstm,
          "delta": lambda kernel, spec, rng: (check_dplr if spec.is_dplr else check_delta_rule)(kernel, spec, rng)}
# the benchmark shapes (bench/matrix.py): GLA-like key decay, Mamba-2-like scalar decay
BENCH = [MatrixScanSpec.create(1, 16, 2048, 64, 64, decay="key"),
         MatrixScanSpec.create(1, 24, 2048, 128, 64, decay="scalar")]


def sampled(spec, target, seed):
    """One point of each design space, decisions drawn at random (seeded), as annotated modules."""
    rng = random.Random(seed)
    out = []
    for name in search.realizations(spec, target):
        values, knobs = search.knob_values(name, spec), None
        while knobs is None or not search.legal(name, spec, knobs):   # what RejectIllegal keeps
            knobs = {k: rng.choice(v) for k, v in values.items()}
        out.append(search.sample(tvm.s_tir.Schedule(search.workload_module(spec)), name, spec, knobs).mod)
    return out


@pytest.mark.parametrize("name", sorted(tir_schedules.REALIZATIONS))
def test_space_covers_every_knob(name):
    module = tir_schedules.REALIZATIONS[name]
    spec = SPECS[module.FORM]
    target = "llvm" if module.TARGET == "cpu" else CUDA
    values = search.knob_values(name, spec)
    default = module.default_config(spec)
    assert set(values) == set(default)
    assert all(int(default[k]) in v for k, v in values.items())
    assert sum(len(v) > 1 for v in values.values()) >= 1  # something to search
    space = search.ScanSpace(tvm.target.Target(target))
    schedules = space.generate_design_space(search.workload_module(spec))
    choices = [search.choice_of(s.mod) for s in schedules]
    assert name in [c.schedule for c in choices]
    trace = schedules[[c.schedule for c in choices].index(name)].trace
    annotated = {str(i.attrs[0]) for i in trace.insts if i.kind.name == "Annotate"}
    assert annotated == {"scanweaver.schedule"} | {f"scanweaver.{k}" for k in values}


@pytest.mark.parametrize("spec", [AFFINE, SELECTIVE, MATRIX, MATRIX_VALUE, MATRIX_SELECTIVE, STABILIZED,
                                  STABILIZED_CM, MLSTM, MLSTM_PLAIN, DELTA, DELTA_COMBA, DPLR],
                         ids=["affine", "selective", "matrix", "matrix_value", "matrix_selective",
                              "stabilized", "stabilized_channel_major", "mlstm", "mlstm_plain", "delta",
                              "delta_comba", "dplr"])
def test_workloads_are_correct_scans(spec):
    mod = search.workload_module(spec)
    kernel = tvm.compile(mod, target="llvm").mod["main"]
    CHECKS[search.form_of(spec)](kernel, spec, np.random.default_rng(0))
    assert search.workload_spec(mod) == spec     # the JSON round trip (tuples come back)
    realized = tir_schedules.realize(spec)     # the runner's arguments fit the kernel
    assert [str(a.as_json()) for a in ms.arg_info.ArgInfo.from_prim_func(mod["main"])] == \
        [str(a.as_json()) for a in ms.arg_info.ArgInfo.from_prim_func(realized)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_cpu_decisions_give_correct_kernels(seed):
    rng = np.random.default_rng(seed)
    host = tir_schedules.host_target()
    for spec in (AFFINE, SELECTIVE, MATRIX, MATRIX_SELECTIVE, STABILIZED, STABILIZED_CM, MLSTM, DELTA, DPLR):
        for mod in sampled(spec, "llvm", seed):
            CHECKS[search.form_of(spec)](search.build_candidate(mod, host)["main"], spec, rng)


@pytest.mark.parametrize("spec", BENCH + [MATRIX], ids=["gla", "mamba2", "small"])
def test_matrix_spaces_leave_out_what_breaks_the_kernel(spec):
    """Every GPU point fits 1024 threads and 48 KB of shared memory; a CPU point is never one
    the kernel clamps into another; the defaults are points; ``RejectIllegal`` drops the rest."""
    for name in ("matrix_cpu", "matrix_gpu"):
        default = tir_schedules.REALIZATIONS[name].default_config(spec)
        assert search.legal(name, spec, default)
    values = search.knob_values("matrix_gpu", spec)
    for v_tile in values["v_tile"]:
        for col_threads in values["col_threads"]:
            for t_tile in values["t_tile"]:
                knobs = dict(v_tile=v_tile, col_threads=col_threads, t_tile=t_tile)
                if search.legal("matrix_gpu", spec, knobs):
                    assert v_tile * col_threads <= 1024
                    assert tir_schedules.matrix_gpu.footprint(spec, v_tile, col_threads, t_tile)[1] <= 48 * 1024
    cpu = {**tir_schedules.matrix_cpu.default_config(spec), "lanes": 8, "vtile": 4}
    assert "multiple of lanes" in search.violation("matrix_cpu", spec, cpu)
    biggest = {k: v[-1] for k, v in values.items()}    # 2048 threads for the benchmark shapes
    for name, knobs, ok in [("matrix_gpu", biggest, spec not in BENCH),
                            ("matrix_cpu", cpu, False),
                            ("matrix_gpu", tir_schedules.matrix_gpu.default_config(spec), True)]:
        sch = search.sample(tvm.s_tir.Schedule(search.workload_module(spec)), name, spec, knobs)
        assert search.RejectIllegal().apply(sch) is ok


def test_mutation_changes_exactly_one_knob():
    mod = sampled(AFFINE, "llvm", 0)[0]
    sch = tvm.s_tir.Schedule(search.workload_module(AFFINE))
    search.sample(sch, "cpu", AFFINE, search.choice_of(mod).knobs)
    mutant = search.MutateKnob().apply(sch.trace)
    before, after = search.choice_of(mod).knobs, search.choice_of_trace(mutant, AFFINE).knobs
    assert sum(before[k] != after[k] for k in before) == 1


def test_features_see_the_realized_kernel():
    host = tir_schedules.host_target()
    mods = sampled(AFFINE, "llvm", 4) + [search.sample(tvm.s_tir.Schedule(search.workload_module(AFFINE)),
                                                       "cpu", AFFINE, {"group": 1, "chunks": 4}).mod]
    assert search.choice_of(mods[0]) != search.choice_of(mods[1])
    search.load_tensor_intrin()
    ctx = ms.TuneContext(mod=search.workload_module(AFFINE), target=host, num_threads=1)
    args = ms.arg_info.ArgInfo.from_prim_func(mods[0]["main"])
    feats = search.RealizedFeatures().extract_from(ctx, [ms.MeasureCandidate(tvm.s_tir.Schedule(m), args)
                                                         for m in mods])
    a, b = (f.numpy() for f in feats)
    assert a.shape[1] == b.shape[1] and (a.shape != b.shape or not np.allclose(a, b))


@pytest.mark.parametrize("spec", [AFFINE, SELECTIVE, MATRIX, BENCH[1]],
                         ids=["affine", "selective", "matrix", "matrix_mamba2"])
def test_sampled_gpu_decisions_compile_to_cuda(spec):
    for mod in sampled(spec, CUDA, 5):
        choice = search.choice_of(mod)
        knobs = choice.knobs
        threads = knobs["v_tile"] * knobs["col_threads"] if "v_tile" in knobs else \
            knobs.get("threads") or 32 * knobs["warps"]
        source = tvm.compile(search.realize_module(mod, CUDA), target=tvm.target.Target(CUDA)).mod \
            .imports[0].inspect_source()
        assert f"__launch_bounds__({threads})" in source, f"{choice}: block size not in the kernel"


def _scan_module(spec):
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType(spec.a_shape, spec.dtype))
    b = relax.Var("b", relax.TensorType(spec.shape, spec.dtype))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            out = bb.emit_output(make_scan(spec, [a, b]))
        bb.emit_func_output(out)
    return bb.get()


def _lowered_scan(mod, database):
    lowered = sw.passes("llvm", database=database)(mod)
    (func,) = [f for _, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    return func


@pytest.mark.parametrize("cost_model", ["random", "xgb", "world"])
def test_tiny_tuning_run_feeds_compile(cost_model, tmp_path):
    spec = AffineScanSpec.create((2, 48, 200))
    mod = _scan_module(spec)
    db = sw.tune(mod, "llvm", trials=6, cost_model=cost_model, work_dir=tmp_path, seed=1, progress=False)
    assert (tmp_path / "database_tuning_record.json").exists()
    records = db.get_all_tuning_records()
    assert 2 <= len(records) <= 6
    choices = [search.choice_of_trace(r.trace, spec) for r in records]
    means = [np.mean([float(s) for s in r.run_secs]) for r in records]
    best = choices[int(np.argmin(means))]
    assert search.default_choice(spec, "llvm") in choices  # measured like any candidate
    assert search.best_choice(db, spec, "llvm") == best
    # the compiled module's scan is the best record's kernel, and differs from another record's
    func = _lowered_scan(mod, db)
    tvm.ir.assert_structural_equal(func.body, search.realize_choice(best).body, map_free_vars=True)
    other = next(c for c in choices if c != best)
    assert not tvm_ffi.structural_equal(func.body, search.realize_choice(other).body, map_free_vars=True)
    a, b, _ = plain_operands(spec, np.random.default_rng(2))
    vm = relax.VirtualMachine(sw.compile(mod, "llvm", database=db), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b)).numpy()
    np.testing.assert_allclose(got, plain_expected(spec, a, b, None)["states"], rtol=2e-5, atol=2e-5)


def test_tiny_matrix_tuning_run_feeds_compile(tmp_path):
    """A matrix spec tunes on the CPU (the XGBoost model on its realized features) and
    ``LowerScans`` compiles the best record, still correct."""
    spec = MatrixScanSpec.create(1, 2, 40, 8, 16, decay="key", return_last_state=True)
    db = sw.tune(spec, "llvm", trials=4, work_dir=tmp_path, seed=1, progress=False)
    records = db.get_all_tuning_records()
    assert 2 <= len(records) <= 4
    best = search.best_choice(db, spec, "llvm")
    assert best is not None and best.schedule == "matrix_cpu"
    assert search.default_choice(spec, "llvm") in [search.choice_of_trace(r.trace, spec) for r in records]
    names = spec.operand_names()
    params = [relax.Var(n, relax.TensorType(s, spec.dtype)) for n, s in spec.operand_shapes().items()]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(make_scan(spec, params))
        bb.emit_func_output(out)
    mod = bb.get()
    tvm.ir.assert_structural_equal(_lowered_scan(mod, db).body, search.realize_choice(best).body,
                                   map_free_vars=True)
    x = matrix_operands(spec, np.random.default_rng(0))
    vm = relax.VirtualMachine(sw.compile(mod, "llvm", database=db), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(x[n]) for n in names])
    want = matrix_scan(x["q"], x["k"], x["v"], x["g"], spec.decay, return_last_state=True)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=2e-5, atol=2e-5)


def test_pooled_builder_limits_each_candidate_and_keeps_its_worker():
    """A candidate over the time limit is that candidate's error (the worker is killed, not
    the tuning); the next batch gets a fresh worker, which then stays for later batches."""
    import time

    from tir_schedules.search.builder import PooledBuilder

    mod = tvm.IRModule({"main": tvm.te.create_prim_func(
        [a := tvm.te.placeholder((64,), name="A"), tvm.te.compute((64,), lambda i: a[i] * 2.0)])})
    item = ms.builder.BuilderInput(mod, tvm.target.Target("llvm"))
    (late,) = PooledBuilder(timeout_sec=0.001).build([item])
    assert late.artifact_path is None and "timeout" in late.error_msg
    builder = PooledBuilder(timeout_sec=60)
    (first,) = builder.build([item])
    start = time.time()
    (second,) = builder.build([item])
    assert first.error_msg is None and second.error_msg is None and os.path.exists(second.artifact_path)
    assert time.time() - start < 2.0           # the same worker: no TVM import this time


def test_tune_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="symbolic"):
        sw.tune(AffineScanSpec.create((4, None)), work_dir=tmp_path)
    with pytest.raises(ValueError, match="cost_model"):
        sw.tune(AFFINE, cost_model="gbm", work_dir=tmp_path)
    with pytest.raises(TypeError, match="mod_or_spec"):
        sw.tune("model.onnx", work_dir=tmp_path)


def test_world_cost_model_defaults_to_the_pretrained_weights():
    import torch

    from scanweaver_tvm.tuning import PRETRAINED_WORLD_MODEL, world_cost_model
    from tir_schedules.world_model import WorldModelCostModel

    assert PRETRAINED_WORLD_MODEL.exists()
    default = world_cost_model().net.state_dict()
    pretrained = WorldModelCostModel(path=str(PRETRAINED_WORLD_MODEL)).net.state_dict()
    untrained = WorldModelCostModel(seed=1).net.state_dict()
    assert all(torch.equal(default[k], pretrained[k]) for k in default)
    assert not all(torch.equal(default[k], untrained[k]) for k in default)


def test_pretrained_weights_ship_inside_the_package():
    """The weights are package data of ``tir_schedules.world_model`` (a wheel carries them), not
    a file of the source tree's ``bench/``."""
    import tomllib
    from pathlib import Path

    from tir_schedules import world_model
    from scanweaver_tvm.tuning import PRETRAINED_WORLD_MODEL
    assert PRETRAINED_WORLD_MODEL == world_model.PRETRAINED
    assert world_model.PRETRAINED.parent == Path(world_model.__file__).resolve().parent
    config = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert "*.pt" in config["tool"]["setuptools"]["package-data"]["tir_schedules.world_model"]


class _Layer(__import__("torch").nn.Module):
    """Dense layers, an EMA over time (a scan), a layer norm: a model's kinds of kernels."""
    def __init__(self):
        import torch

        super().__init__()
        self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, x):
        import torch

        u = torch.relu(self.up(x))
        h, hs = torch.zeros_like(u[:, 0]), []
        for t in range(u.shape[1]):
            h = 0.9 * h + u[:, t]
            hs.append(h)
        return torch.nn.functional.layer_norm(self.down(torch.stack(hs, 1)), (32,))


@pytest.mark.parametrize("cost_model", ["xgb", "world"])
def test_whole_model_tuning_feeds_compile(cost_model, tmp_path):
    """``sw.tune`` on a model: its scan and every other kernel (dense layers, the norm) are
    tuned into one database in ``work_dir``; the database it returns keeps a task's best
    record only where its kernel beat the rule's (timed as compiled, ``comparison.json``).
    ``sw.compile`` gives each kept kernel its record's schedule (the same function as
    MetaSchedule's own query), the rules the rest, and the model computes what PyTorch does."""
    import json

    import torch
    from tvm.s_tir import meta_schedule as ms

    from scanweaver_tvm import rule_check
    from scanweaver_tvm.tuning import model_tasks
    from tir_schedules import dense_cpu

    model, x = _Layer().eval(), torch.randn(2, 16, 32)
    mod = sw.from_torch(model, (x,))
    tasks = model_tasks(mod, "llvm")
    names = sorted(t.task_name for t in tasks)
    assert any("matmul" in n for n in names) and any("layer_norm" in n for n in names), names
    db = sw.tune(mod, "llvm", trials=3, cost_model=cost_model, work_dir=tmp_path, seed=1, progress=False)
    target = tir_schedules.resolve_target("llvm")
    every = ms.database.JSONDatabase(work_dir=str(tmp_path))
    assert all(every.has_workload(t.dispatched[0]) for t in tasks)
    assert len(every.get_all_tuning_records()) <= 3 * (len(tasks) + 1)     # the scan's 3 and the tasks' share
    compared = {c["task"]: c for c in json.loads((tmp_path / "applied" / "comparison.json").read_text())}
    assert sorted(compared) == names
    kept = [t for t in tasks if compared[t.task_name]["kept"]]
    assert all(c["kept"] == (c["tuned_us"] < c["rule_us"]) for c in compared.values())
    assert [t for t in tasks if db.has_workload(t.dispatched[0])] == kept
    with target:
        applied = dense_cpu.apply_database(db)(tvm.IRModule({t.task_name: t.dispatched[0]["main"] for t in tasks}))
    for t in tasks:
        best = every.query_schedule(t.dispatched[0], target, "main")
        assert best is not None
        if t in kept:
            tvm.ir.assert_structural_equal(applied[t.task_name].body, best.mod["main"].body, map_free_vars=True)
        else:
            assert "tirx.is_scheduled" not in (applied[t.task_name].attrs or {})      # left to the rules
    vm = relax.VirtualMachine(sw.compile(mod, "llvm", database=db), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x.numpy()))[0].numpy()
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-4, atol=1e-4)
    # the selection itself: every task losing leaves only the scan's record; every task winning, all
    lose = rule_check.winning_records(every, tasks, [rule_check.KernelComparison(n, 1.0, 2.0) for n in names],
                                      tmp_path / "lose")
    assert not any(lose.has_workload(t.dispatched[0]) for t in tasks) and len(lose.get_all_tuning_records()) == 1
    win = rule_check.winning_records(every, tasks, [rule_check.KernelComparison(n, 2.0, 1.0) for n in names],
                                     tmp_path / "win")
    assert all(win.has_workload(t.dispatched[0]) for t in tasks)
    assert len(win.get_all_tuning_records()) == len(tasks) + 1


def test_rule_check_times_the_kernels_the_model_runs():
    """The rule's kernel that ``rule_check`` times for a dense task is the one the model calls:
    its weight packed at compile time (no repacking block inside), not the pipeline's unpacked
    copy of it, which repacks the weight on every call."""
    import torch

    from scanweaver_tvm import rule_check
    from scanweaver_tvm.tuning import model_tasks
    from tir_schedules.dense_cpu import PREPROC

    mod = sw.from_torch(_Layer().eval(), (torch.randn(2, 16, 32),))
    target = tir_schedules.resolve_target("llvm")
    names = {t.task_name for t in model_tasks(mod, target)}
    kernels = rule_check.compiled_kernels(mod, target, None, names)
    dense = [n for n in kernels if "matmul" in n]
    assert dense and set(kernels) <= names
    assert all(PREPROC not in kernels[n].script() for n in dense)
