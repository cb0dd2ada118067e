"""The cost models' dataset and evaluation tooling (``bench.tuning_dataset``, ``bench.search_eval``,
``bench.search_report``, ``tir_schedules.world_model.workloads`` / ``dataset``).

The kernels made here compute what they are named for (against float64 numpy); a model's
kernel survives the dataset (its TVMScript parses back to the same function); the collector
measures real rounds into a task file, resumes where it stopped, and its records load as
training groups; the report's ratios are XGBoost / world model.
"""
import os

import numpy as np
import pytest

os.environ.setdefault("TVM_NUM_THREADS", "1")

import tvm  # noqa: E402
import tvm_ffi  # noqa: E402

from tir_schedules.world_model import dataset, workloads  # noqa: E402


def _run(family, params, inputs):
    mod = workloads.module(family, params)
    rt = tvm.compile(mod, target="llvm")
    args = [tvm.runtime.tensor(x.astype("float32")) for x in inputs]
    out_info = tvm.s_tir.meta_schedule.arg_info.ArgInfo.from_prim_func(mod["main"])[-1]
    out = tvm.runtime.tensor(np.full([int(s) for s in out_info.shape], np.nan, "float32"))
    rt["main"](*args, out)
    return out.numpy()


def test_rmsnorm_and_causal_conv1d_compute_what_they_name():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((5, 48)), rng.standard_normal(48)
    want = x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(_run("rmsnorm", [5, 48], [x, w]), want, rtol=1e-5, atol=1e-5)
    x, w = rng.standard_normal((2, 6, 11)), rng.standard_normal((6, 4))
    padded = np.concatenate([np.zeros((2, 6, 3)), x], axis=2)
    want = sum(padded[:, :, k:k + 11] * w[None, :, k:k + 1] for k in range(4))
    np.testing.assert_allclose(_run("conv1d_dw", [2, 6, 11, 4], [x, w]), want, rtol=1e-5, atol=1e-5)


class _Dense(__import__("torch").nn.Module):
    def __init__(self):
        import torch
        super().__init__()
        self.proj = torch.nn.Linear(16, 24)

    def forward(self, x):
        y = self.proj(x)
        return y.sigmoid(), y.reshape(2, 4, 24).transpose(1, 2)


def test_model_kernels_survive_the_dataset_and_pure_copies_are_not_tasks(monkeypatch):
    import torch

    import scanweaver_tvm as sw
    from scanweaver_tvm import tuning
    mod = sw.from_torch(_Dense().eval(), (torch.randn(8, 16),))
    tasks = tuning.model_tasks(mod, "llvm")
    assert any("matmul" in t.task_name for t in tasks)
    for t in tasks:
        func = t.dispatched[0]["main"]
        assert not tuning.only_moves_data(func)
        back = workloads.task_module({"family": workloads.MODEL, "params": {}, "script": func.script()})["main"]
        assert tvm_ffi.structural_equal(back, func)
    monkeypatch.setattr(tuning, "only_moves_data", lambda func: False)
    copies = {t.task_name for t in tuning.model_tasks(mod, "llvm")} - {t.task_name for t in tasks}
    assert copies and all("reshape" in n or "transpose" in n for n in copies), copies
    assert not tuning.only_moves_data(workloads.build("softmax", [4, 8]))


def test_collector_measures_rounds_and_resumes(tmp_path):
    from bench.tuning_dataset import collect, task_id
    name = workloads.task_name("matmul", [8, 8, 8])
    path = tmp_path / (task_id(name) + ".json.gz")
    dataset.save(str(path), {"version": dataset.VERSION, "name": name, "family": "matmul",
                             "params": [8, 8, 8], "split": "train", "records": []})
    collect(str(tmp_path), 0, 1, per_task=8, trials=4, minutes=10)
    task = dataset.load(str(path))
    assert len(task["records"]) == 8 and {r["round"] for r in task["records"]} == {1, 2}
    assert all(r["secs"] and min(r["secs"]) > 0 for r in task["records"])
    collect(str(tmp_path), 0, 1, per_task=8, trials=4, minutes=10)        # done: nothing more
    assert len(dataset.load(str(path))["records"]) == 8
    from tir_schedules.world_model.tuning import tuning_target
    (loaded,) = dataset.load_tasks(str(tmp_path), tuning_target(), split="train")
    assert loaded.group.n == 8 and np.all(np.isfinite(loaded.secs))
    assert dataset.load_tasks(str(tmp_path), tuning_target(), split="heldout") == []


def test_report_ratios_are_xgboost_over_world_model(tmp_path):
    from bench.search_report import ratios, summarize, write_report

    def run(lat):
        best = {str(b): {"secs": min(lat[:b]), "trial": 0, "trace": []} for b in (2, 4)}
        return {"lat": lat, "best": best}
    runs = {"a|xgb|0": run([4.0, 4.0, 2.0, 2.0]), "a|world|0": run([2.0, 2.0, 2.0, 1.0]),
            "b|xgb|0": run([1.0, 1.0, 1.0, 1.0]), "b|world|0": run([1.0, 1.0, 1.0, 1.0])}
    table, seeds, untimed = summarize(runs, {}, ("xgb", "world"), (2, 4), ("a", "b"))
    assert untimed == 8 and seeds[("a", "xgb")] == 1
    rat = ratios(table, (2, 4))
    assert rat["2"] == (pytest.approx(2 ** 0.5), 2)        # a: 4/2, b: 1/1
    assert rat["4"] == (pytest.approx(2 ** 0.5), 2)        # a: 2/1
    text = write_report(str(tmp_path), runs, ("xgb", "world"), (2, 4), ("a", "b"))
    assert "1.414x (2)" in text and (tmp_path / "curves.svg").exists()
