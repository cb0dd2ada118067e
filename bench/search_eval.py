"""Random search vs XGBoost vs the latent-dynamics evaluator: ``python -m bench.search_eval``.

1. Pretrain the world model on the dataset's training tasks (``bench/data/tuning_dataset.json.gz``).
2. Ranking on the HELD-OUT tasks' records (never trained on): Kendall tau, top-1 (the fastest
   record predicted first) and top-5 recall, for the world model and for MetaSchedule's
   ``XGBModel`` trained on the same training records (``update`` on the replayed schedules).
3. Search on the held-out tasks, same budget (``--trials`` measured trials), several seeds:
   ``random`` (``ReplayTrace``; scan tasks: evolutionary search with ``RandomModel``), ``xgb``
   (evolutionary search + ``XGBModel``, ``num_warmup_samples=0``), ``world_model``
   (evolutionary search + ``WorldModelCostModel``, pretrained, fine-tuned online).
   Best latency per task, geometric mean, and how many trials XGBoost needs to reach the
   world model's best.

Writes ``bench/out/search_eval.json`` after every run and ``bench/out/search_eval.md`` at the
end (``--report-only`` rewrites the markdown from the JSON).  Measurements: one thread,
``time_evaluator`` number=3 repeat=3 (median) on a shared 2-core machine: noisy.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TVM_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from tir_schedules.world_model.report import write_markdown  # noqa: E402

METHODS = ("random", "xgb", "world_model")


def _replay(mod, trace_json):
    import tvm
    sch = tvm.s_tir.Schedule(mod)
    tvm.s_tir.Trace.apply_json_to_schedule(trace_json, sch)
    return sch


def _xgb_on_records(train_tasks, target):
    """MetaSchedule's XGBModel updated with the training tasks' records (replayed schedules)."""
    from tvm.s_tir import meta_schedule as ms
    from tir_schedules.search import RealizedFeatures
    from tir_schedules.search.task import load_tensor_intrin
    load_tensor_intrin()
    # scan records are annotated workloads: XGBoost must see their realized kernels, as in sw.tune
    model = ms.cost_model.XGBModel(extractor=RealizedFeatures(), num_warmup_samples=0,
                                   adaptive_training=False, num_tuning_cores=1)
    for t in train_tasks:
        context = ms.TuneContext(mod=t.mod, target=target, num_threads=1)
        args = ms.arg_info.ArgInfo.from_prim_func(t.mod["main"])
        cands = [ms.MeasureCandidate(_replay(t.mod, r["trace"]), args) for r in t.records]
        results = [ms.runner.RunnerResult([float(s) for s in r["secs"]], None) for r in t.records]
        model.update(context, cands, results)
    return model


def _xgb_scores(model, task, target):
    from tvm.s_tir import meta_schedule as ms
    context = ms.TuneContext(mod=task.mod, target=target, num_threads=1)
    args = ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
    return model.predict(context, [ms.MeasureCandidate(_replay(task.mod, r["trace"]), args)
                                   for r in task.records])


def ranking_eval(train_tasks, heldout, wm, target):
    from tir_schedules.world_model import metrics
    from tir_schedules.world_model.train import score
    xgb = _xgb_on_records(train_tasks, target)
    out = {}
    for t in heldout:
        preds = {"world_model": score(wm.net, t.state, t.hw, t.actions, wm.norm)}
        try:
            preds["xgb"] = _xgb_scores(xgb, t, target)
        except Exception as err:  # report, do not hide
            print(f"[ranking] xgb on {t.name}: {type(err).__name__}: {err}", file=sys.stderr)
        out[t.name] = {m: {"kendall_tau": metrics.kendall_tau(p, t.secs), "distinct": len(set(p)),
                           "top1": metrics.best_in_top_k(p, t.secs, 1),
                           "top5_recall": metrics.top_k_recall(p, t.secs, 5), "n": len(t.secs)}
                       for m, p in preds.items()}
    return out


def _cost_model(method, model_path, scan):
    from tvm.s_tir import meta_schedule as ms
    from tir_schedules.world_model import WorldModelCostModel
    if method == "world_model":
        return WorldModelCostModel(path=model_path)
    if method == "xgb":
        if scan:
            from tir_schedules.search import make_cost_model
            return make_cost_model("xgb")
        return ms.cost_model.XGBModel(num_warmup_samples=0, num_tuning_cores=1)
    return "random"


def search_run(task, method, seed, trials, model_path, target):
    """Medians of the measured trials, in measurement order."""
    from tir_schedules.world_model import workloads
    from tir_schedules.world_model.tuning import median_secs, tune
    scan = task.family in workloads.SCAN
    cost_model = _cost_model(method, model_path, scan)
    if scan:
        import tempfile
        from tir_schedules.search import tune_task
        with tempfile.TemporaryDirectory(prefix="wm_eval_") as wd:
            db = tune_task(workloads.spec_of(task.family, task.params), target, cost_model=cost_model,
                           trials=trials, seed=seed, work_dir=wd, progress=False)
            return [float(np.median([float(s) for s in r.run_secs])) for r in db.get_all_tuning_records()]
    search = "random" if method == "random" else "evolutionary"
    trials_out = tune(task.mod, target, search=search, cost_model=cost_model, trials=trials, seed=seed)
    return [median_secs(t) for t in trials_out]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="bench/data/tuning_dataset.json.gz")
    ap.add_argument("--model", default="tir_schedules/world_model/pretrained.pt")
    ap.add_argument("--out", default="bench/out/search_eval")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=800, help="pretraining steps")
    ap.add_argument("--tasks", default="", help="comma-separated held-out task families to search")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--ranking-only", action="store_true",
                    help="recompute the held-out ranking; keep the search runs already in --out.json")
    ap.add_argument("--resume", action="store_true", help="skip search runs already in --out.json")
    args = ap.parse_args(argv)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    if args.report_only:
        with open(args.out + ".json") as f:
            write_markdown(json.load(f), args.out + ".md")
        return

    from tir_schedules.world_model.dataset import load_tasks
    from tir_schedules.world_model.pretrain import pretrain
    from tir_schedules.world_model.tuning import tuning_target
    from tir_schedules.world_model.trace_json import plain
    from tir_schedules.world_model.workloads import SCAN
    target = tuning_target()
    tasks = load_tasks(args.data, target)
    train = [t for t in tasks if t.split == "train"]
    heldout = [t for t in tasks if t.split == "heldout"]
    wm, loss, secs = pretrain(train, steps=args.steps)
    wm.save(args.model)
    previous = {}
    if (args.resume or args.ranking_only) and os.path.exists(args.out + ".json"):
        with open(args.out + ".json") as f:
            previous = json.load(f)
    result = {"trials": args.trials, "seeds": args.seeds, "target": plain(target.export()),
              "pretrain": {"tasks": len(train), "records": sum(t.group.n for t in train),
                           "loss": loss, "seconds": secs},
              "ranking": ranking_eval(train, heldout, wm, target), "search": previous.get("search", {})}
    if args.ranking_only:
        with open(args.out + ".json", "w") as f:
            json.dump(result, f)
        write_markdown(result, args.out + ".md")
        return
    print(f"[eval] pretrained in {secs:.1f} s; ranking: {json.dumps(result['ranking'])}", file=sys.stderr)
    wanted = set(filter(None, args.tasks.split(",")))
    search_tasks = [t for t in heldout if not wanted or t.family in wanted]
    phases = [[t for t in search_tasks if t.family not in SCAN],
              [t for t in search_tasks if t.family in SCAN]]
    runs = [(seed, t) for phase in phases for seed in range(args.seeds) for t in phase]
    for seed, t in runs:   # standard tasks (all seeds) first: they are the cheaper, complete table
        for method in METHODS:
            if str(seed) in result["search"].get(t.name, {}).get(method, {}):
                continue                                  # --resume: measured already
            start = time.time()
            try:
                lat = search_run(t, method, seed, args.trials, args.model, target)
            except Exception as err:
                print(f"[eval] {t.name} {method} seed {seed}: FAILED {type(err).__name__}: {err}",
                      file=sys.stderr, flush=True)
                continue
            result["search"].setdefault(t.name, {}).setdefault(method, {})[str(seed)] = lat
            print(f"[eval] {t.name} {method} seed {seed}: best {min(lat) * 1e6:.1f} us "
                  f"({len(lat)} trials, {time.time() - start:.0f} s)", file=sys.stderr, flush=True)
            with open(args.out + ".json", "w") as f:
                json.dump(result, f)
    write_markdown(result, args.out + ".md")


if __name__ == "__main__":
    main()
