"""XGBoost against the latent-dynamics evaluator, in the same search: ``python -m bench.search_eval``.

The workloads are held out: none is in the world model's training data (``bench/data/tuning``,
split "heldout").  Four steps, each resumable, results under ``bench/data/search_eval/``:

- ``--ranking``: rank every held-out task's measured records with the world model pretrained on
  the training tasks, and with MetaSchedule's ``XGBModel`` trained on the same records;
  Kendall tau, top-1 and top-5 recall.  Also the learning curve: the world model pretrained on
  a quarter, a half and all of the training tasks' records.
- ``--search [--worker i/n]``: every search task x seed x cost model ("xgb": ``sw.tune``'s
  XGBoost, online; "world": the shipped pretrained weights, fine-tuned online) runs the search
  ``sw.tune`` runs (``tir_schedules.search.evolutionary_search``, 16 candidates a batch) for
  ``--trials`` measured trials.  The search never reads its budget except to stop, so budgets
  16 and 64 are the first 16 and 64 trials of the 256-trial run.  Kept: each trial's median
  latency, and the best schedule's trace at each budget.
- ``--retime``: the best schedules at each budget, rebuilt from their traces and timed again,
  interleaved (every round times each once, in a shuffled order), median of the rounds.
- ``--report``: ``report.md`` and ``curves.svg`` (``bench.search_report``).

Timings: one thread, ``time_evaluator`` in the tuning process, on a shared 2-core machine.
"""
import argparse
import glob
import json
import os
import random
import sys
import time
from typing import NamedTuple

os.environ.setdefault("TVM_NUM_THREADS", "1")

import numpy as np  # noqa: E402

OUT = "bench/data/search_eval"
DATA = "bench/data/tuning"
METHODS = ("xgb", "world")
BUDGETS = (16, 64, 256)
_QWEN = "model:qwen3_next_layers@64:"
SEARCH_TASKS = ("matmul:[1,2816,1024]", "matmul:[64,1024,1024]", "matmul:[512,384,384]",
                _QWEN + "matmul2", "conv1d_dw:[1,2048,128,4]",
                _QWEN + "fused_conv1d_strided_slice_tir_sigmoid_multiply2", "rmsnorm:[32,2560]",
                _QWEN + "fused_mean1_add5_tir_rsqrt2_multiply7_multiply8_tir_sigmoid2_multiply9_multiply9",
                "layernorm:[96,384]", _QWEN + "matmul1")


def _load_json(path, default):
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


def _dump_json(path, data):
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def _heldout_modules():
    """``{name: initial module}`` of the dataset's held-out tasks."""
    from tir_schedules.world_model import dataset, workloads
    tasks = (dataset.load(p) for p in dataset.task_files(DATA))
    return {t["name"]: workloads.task_module(t) for t in tasks if t["split"] == "heldout"}


# ---------------------------------------------------------------- ranking

def _replay(mod, trace_json):
    import tvm
    sch = tvm.s_tir.Schedule(mod)
    tvm.s_tir.Trace.apply_json_to_schedule(trace_json, sch)
    return sch


def _xgb_contexts(task, target):
    from tvm.s_tir import meta_schedule as ms
    context = ms.TuneContext(mod=task.mod, target=target, num_threads=1)
    args = ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
    return context, [ms.MeasureCandidate(_replay(task.mod, r["trace"]), args) for r in task.records]


def _xgb_trained(train, target):
    """``sw.tune``'s XGBoost model, updated with the training tasks' records."""
    from tvm.s_tir import meta_schedule as ms
    from tir_schedules.search import load_tensor_intrin, make_cost_model
    load_tensor_intrin()
    model = make_cost_model("xgb")
    for t in train:
        context, cands = _xgb_contexts(t, target)
        model.update(context, cands, [ms.runner.RunnerResult([float(s) for s in r["secs"]], None)
                                      for r in t.records])
    return model


def _quality(scores, secs):
    from tir_schedules.world_model import metrics
    return {"kendall_tau": metrics.kendall_tau(scores, secs), "top1": metrics.best_in_top_k(scores, secs, 1),
            "top5_recall": metrics.top_k_recall(scores, secs, 5), "n": len(secs)}


def _subsample(tasks, fraction, seed=0):
    """The training tasks with ``fraction`` of each one's records (the learning curve)."""
    from tir_schedules.world_model.train import Group
    rng = np.random.default_rng(seed)
    out = []
    for t in tasks:
        keep = np.sort(rng.choice(len(t.secs), size=max(2, int(fraction * len(t.secs))), replace=False))
        out.append(_Subset(t.state, Group(t.state, t.hw, [t.actions[i] for i in keep], t.secs[keep])))
    return out


class _Subset(NamedTuple):
    """What ``pretrain`` reads of a task: its state and its records as a ``Group``."""
    state: np.ndarray
    group: object


def ranking(target, steps):
    from tir_schedules.world_model.dataset import load_tasks
    from tir_schedules.world_model.pretrain import pretrain
    from tir_schedules.world_model.train import score
    train = load_tasks(DATA, target, split="train")
    heldout = load_tasks(DATA, target, split="heldout")
    result = {"train_tasks": len(train), "train_records": int(sum(t.group.n for t in train)),
              "heldout_records": int(sum(len(t.secs) for t in heldout)), "curve": {}, "tasks": {}}
    for fraction in (0.25, 0.5, 1.0):
        subset = _subsample(train, fraction) if fraction < 1 else train
        wm, loss, secs = pretrain(subset, steps=steps)
        per_task = {t.name: _quality(score(wm.net, t.state, t.hw, t.actions, wm.norm), t.secs) for t in heldout}
        result["curve"][str(fraction)] = {
            "records": int(sum(t.group.n for t in subset)), "loss": loss, "seconds": secs,
            **{k: float(np.mean([q[k] for q in per_task.values()])) for k in ("kendall_tau", "top1", "top5_recall")}}
        print(f"[ranking] world model on {fraction:.0%} of the training records: "
              f"{result['curve'][str(fraction)]}", file=sys.stderr, flush=True)
    for name, q in per_task.items():
        result["tasks"][name] = {"world": q}
    xgb = _xgb_trained(train, target)
    for t in heldout:
        context, cands = _xgb_contexts(t, target)
        result["tasks"][t.name]["xgb"] = _quality(xgb.predict(context, cands), t.secs)
    result["mean"] = {m: {k: float(np.mean([r[m][k] for r in result["tasks"].values()]))
                          for k in ("kendall_tau", "top1", "top5_recall")} for m in METHODS}
    print(f"[ranking] held-out means: {result['mean']}", file=sys.stderr)
    return result


# ---------------------------------------------------------------- search

def _cost_model(method):
    from tir_schedules.search import make_cost_model
    from tir_schedules.world_model import PRETRAINED, WorldModelCostModel
    return WorldModelCostModel(path=str(PRETRAINED)) if method == "world" else make_cost_model("xgb")


def search_run(mod, method, seed, trials, target):
    """One search: per-trial median seconds, and the best trace at each budget."""
    from tir_schedules.world_model.tuning import median_secs, tune
    trials_out = tune(mod, target, search="evolutionary", cost_model=_cost_model(method),
                      trials=trials, seed=seed)
    lat = [median_secs(t) for t in trials_out]
    best = {}
    for budget in BUDGETS:
        if budget <= len(lat):
            i = int(np.argmin(lat[:budget]))
            best[str(budget)] = {"trial": i, "secs": lat[i], "trace": trials_out[i]["trace"]}
    return {"lat": lat, "best": best}


def search(out_dir, target, trials, seeds, worker, workers, names=SEARCH_TASKS):
    path = os.path.join(out_dir, f"search.w{worker}.json")
    result = _load_json(path, {"trials": trials, "runs": {}})
    tasks = _heldout_modules()
    missing = [n for n in names if n not in tasks]
    if missing:
        raise ValueError(f"search tasks not among the held-out tasks of {DATA}: {missing}")
    pairs = [(seed, name) for seed in range(seeds) for name in names]     # both methods in one worker
    done = all_runs(out_dir)          # (other workers never run this worker's pairs)
    for seed, name, method in [(s, n, m) for s, n in pairs[worker::workers] for m in METHODS]:
        key = f"{name}|{method}|{seed}"
        if key in done:
            continue
        start = time.time()
        try:
            result["runs"][key] = search_run(tasks[name], method, seed, trials, target)
        except Exception as err:  # pylint: disable=broad-except (say so; the other runs go on)
            print(f"[search] {key}: FAILED {type(err).__name__}: {err}", file=sys.stderr, flush=True)
            continue
        _dump_json(path, result)
        run = result["runs"][key]
        print(f"[search] w{worker} {key}: best " + ", ".join(
            f"{b}: {run['best'][b]['secs'] * 1e6:.1f} us" for b in run["best"])
            + f" ({time.time() - start:.0f} s)", file=sys.stderr, flush=True)


def all_runs(out_dir):
    runs = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "search.w*.json"))):
        runs.update(_load_json(path, {"runs": {}})["runs"])
    return runs


# ---------------------------------------------------------------- re-timing

def retime(out_dir, target, rounds, names=SEARCH_TASKS):
    """Median of ``rounds`` interleaved timings of each run's best schedule per budget."""
    import tvm
    from tir_schedules.search import build_candidate
    from tir_schedules.world_model.measure import random_input
    path = os.path.join(out_dir, "retime.json")
    result = _load_json(path, {})
    tasks, runs, dev = _heldout_modules(), all_runs(out_dir), tvm.cpu()
    for name in names:
        entries = [(key, b, run["best"][b]["trace"]) for key, run in runs.items()
                   if key.split("|")[0] == name for b in run["best"]]
        if not entries or all(f"{k}|{b}" in result for k, b, _ in entries):
            continue
        mod = tasks[name]
        args = [tvm.runtime.tensor(random_input(a.shape, a.dtype), dev)
                for a in tvm.s_tir.meta_schedule.arg_info.ArgInfo.from_prim_func(mod["main"])]
        timers, by_trace = {}, {}
        for key, budget, trace in entries:
            sig = json.dumps(trace)
            if sig not in by_trace:
                built = build_candidate(_replay(mod, trace).mod, target)
                by_trace[sig] = built.time_evaluator("main", dev, number=1, repeat=1, min_repeat_ms=20)
            timers[f"{key}|{budget}"] = by_trace[sig]
        times = {k: [] for k in timers}
        order = list(timers)
        for r in range(rounds):
            random.Random(r).shuffle(order)
            for k in order:
                times[k].append(float(timers[k](*args).mean))
        result.update({k: float(np.median(v)) for k, v in times.items()})
        _dump_json(path, result)
        print(f"[retime] {name}: {len(by_trace)} schedules, {rounds} rounds", file=sys.stderr, flush=True)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranking", action="store_true")
    ap.add_argument("--search", action="store_true")
    ap.add_argument("--retime", action="store_true")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--tasks", default="", help="search tasks separated by ';' (default: all)")
    ap.add_argument("--worker", default="0/1", help="i/n: this process runs every n-th search from i")
    ap.add_argument("--trials", type=int, default=max(BUDGETS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3000, help="pretraining steps (ranking)")
    ap.add_argument("--rounds", type=int, default=15, help="re-timing rounds")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    names = tuple(filter(None, args.tasks.split(";"))) or SEARCH_TASKS
    from tir_schedules.world_model.tuning import tuning_target
    target = tuning_target()
    if args.ranking:
        _dump_json(os.path.join(args.out, "ranking.json"), ranking(target, args.steps))
    if args.search:
        worker, workers = (int(x) for x in args.worker.split("/"))
        search(args.out, target, args.trials, args.seeds, worker, workers, names)
    if args.retime:
        retime(args.out, target, args.rounds, names)
    if args.report:
        from bench.search_report import write_report
        print(write_report(args.out, all_runs(args.out), METHODS, BUDGETS, names))


if __name__ == "__main__":
    main()
