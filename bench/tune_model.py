"""A whole model tuned by ``sw.tune`` against the same model untuned: ``python -m bench.tune_model``.

HF Mamba at the real width (``bench.models_zoo.hf_mamba``: d_model 768, d_inner 1536, N 16, its
vocabulary), imported at one length; ``sw.tune(mod, trials=T, cost_model=...)`` tunes every
kernel (the scans and, through MetaSchedule, every other kernel with static shapes), then
``sw.compile(mod, database=db)`` against ``sw.compile(mod)``.  Both are checked against
PyTorch and timed interleaved in the same run (``bench.models_timing.interleaved``), with the tuning
time.  Writes ``tune_model_<cost model>.json`` / ``.md`` into ``--out``.
"""
import argparse
import json
import os
import platform
import sys
import time


def run(length, layers, trials, cost_model, work_dir, budget_s):
    import tvm
    from tvm import relax

    import scanweaver_tvm as sw
    from bench.models_runners import check, vm_runner
    from bench.models_timing import interleaved
    from bench.models_zoo import hf_mamba
    model, inputs = hf_mamba(length, layers=layers)
    import torch
    with torch.no_grad():
        want = [model(*inputs).numpy()]
    mod = sw.from_torch(model, inputs)
    start = time.time()
    db = sw.tune(mod, "llvm", trials=trials, cost_model=cost_model, work_dir=work_dir, progress=False)
    tune_s = time.time() - start
    paths = {}
    for label, database in (("untuned", None), ("tuned", db)):
        ex = sw.compile(mod, "llvm", database=database)
        fn, _, _ = vm_runner(ex, inputs)
        err = check(fn(), want)
        paths[label] = fn
        print(f"[tune_model] {label}: max rel err vs PyTorch {err:.1e}", file=sys.stderr, flush=True)
        if err > 1e-3:
            raise AssertionError(f"{label}: max relative error {err:.1e} against PyTorch")
    times = interleaved(paths, budget_s)
    from tvm.s_tir import meta_schedule as ms
    measured = len(ms.database.JSONDatabase(work_dir=work_dir).get_all_tuning_records())
    with open(os.path.join(work_dir, "applied", "comparison.json")) as f:
        comparison = json.load(f)
    return {"length": length, "layers": layers, "trials_per_task": trials, "cost_model": cost_model,
            "tune_s": tune_s, "records": measured, "records_applied": len(db.get_all_tuning_records()),
            "comparison": comparison, "times": times,
            "speedup": times["untuned"]["ms"] / times["tuned"]["ms"], "device": str(tvm.cpu())}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--trials", type=int, default=64, help="measured trials per task")
    ap.add_argument("--cost-model", default="xgb", choices=("xgb", "world", "random"))
    ap.add_argument("--work-dir", default="/tmp/scanweaver_tune_model")
    ap.add_argument("--budget", type=float, default=5.0, help="seconds of timing per path")
    ap.add_argument("--out", default="bench/out_tune_model")
    args = ap.parse_args(argv)
    result = run(args.length, args.layers, args.trials, args.cost_model,
                 os.path.join(args.work_dir, args.cost_model), args.budget)
    result["machine"] = platform.processor() or platform.machine()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"tune_model_{args.cost_model}.json"), "w") as f:
        json.dump(result, f, indent=1)
    t = result["times"]
    md = (f"HF Mamba (real width, {args.layers} layers, L={args.length}), {args.trials} trials a task with "
          f"{args.cost_model} ({result['records']} records measured, {result['tune_s'] / 60:.1f} min of tuning; "
          f"{sum(c['kept'] for c in result['comparison'])} of {len(result['comparison'])} kernels keep their "
          f"record, the rest beat by the rule): "
          f"untuned {t['untuned']['ms']:.1f} ms, tuned {t['tuned']['ms']:.1f} ms, "
          f"**{result['speedup']:.2f}x** (medians, interleaved, same run).\n")
    with open(os.path.join(args.out, f"tune_model_{args.cost_model}.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
