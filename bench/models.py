"""Whole-model CPU benchmark: PyTorch models with a recurrence, through TVM with and without
the ScanWeaver pass, next to PyTorch eager, all measured in one run.

    python -m bench.models [--quick] [--lengths 64 256 1024] [--out bench/out]

For the Mamba block and the EMA model at each L: import time (torch.export + Relax frontend;
the same module feeds both TVM paths, so it is reported once), compile and run time with the
pass (``api.compile(mod, "llvm")``) and without it (``tvm.compile`` on the unrolled graph),
and PyTorch eager (``torch.set_num_threads(2)``, ``no_grad``).  Both TVM outputs are checked
against PyTorch (max relative error <= 1e-4; a failing check is reported, and makes the exit
status 1).  Run times are medians of repeated ``VirtualMachine`` calls after a warm-up.  One
profile per path says where the run time goes: each compiled kernel is timed on its own
(scan kernel, other kernels), the rest of the run is the VM (builtins, dispatch), and the
number of VM calls is counted.  Writes ``models.json`` (after every row, so a
long run that dies keeps what it measured) and ``models.md`` into ``--out``.
"""
import argparse
import contextlib
import gc
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

from . import outputs, rel_err, time_ms
from .models_report import THREADS, TOL, _targets, report

LENGTHS = (64, 256, 1024)
QUICK_LENGTHS = (16, 64)
MODELS = ("mamba", "ema", "hf_mamba")
PATHS = (("with", "TVM + pass"), ("without", "TVM, no pass"))

_T0 = time.perf_counter()


def log(msg):
    print(f"[{time.perf_counter() - _T0:7.1f}s] {msg}", flush=True)


@contextlib.contextmanager
def step(what, into=None, key=None):
    """Progress line ``what ... 12.3 s``; the seconds land in ``into[key]``.  TVM's C++ log
    warnings (thousands of identical lines on an unrolled graph) go to a temporary file and
    are summarized in one line instead of flooding the progress log."""
    print(f"[{time.perf_counter() - _T0:7.1f}s]   {what} ...", end="", flush=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines = [l for l in tmp.read().decode(errors="replace").splitlines() if l.strip()]
            if into is not None:
                into[key] = dt
            extra = ""
            if lines:
                kinds = {l.split("] ", 1)[-1] for l in lines}
                first = min(kinds, key=len)
                extra = f"   ({len(lines)} stderr lines, {len(kinds)} distinct, e.g. {first[:90]!r})"
            print(f" {dt:.1f} s{extra}", flush=True)


# ---------------------------------------------------------------- models and runners

def make_model(name, length):
    from scanweaver_tvm import models

    if name == "mamba":
        return models.mamba_block(length=length)
    if name == "ema":
        return models.ema(length=length)
    if name == "hf_mamba":
        return hf_mamba(length)
    raise ValueError(name)


def hf_mamba(length, layers=2, batch=1):
    """transformers' ``MambaForCausalLM`` at the real width (d_model 768, d_inner 1536, N 16;
    its default vocabulary), random weights, returning the logits as users time them."""
    import torch
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    cfg = MambaConfig(hidden_size=768, state_size=16, num_hidden_layers=layers, expand=2)
    lm = MambaForCausalLM(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids):
            return self.lm(input_ids, use_cache=False).logits

    ids = torch.randint(0, cfg.vocab_size, (batch, length), generator=torch.Generator().manual_seed(1))
    return Logits().eval(), [ids]


def _flat(x):
    """Leaves of nested outputs: torch tensors, or TVM tensors in (tvm_ffi) Arrays."""
    if hasattr(x, "numpy"):
        return [x]
    return [y for item in x for y in _flat(item)]


def vm_runner(ex, inputs):
    """``(run, vm, args)``: ``run()`` calls ``main`` once on inputs already on the device."""
    import tvm
    from tvm import relax

    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(x.numpy(), dev) for x in inputs]
    main = vm["main"]
    return (lambda: main(*args)), vm, args


def check(out, want):
    """Max relative error over the model's outputs (TVM returns a tuple of them)."""
    got = _flat(out)
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} outputs from TVM, {len(want)} from PyTorch")
    return max(rel_err(g.numpy(), w) for g, w in zip(got, want))


def _per_call_ms(fn, budget_s=0.3):
    """Median ms of one ``fn()`` call, timed in batches long enough (>= 1 ms) to amortize."""
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    number = max(1, min(1000, int(1e-3 / max(one, 1e-7))))
    samples, start = [], time.perf_counter()
    while len(samples) < 3 or (len(samples) < 9 and time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append(1e3 * (time.perf_counter() - t0) / number)
    return statistics.median(samples)


def profile(vm, args, run_ms):
    """Where one call of ``main`` spends its time.  One instrumented call records every VM
    call instruction; for each compiled kernel (anything but ``vm.builtin.*``) its first call's
    arguments are copied, and the kernel is then timed on its own (no hook in the way: a hook
    costs more than many of these kernels) and counted as calls x time.  A kernel's shapes are
    static, so every call of one symbol costs the same.  ``rest_ms`` = ``run_ms`` minus the
    kernels: the VM's builtins (allocation, reshape views, tuples) and its dispatch."""
    import tvm

    counts, captured = {}, {}

    def copy(a):
        if isinstance(a, tvm.runtime.Tensor):
            return tvm.runtime.tensor(a.numpy(), a.device)
        return a

    def instrument(func, symbol, before, ret, *a):
        if before:
            counts[symbol] = counts.get(symbol, 0) + 1
            if symbol not in captured and not symbol.startswith("vm."):
                captured[symbol] = (func, [copy(x) for x in a])
        return 0                                         # VMInstrumentReturnKind.NO_OP

    vm.set_instrument(instrument)
    try:
        vm["main"](*args)
    finally:
        vm.set_instrument(lambda *a: 0)
    kernels = []
    for symbol, (func, fargs) in captured.items():
        ms = _per_call_ms(lambda: func(*fargs))
        kernels.append({"symbol": symbol, "calls": counts[symbol], "ms_per_call": ms,
                        "ms": counts[symbol] * ms})
    kernels.sort(key=lambda k: -k["ms"])
    scan = sum(k["ms"] for k in kernels if k["symbol"].startswith("scanweaver"))
    other = sum(k["ms"] for k in kernels if not k["symbol"].startswith("scanweaver"))
    builtins = sum(n for s, n in counts.items() if s.startswith("vm."))
    return {"calls": sum(counts.values()), "builtin_calls": builtins, "scan_ms": scan,
            "kernels_ms": other, "rest_ms": run_ms - scan - other, "kernels": kernels[:8]}


def tvm_path(which, mod, inputs, want, budget_s):
    """Compile ``mod`` with (``which == "with"``) or without the pass, check, time, profile."""
    import tvm

    from scanweaver_tvm import api

    res = {}
    label = dict(PATHS)[which]
    try:
        with step(f"compiling {label}", res, "compile_s"):
            if which == "with":
                ex = api.compile(mod, "llvm")
            else:
                ex = tvm.compile(mod, target=api._target("llvm"))
        # tvm.compile returns before LLVM has made machine code: the first VirtualMachine on
        # an Executable JITs the whole module (LLVM's backend over every PrimFunc).  That is
        # compile time too, so it is measured and counted in "to runnable".
        with step(f"loading {label} (first VirtualMachine: LLVM JIT)", res, "load_s"):
            run, vm, args = vm_runner(ex, inputs)
            run()
        res["runnable_s"] = res["compile_s"] + res["load_s"]
        res["rel_err"] = check(run(), want)
        res["ok"] = res["rel_err"] <= TOL
        with step(f"timing {label}"):
            res["run"] = time_ms(run, warmup=2, repeats=30, budget_s=budget_s, stats=True)
        with step(f"profiling {label} (kernels timed one by one)"):
            res["profile"] = profile(vm, args, res["run"]["ms"])
    except Exception as e:  # a failed path is a failed cell, not a failed run
        res.update(ok=False, error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
        log(f"  {label}: FAILED: {res['error']}")
        return res
    r, p = res["run"], res["profile"]
    log(f"  {label:14s} compile {res['compile_s']:.1f} s + JIT {res['load_s']:.1f} s = "
        f"{res['runnable_s']:.1f} s   run {r['ms']:9.3f} ms "
        f"(min {r['min_ms']:.3f}, n={r['n']})   rel err {res['rel_err']:.1e} "
        f"{'OK' if res['ok'] else 'FAILED CHECK'}   [{p['calls']} VM calls; scan kernel "
        f"{p['scan_ms']:.3f} ms, other kernels {p['kernels_ms']:.3f} ms, rest (VM) "
        f"{p['rest_ms']:.3f} ms]")
    del ex, vm, run, args
    return res


def eager(model, inputs, threads, budget_s):
    import torch

    torch.set_num_threads(threads)
    try:
        def run():
            with torch.no_grad():
                return model(*inputs)
        return time_ms(run, warmup=2, repeats=30, budget_s=budget_s, stats=True)
    finally:
        torch.set_num_threads(THREADS)


def bench_one(name, length, budget_s):
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
    for which, _ in PATHS:
        row[which] = tvm_path(which, mod, inputs, want, budget_s)
        gc.collect()
    with step(f"timing PyTorch eager ({THREADS} threads)"):
        row["eager"] = eager(model, inputs, THREADS, budget_s)
    with step("timing PyTorch eager (1 thread)"):
        row["eager_1t"] = eager(model, inputs, 1, budget_s)
    log(f"  PyTorch eager  {row['eager']['ms']:9.3f} ms ({THREADS} threads), "
        f"{row['eager_1t']['ms']:.3f} ms (1 thread)")
    if name == "hf_mamba":
        row["ort"] = onnx_runtime(model, inputs, want, budget_s)
    row["ratios"] = ratios(row)
    log("  " + ", ".join(f"{k} {v:.2f}x" for k, v in row["ratios"].items()))
    return row


def onnx_runtime(model, inputs, want, budget_s):
    """ONNX Runtime (CPU provider, its default threads) on ``torch.onnx.export`` of ``model``
    (the TorchScript exporter: the loop unrolled, as our ONNX tests export), checked against
    PyTorch.  Where the export or the session fails, the cell says why."""
    import io
    import warnings

    import onnxruntime
    import torch

    res = {}
    try:
        with step("exporting to ONNX (torch.onnx.export, TorchScript)", res, "export_s"):
            f = io.BytesIO()
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                torch.onnx.export(model, tuple(inputs), f, dynamo=False, opset_version=17)
        with step("loading ONNX Runtime session", res, "session_s"):
            session = onnxruntime.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
        feed = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
        res["rel_err"] = max(rel_err(o, w) for o, w in zip(session.run(None, feed), want))
        with step("timing ONNX Runtime"):
            res["run"] = time_ms(lambda: session.run(None, feed), warmup=2, repeats=30,
                                 budget_s=budget_s, stats=True)
        log(f"  ONNX Runtime   {res['run']['ms']:9.3f} ms   rel err {res['rel_err']:.1e}")
    except Exception as e:  # pylint: disable=broad-except  # a failed cell, not a failed run
        res["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        log(f"  ONNX Runtime: FAILED: {res['error']}")
    return res


def ratios(row):
    w, wo = row.get("with", {}), row.get("without", {})
    out = {}
    if "runnable_s" in w and "runnable_s" in wo:
        out["compile speedup"] = wo["runnable_s"] / w["runnable_s"]
        out["tvm.compile speedup"] = wo["compile_s"] / w["compile_s"]
    if "run" in w and "run" in wo:
        out["run speedup"] = wo["run"]["ms"] / w["run"]["ms"]
    if "run" in w and "run" in row.get("ort", {}):
        out["vs onnxruntime"] = row["ort"]["run"]["ms"] / w["run"]["ms"]
    if "run" in w:
        out["vs eager"] = row["eager"]["ms"] / w["run"]["ms"]
        out["vs eager 1t"] = row["eager_1t"]["ms"] / w["run"]["ms"]
    return out


def _machine():
    import torch
    import tvm

    from scanweaver_tvm import api

    info = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "numpy": np.__version__,
            "torch": torch.__version__, "tvm": tvm.__version__,
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


def _write(out_dir, result):
    return outputs.write(out_dir, "models", result, report(result))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"L in {QUICK_LENGTHS}: a smoke run")
    p.add_argument("--lengths", type=int, nargs="+", help=f"sequence lengths (default {LENGTHS})")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out"))
    p.add_argument("--budget", type=float, default=5.0, help="seconds of timing per method")
    args = p.parse_args(argv)
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else LENGTHS)
    budget = 1.0 if args.quick else args.budget

    import torch

    torch.set_num_threads(THREADS)
    result = {"machine": _machine(), "tol": TOL, "lengths": list(lengths), "rows": [], "notes": []}
    log(f"whole-model benchmark: models {args.models}, L {list(lengths)}, "
        f"load average {result['machine']['loadavg_1min_start']:.1f}")
    loads = [result["machine"]["loadavg_1min_start"]]
    for length in lengths:
        for name in args.models:
            row = bench_one(name, length, budget)
            row["loadavg_1min"] = os.getloadavg()[0]
            loads.append(row["loadavg_1min"])
            result["rows"].append(row)
            gc.collect()
            result["seconds"] = time.perf_counter() - _T0
            _write(args.out, result)                       # partial results survive a crash

    notes = []
    failed = [f"{r['model']} L={r['L']} {label}" for r in result["rows"] for which, label in PATHS
              if not r.get(which, {}).get("ok", False)]
    failed += [f"{r['model']} L={r['L']}: {r['error']}" for r in result["rows"] if "error" in r]
    if failed:
        notes.append("FAILED (check above tolerance or error): " + "; ".join(failed))
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
