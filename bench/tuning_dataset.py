"""Build the world model's tuning dataset on this CPU: ``python -m bench.tuning_dataset``.

Each task is tuned with MetaSchedule (random sampling of its design space, ``ReplayTrace``,
so records spread over the space) and every measured trial is stored: the task (family and
shape, enough to rebuild its initial program), the trace (the action sequence with its
decisions) and the run times.  Standard workloads use the in-process builder/runner
(``tir_schedules.world_model.measure``: ``time_evaluator`` with ``number=3, repeat=3,
min_repeat_ms=10``, one thread); scan tasks go through ``tir_schedules.search.tune_task``
(its own LocalBuilder/LocalRunner).  The machine is shared: latencies are noisy.

Writes ``bench/data/tuning_dataset.json.gz`` (a few hundred KB).
"""
import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TVM_NUM_THREADS", "1")

# (family, params, split): "train" tasks train the model; "heldout" ones are only evaluated
TASKS = [
    ("matmul", [64, 64, 64], "train"), ("matmul", [128, 64, 128], "train"),
    ("matmul", [32, 128, 64], "train"), ("matmul", [96, 96, 96], "heldout"),
    ("conv2d", [1, 14, 14, 16, 16, 3, 1, 1], "train"), ("conv2d", [1, 8, 8, 32, 32, 3, 1, 1], "train"),
    ("conv2d", [1, 12, 12, 24, 24, 3, 1, 1], "heldout"),
    ("softmax", [64, 256], "train"), ("softmax", [128, 128], "train"), ("softmax", [96, 192], "heldout"),
    ("layernorm", [32, 256], "train"), ("layernorm", [64, 128], "train"), ("layernorm", [48, 192], "heldout"),
]
SCAN_TASKS = [
    ("scan_affine", {"shape": [64, 1024]}, "train"), ("scan_affine", {"shape": [256, 512]}, "train"),
    ("scan_affine", {"shape": [128, 2048]}, "heldout"),
]


def _scan_records(family, params, target, trials, seed):
    from tir_schedules.search import tune_task
    from tir_schedules.world_model import workloads
    from tir_schedules.world_model.trace_json import plain
    with tempfile.TemporaryDirectory(prefix="wm_scan_") as wd:
        db = tune_task(workloads.spec_of(family, params), target, cost_model="random", trials=trials,
                       seed=seed, work_dir=wd, progress=False)
        return [{"trace": plain(r.trace.as_json()), "secs": [float(s) for s in r.run_secs]}
                for r in db.get_all_tuning_records()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=48, help="measured trials per task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-scan", action="store_true", help="standard workloads only")
    ap.add_argument("--out", default="bench/data/tuning_dataset.json.gz")
    args = ap.parse_args(argv)

    from tir_schedules.world_model import dataset, workloads
    from tir_schedules.world_model.tuning import tune, tuning_target
    target = tuning_target()
    tasks = TASKS + ([] if args.no_scan else SCAN_TASKS)
    from tir_schedules.world_model.trace_json import plain
    out = {"version": dataset.VERSION, "target": plain(target.export()), "trials": args.trials,
           "seed": args.seed, "runner": "time_evaluator number=3 repeat=3 min_repeat_ms=10, 1 thread",
           "tasks": []}
    for i, (family, params, split) in enumerate(tasks):
        start = time.time()
        try:
            if family in workloads.SCAN:
                records = _scan_records(family, params, target, args.trials, args.seed + i)
            else:
                records = tune(workloads.module(family, params), target, search="random",
                               trials=args.trials, seed=args.seed + i)
        except Exception as err:  # one failing task must not lose the others; say so
            print(f"[dataset] {family} {params}: FAILED {type(err).__name__}: {err}", file=sys.stderr)
            continue
        ok = [r for r in records if r["secs"]]
        best = min((min(r["secs"]) for r in ok), default=float("nan"))
        print(f"[dataset] {family} {params} ({split}): {len(ok)}/{len(records)} measured, "
              f"best {best * 1e6:.1f} us, {time.time() - start:.0f} s", file=sys.stderr, flush=True)
        out["tasks"].append({"name": workloads.task_name(family, params), "family": family,
                             "params": params, "split": split, "records": records})
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        dataset.save(args.out, out)   # after every task: a late failure keeps the others
    print(f"[dataset] wrote {args.out} ({os.path.getsize(args.out) // 1024} KB, "
          f"{sum(len(t['records']) for t in out['tasks'])} records)", file=sys.stderr)


if __name__ == "__main__":
    main()
