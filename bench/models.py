"""Whole-model CPU benchmark: PyTorch models with a recurrence, through TVM with and without
the ScanWeaver pass, next to PyTorch eager, all measured in one run.

    python -m bench.models [--quick] [--lengths 64 256 1024] [--models mamba2:1024 rwkv:64,256]
                           [--out bench/out]

For each model at each L: import time (torch.export + Relax frontend; the same module feeds
both TVM paths, so it is reported once), compile and run time with the pass
(``api.compile(mod, "llvm")``) and without it (``tvm.compile`` on the unrolled graph), PyTorch
eager (``torch.set_num_threads(2)``, ``no_grad``; and 1 thread) and OpenVINO (``ov.convert_model``
of the same module, the CPU plugin at f32 with 2 threads).  Every output is checked against
PyTorch (max relative error <= 1e-4 for the TVM paths; a failing TVM check is reported, and
makes the exit status 1).  The run times are measured interleaved: round after round, each
path in turn (a batch of calls >= 1 ms), so that a busy spell of the machine hits every path
alike; medians over the rounds.  One profile per TVM path says where the run time goes: each
compiled kernel is timed on its own (scan kernel, other kernels), the rest of the run is the VM
(builtins, dispatch), and the number of VM calls is counted.  Writes ``models.json`` (after
every row, so a long run that dies keeps what it measured) and ``models.md`` into ``--out``.

``--models`` takes names, each optionally with its own lengths (``rwkv:64,256``); a name without
lengths runs at ``--lengths`` (or the model's own default, ``MODEL_LENGTHS``).  The HF models
at the real width import slowly as unrolled graphs (RWKV at L=1024: ~10 min), so ``mamba2`` and
``rwkv`` are not in the default set.
"""
import argparse
import gc
import os
import platform
import sys
import time

import numpy as np

from . import outputs
from .models_report import THREADS, TOL, _targets, report
from .models_runners import PATHS, _flat, eager_runner, onnx_runtime, openvino_runner, tvm_path
from .models_timing import _T0, _log_profile, interleaved, log, profile, step
from .models_zoo import make_model

LENGTHS = (64, 256, 1024)
QUICK_LENGTHS = (16, 64)
MODELS = ("mamba", "ema", "hf_mamba", "mamba2", "rwkv", "xlstm")
DEFAULT_MODELS = ("mamba", "ema", "hf_mamba")
MODEL_LENGTHS = {"rwkv": (64, 256)}        # its unrolled import grows fast with L
# the peers timed with the TVM paths: key in the row, label, whether it is a "best peer"
PEERS = (("eager", f"PyTorch eager ({THREADS} threads)", True), ("eager_1t", "PyTorch eager (1 thread)", False),
         ("openvino", "OpenVINO (CPU, f32)", True), ("ort", "ONNX Runtime", False))


def bench_one(name, length, budget_s, paths=PATHS):
    """One row; ``paths``: the TVM paths to build (``--no-baseline``: with the pass only)."""
    import torch

    from scanweaver_tvm import api

    model, inputs = make_model(name, length)
    shape = "x".join(map(str, inputs[0].shape))
    log(f"{name} L={length}: input {shape}")
    row = {"model": name, "L": length, "input_shape": [list(x.shape) for x in inputs]}
    with torch.no_grad():
        want = [y.numpy() for y in _flat(model(*inputs))]
    try:
        with step("importing (torch.export + Relax frontend)", row, "import_s"):
            mod = api.from_torch(model, inputs)
        row["bindings"] = sum(len(b.bindings) for b in mod["main"].body.blocks)
        row["recurrences"] = [str(r) for r in api.find_recurrences(mod, include_rejected=True)]
        for r in row["recurrences"]:
            log(f"    found: {r}")
    except Exception as e:
        row["error"] = f"import failed: {type(e).__name__}: {e}".splitlines()[0][:300]
        log(f"  {row['error']}")
        return row
    runs, vms = {}, {}
    for which, label in paths:
        row[which], runner = tvm_path(which, mod, inputs, want)
        if runner is not None:
            runs[which], vms[which] = runner[0], runner[1:]
        gc.collect()
    row["openvino"], run = openvino_runner(model, inputs, want)
    if run is not None:
        runs["openvino"] = run
    if name == "hf_mamba":
        row["ort"], run = onnx_runtime(model, inputs, want)
        if run is not None:
            runs["ort"] = run
    runs["eager"] = eager_runner(model, inputs, THREADS)
    runs["eager_1t"] = eager_runner(model, inputs, 1)
    with step(f"timing {len(runs)} paths interleaved ({', '.join(runs)})"):
        timed = interleaved(runs, budget_s)
    for key, stats in timed.items():
        row.setdefault(key, {})["run"] = stats
    for which, label in paths:
        if which in vms:
            with step(f"profiling {label} (kernels timed one by one)"):
                row[which]["profile"] = profile(*vms[which], row[which]["run"]["ms"])
            _log_profile(label, row[which])
    vms.clear()
    runs.clear()
    for key, label, _ in PEERS:
        if "run" in row.get(key, {}):
            log(f"  {label:30s} {row[key]['run']['ms']:9.3f} ms (n={row[key]['run']['n']})")
    row["ratios"] = ratios(row)
    log("  " + ", ".join(f"{k} {v:.2f}x" for k, v in row["ratios"].items()))
    return row


def best_peer(row):
    """``(key, ms)`` of the fastest of the peers users pick (PyTorch eager, 2 threads, and
    OpenVINO), among those that ran and passed their check; None when none did."""
    timed = [(row[k]["run"]["ms"], k) for k, _, best in PEERS
             if best and "run" in row.get(k, {}) and row[k].get("ok", True)]
    return (min(timed)[1], min(timed)[0]) if timed else None


def ratios(row):
    w, wo = row.get("with", {}), row.get("without", {})
    out = {}
    if "runnable_s" in w and "runnable_s" in wo:
        out["compile speedup"] = wo["runnable_s"] / w["runnable_s"]
        out["tvm.compile speedup"] = wo["compile_s"] / w["compile_s"]
    if "run" in w and "run" in wo:
        out["run speedup"] = wo["run"]["ms"] / w["run"]["ms"]
    if "run" in w:
        for key, name in (("eager", "vs eager"), ("eager_1t", "vs eager 1t"),
                          ("openvino", "vs openvino"), ("ort", "vs onnxruntime")):
            if "run" in row.get(key, {}):
                out[name] = row[key]["run"]["ms"] / w["run"]["ms"]
        best = best_peer(row)
        if best:
            out["vs best peer"] = best[1] / w["run"]["ms"]
    return out


def _machine():
    import torch
    import tvm

    from scanweaver_tvm import api

    info = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "numpy": np.__version__,
            "torch": torch.__version__, "tvm": tvm.__version__, "openvino": _version("openvino"),
            "target": str(api._target("llvm")),
            "TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS", "unset (TVM default)"),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
            "loadavg_1min_start": os.getloadavg()[0]}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return info


def _version(package):
    try:
        from importlib.metadata import version
        return version(package)
    except Exception:  # pylint: disable=broad-except  # not installed
        return None


def _write(out_dir, result):
    return outputs.write(out_dir, "models", result, report(result))


def _plan(specs, lengths):
    """``[(name, lengths)]`` from ``--models`` items ``name`` or ``name:L1,L2``."""
    plan = []
    for spec in specs:
        name, _, given = spec.partition(":")
        if name not in MODELS:
            raise SystemExit(f"--models: unknown model {name!r} (choose from {', '.join(MODELS)})")
        own = [int(x) for x in given.split(",") if x] if given else None
        plan.append((name, own or lengths or MODEL_LENGTHS.get(name, LENGTHS)))
    return plan


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"L in {QUICK_LENGTHS}: a smoke run")
    p.add_argument("--lengths", type=int, nargs="+",
                   help=f"sequence lengths (default {LENGTHS}; per model: {MODEL_LENGTHS})")
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), metavar="NAME[:L1,L2]",
                   help=f"models ({', '.join(MODELS)}; default {' '.join(DEFAULT_MODELS)}), each "
                        "optionally with its own lengths")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out"))
    p.add_argument("--budget", type=float, default=5.0, help="seconds of timing per method")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip TVM without the pass (an unrolled or chunked graph at a long L "
                        "takes minutes a call); the peers are still timed")
    args = p.parse_args(argv)
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else None)
    plan = _plan(args.models, lengths)
    budget = 1.0 if args.quick else args.budget

    import torch

    torch.set_num_threads(THREADS)
    result = {"machine": _machine(), "tol": TOL, "lengths": sorted({n for _, ls in plan for n in ls}),
              "plan": [[name, list(ls)] for name, ls in plan], "rows": [], "notes": []}
    log(f"whole-model benchmark: {', '.join(f'{n} L={list(ls)}' for n, ls in plan)}, "
        f"load average {result['machine']['loadavg_1min_start']:.1f}")
    loads = [result["machine"]["loadavg_1min_start"]]
    for name, model_lengths in plan:
        for length in model_lengths:
            row = bench_one(name, length, budget, PATHS[:1] if args.no_baseline else PATHS)
            row["loadavg_1min"] = os.getloadavg()[0]
            loads.append(row["loadavg_1min"])
            result["rows"].append(row)
            gc.collect()
            result["seconds"] = time.perf_counter() - _T0
            _write(args.out, result)                       # partial results survive a crash

    notes = []
    failed = [f"{r['model']} L={r['L']} {label}" for r in result["rows"] for which, label in PATHS
              if (which in r or which == "with") and not r.get(which, {}).get("ok", False)]
    failed += [f"{r['model']} L={r['L']}: {r['error']}" for r in result["rows"] if "error" in r]
    if failed:
        notes.append("FAILED (check above tolerance or error): " + "; ".join(failed))
    peers = [f"{r['model']} L={r['L']} {label}: " + (r[key].get("error") or f"rel err {r[key]['rel_err']:.1e}")
             for r in result["rows"] for key, label, _ in PEERS if key in ("openvino", "ort")
             and key in r and (r[key].get("error") or not r[key].get("ok", True))]
    if peers:
        notes.append("peers that failed or missed the check (left out of the best peer): " + "; ".join(peers))
    result["machine"]["loadavg_1min_end"] = os.getloadavg()[0]
    if max(loads) > 0.5:
        notes.append(f"the machine was busy (1-min load average {min(loads):.1f}..{max(loads):.1f} "
                     f"on {result['machine']['cores']} cores during the run, other jobs sharing it): "
                     "every time here is inflated and noisy, multi-threaded ones (TVM's thread "
                     "pool, PyTorch with 2 threads) most; the ratios are within one run")
    result["targets"] = _targets(result["rows"])
    result["notes"] = notes
    result["seconds"] = time.perf_counter() - _T0
    md = _write(args.out, result)
    print("\n" + md)
    log(f"wrote {args.out}/models.json and models.md")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
