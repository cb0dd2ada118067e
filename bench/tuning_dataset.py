"""The world model's tuning dataset, measured on this CPU: ``python -m bench.tuning_dataset``.

Resumable, in two steps:

1. ``--init``: write one file per task under ``bench/data/tuning/`` (``<task id>.json.gz``):
   the task (family and parameters, or a model kernel's TVMScript), its split, no records.
   Tasks are LLM-shaped kernels (matmuls with M in {1, 64, 512}, depthwise conv1d, RMSNorm,
   LayerNorm, softmax), ScanWeaver scan specs, and the kernels ``sw.tune`` extracts from whole
   models (``scanweaver_tvm.tuning.model_tasks``: HF Mamba and Mamba-2 at the real width,
   Qwen3-Next's Gated DeltaNet layers), deduplicated structurally (``model_tasks`` leaves out
   the kernels that only move data).  Left out too: kernels over ~0.5 GFLOP (the vocabulary
   projections: a slow candidate would cost seconds).
2. Measure, round after round, until ``--per-task`` records or ``--minutes`` are reached: the
   task with the fewest records gets a round of ``--round`` trials, alternately sampled
   uniformly from MetaSchedule's design space (``ReplayTrace``: spread over the space) and
   found by its evolutionary search with XGBoost (near the good schedules a search visits).
   Each round is saved when it ends.  ``--worker i/n`` splits the tasks between processes.
   A task is done (``"done"`` in its file, so a rerun skips it) when a round finds fewer than
   half its trials to measure (its space is nearly all measured), when it is a scan spec after
   two rounds (a few dozen points, which every round measures again), or when its trials take
   over 1.5 s each after two rounds (softmax: some sampled unrollings take TVM's lowering
   seconds to build, up to the builder's 30 s limit).

A record is ``{"trace": trace JSON, "secs": [run seconds], "round": r}`` (``secs`` null when
the candidate failed to build or run).  Timing: ``time_evaluator`` in the tuning process, one
thread (``world_model.measure``); scan tasks: ``sw.tune``'s ``LocalRunner``.  The machine is
shared and the timings are noisy: rank within a task, never across tasks.
"""
import argparse
import glob
import hashlib
import os
import sys
import tempfile
import time

os.environ.setdefault("TVM_NUM_THREADS", "1")

DATA_DIR = "bench/data/tuning"
MAX_FLOPS = 5e8
SLOW_TRIAL_S = 1.5     # a task whose trials take longer (mostly LLVM building) stops after 2 rounds

_LLM = [(1, 1536, 768), (1, 3072, 768), (1, 768, 1536), (1, 2048, 512), (1, 512, 2048),
        (64, 768, 768), (64, 256, 1536), (64, 1536, 256), (64, 2048, 512),
        (512, 256, 512), (512, 512, 256), (512, 768, 128)]
# (family, params, split): "train" tasks train the world model; "heldout" ones only evaluate it
FAMILY_TASKS = (
    [("matmul", list(p), "train") for p in _LLM]
    + [("matmul", [1, 2816, 1024], "heldout"), ("matmul", [64, 1024, 1024], "heldout"),
       ("matmul", [512, 384, 384], "heldout")]
    + [("conv1d_dw", [1, 1536, 64, 4], "train"), ("conv1d_dw", [1, 768, 256, 4], "train"),
       ("conv1d_dw", [2, 512, 128, 4], "train"), ("conv1d_dw", [1, 2048, 128, 4], "heldout")]
    + [("rmsnorm", [64, 768], "train"), ("rmsnorm", [256, 1024], "train"), ("rmsnorm", [1, 2048], "train"),
       ("rmsnorm", [32, 2560], "heldout")]
    + [("layernorm", [64, 768], "train"), ("layernorm", [128, 512], "train"),
       ("layernorm", [96, 384], "heldout")]
    + [("softmax", [64, 256], "train"), ("softmax", [128, 1024], "train"), ("softmax", [16, 2048], "train"),
       ("softmax", [256, 512], "heldout")]
    + [("scan_affine", {"shape": [64, 1024]}, "train"), ("scan_affine", {"shape": [256, 512]}, "train"),
       ("scan_affine", {"shape": [128, 2048]}, "heldout")])
# (bench model, sequence length, split) whose kernels become tasks
MODEL_TASKS = [("hf_mamba", 64, "train"), ("hf_mamba2", 64, "train"), ("qwen3_next_layers", 64, "heldout")]


def _model(name, length):
    import torch
    if name == "qwen3_next_layers":
        from bench.delta_layers import Layers
        return Layers().module, [torch.randn(1, length, 1024)]
    from bench import models_zoo
    model, inputs = getattr(models_zoo, name)(length, layers=1)
    return model, inputs


def model_kernels(name, length):
    """``[(kernel name, PrimFunc), ...]`` of a bench model's ``sw.tune`` tasks under ``MAX_FLOPS``."""
    from tvm.s_tir.analysis import estimate_tir_flops

    import scanweaver_tvm as sw
    from scanweaver_tvm.tuning import model_tasks
    model, inputs = _model(name, length)
    out = []
    for task in model_tasks(sw.from_torch(model, inputs), "llvm"):
        func = task.dispatched[0]["main"]
        if estimate_tir_flops(task.dispatched[0]) <= MAX_FLOPS:
            out.append((task.task_name, func))
    return out


def task_id(name):
    """A file name for a task: readable prefix and a hash of its full name."""
    stem = "".join(c if c.isalnum() else "_" for c in name)[:60]
    return f"{stem}-{hashlib.sha1(name.encode()).hexdigest()[:10]}"


def init(data_dir):
    """One record-less file per task (kept when it exists: its records are the measured work)."""
    import tvm_ffi
    from tir_schedules.world_model import dataset, workloads
    entries, seen = [], set()
    for family, params, split in FAMILY_TASKS:
        entries.append({"name": workloads.task_name(family, params), "family": family, "params": params,
                        "split": split})
        seen.add(tvm_ffi.structural_hash(workloads.build(family, params)))
    for model, length, split in MODEL_TASKS:
        for kernel, func in model_kernels(model, length):
            key = tvm_ffi.structural_hash(func)
            if key in seen:
                continue
            seen.add(key)
            entries.append({"name": f"model:{model}@{length}:{kernel}", "family": workloads.MODEL,
                            "params": {"model": model, "length": length, "kernel": kernel},
                            "split": split, "script": func.script()})
    os.makedirs(data_dir, exist_ok=True)
    for entry in entries:
        path = os.path.join(data_dir, task_id(entry["name"]) + ".json.gz")
        if not os.path.exists(path):
            dataset.save(path, {"version": dataset.VERSION, **entry, "records": []})
        print(f"[dataset] {entry['split']:8s} {entry['name'][:100]}", file=sys.stderr)
    print(f"[dataset] {len(entries)} tasks in {data_dir}", file=sys.stderr)


def measure_round(task, target, trials, seed, evolutionary):
    """One round's records of a task: ``trials`` candidates, sampled or searched."""
    from tvm.s_tir import meta_schedule as ms

    from tir_schedules.world_model import workloads
    from tir_schedules.world_model.trace_json import plain
    from tir_schedules.world_model.tuning import tune
    if task["family"] in workloads.SCAN:
        from tir_schedules.search import tune_task
        with tempfile.TemporaryDirectory(prefix="wm_scan_") as wd:
            db = tune_task(workloads.spec_of(task["family"], task["params"]), target,
                           cost_model="xgb" if evolutionary else "random", trials=trials, seed=seed,
                           work_dir=wd, progress=False)
            return [{"trace": plain(r.trace.as_json()), "secs": [float(s) for s in r.run_secs]}
                    for r in db.get_all_tuning_records()]
    model = ms.cost_model.XGBModel(num_warmup_samples=0, num_tuning_cores=1) if evolutionary else "random"
    return tune(workloads.task_module(task), target, search="evolutionary" if evolutionary else "random",
                cost_model=model, trials=trials, seed=seed)


def _rounded(records, r):
    for rec in records:
        rec["round"] = r
        if rec["secs"]:
            rec["secs"] = [float(f"{s:.4g}") for s in rec["secs"]]
    return records


def collect(data_dir, worker, workers, per_task, trials, minutes):
    from tir_schedules.world_model import dataset, workloads
    from tir_schedules.world_model.tuning import tuning_target
    target = tuning_target()
    paths = [p for p in sorted(glob.glob(os.path.join(data_dir, "*.json.gz")))[worker::workers]
             if not dataset.load(p).get("done")]
    deadline = time.time() + 60 * minutes
    while paths and time.time() < deadline:
        tasks = [(len(dataset.load(p)["records"]), p) for p in paths]
        count, path = min(tasks)
        if count >= per_task:
            break
        task = dataset.load(path)
        r = 1 + max((rec.get("round", 0) for rec in task["records"]), default=0)
        seed = int(hashlib.sha1(f"{task['name']}/{r}".encode()).hexdigest()[:7], 16)
        start = time.time()
        try:
            records = measure_round(task, target, trials, seed, evolutionary=r % 2 == 0)
        except Exception as err:  # pylint: disable=broad-except (say so; keep the other tasks going)
            print(f"[dataset] {task['name'][:80]} round {r}: FAILED {type(err).__name__}: {err}",
                  file=sys.stderr, flush=True)
            paths.remove(path)
            continue
        task["records"] += _rounded(records, r)
        if len(records) < trials // 2 or (task["family"] in workloads.SCAN and r >= 2):
            task["done"] = "space measured"     # (nearly) all of it: a scan spec's few knobs
        elif r >= 2 and time.time() - start > SLOW_TRIAL_S * trials:
            task["done"] = "slow"               # to build (softmax: large unrolled reductions)
        dataset.save(path + ".tmp", task)
        os.replace(path + ".tmp", path)
        if task.get("done"):
            paths.remove(path)
        ok = [min(x["secs"]) for x in records if x["secs"]]
        print(f"[dataset] w{worker} {task['name'][:70]} round {r}: {len(ok)}/{len(records)} measured, "
              f"best {min(ok, default=float('nan')) * 1e6:.1f} us, {time.time() - start:.0f} s; "
              f"{len(task['records'])} records", file=sys.stderr, flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=DATA_DIR)
    ap.add_argument("--init", action="store_true", help="write the task files (no measurement)")
    ap.add_argument("--worker", default="0/1", help="i/n: this process measures every n-th task from i")
    ap.add_argument("--per-task", type=int, default=448, help="records per task to reach")
    ap.add_argument("--round", type=int, default=64, help="trials per round")
    ap.add_argument("--minutes", type=float, default=60.0, help="stop starting rounds after this")
    args = ap.parse_args(argv)
    if args.init:
        init(args.dir)
        return
    worker, workers = (int(x) for x in args.worker.split("/"))
    collect(args.dir, worker, workers, args.per_task, args.round, args.minutes)


if __name__ == "__main__":
    main()
