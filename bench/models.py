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
MODELS = ("mamba", "ema", "hf_mamba", "mamba2", "rwkv", "xlstm")
DEFAULT_MODELS = ("mamba", "ema", "hf_mamba")
MODEL_LENGTHS = {"rwkv": (64, 256)}        # its unrolled import grows fast with L
PATHS = (("with", "TVM + pass"), ("without", "TVM, no pass"))
# the peers timed with the TVM paths: key in the row, label, whether it is a "best peer"
PEERS = (("eager", f"PyTorch eager ({THREADS} threads)", True), ("eager_1t", "PyTorch eager (1 thread)", False),
         ("openvino", "OpenVINO (CPU, f32)", True), ("ort", "ONNX Runtime", False))

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
    if name == "mamba2":
        return hf_mamba2(length)
    if name == "rwkv":
        return hf_rwkv(length)
    if name == "xlstm":
        return hf_xlstm(length)
    raise ValueError(name)


def logits_module(lm, last=False):
    """``lm(input_ids).logits`` as a module (what users time, and what peers convert); with
    ``last``, the last position's only (a first token)."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids):
            logits = self.lm(input_ids, use_cache=False).logits
            return logits[:, -1] if last else logits

    return Logits().eval()


def _ids(vocab, batch, length):
    import torch

    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(1))


def hf_mamba2(length, layers=2, batch=1):
    """transformers' ``Mamba2ForCausalLM`` at the real width of the 130m model (hidden 768,
    24 heads of head_dim 64, state 128, one group, chunk 256, vocabulary 50280), random weights."""
    import torch
    from transformers import Mamba2Config, Mamba2ForCausalLM

    torch.manual_seed(0)
    cfg = Mamba2Config(hidden_size=768, num_heads=24, head_dim=64, expand=2, state_size=128,
                       n_groups=1, chunk_size=256, num_hidden_layers=layers, vocab_size=50280)
    return logits_module(Mamba2ForCausalLM(cfg).eval()), [_ids(cfg.vocab_size, batch, length)]


def hf_rwkv(length, layers=2, batch=1):
    """transformers' ``RwkvForCausalLM`` at the real width of RWKV-4 169m (hidden 768,
    vocabulary 50280), random weights; its CPU path is the per-step WKV loop."""
    import torch
    from transformers import RwkvConfig, RwkvForCausalLM

    torch.manual_seed(0)
    cfg = RwkvConfig(hidden_size=768, num_hidden_layers=layers, vocab_size=50280,
                     context_length=max(1024, length))
    return logits_module(RwkvForCausalLM(cfg).eval()), [_ids(cfg.vocab_size, batch, length)]


def hf_xlstm(length, layers=2, batch=1):
    """transformers' ``xLSTMForCausalLM`` at hidden 768 (4 mLSTM heads of qk 96 / v 192, chunk
    64, vocabulary 50304), random weights: its inference path runs the chunkwise kernel on the
    whole chunks and the recurrent one on the rest."""
    import torch
    from transformers import xLSTMConfig, xLSTMForCausalLM

    torch.manual_seed(0)
    cfg = xLSTMConfig(hidden_size=768, num_heads=4, num_hidden_layers=layers, chunk_size=64,
                      vocab_size=50304)
    return logits_module(xLSTMForCausalLM(cfg).eval()), [_ids(cfg.vocab_size, batch, length)]


def hf_mamba(length, layers=2, batch=1):
    """transformers' ``MambaForCausalLM`` at the real width (d_model 768, d_inner 1536, N 16;
    its default vocabulary), random weights, returning the logits as users time them."""
    import torch
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    cfg = MambaConfig(hidden_size=768, state_size=16, num_hidden_layers=layers, expand=2)
    return logits_module(MambaForCausalLM(cfg).eval()), [_ids(cfg.vocab_size, batch, length)]


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


ROUND_S = 0.02       # a round's batch of calls of one path lasts at least this long
PAUSE_S = 0.005      # between two paths: the last one's spinning worker threads go idle


def interleaved(runs, budget_s, max_rounds=30):
    """Time the callables ``runs`` (label -> fn) round-robin: each round times every path once
    (a batch of calls lasting >= ``ROUND_S``, sized from its warm-up call), until every path
    has spent ``budget_s`` or ``max_rounds`` rounds have run; at least 3 rounds each, except
    that a path whose one call exceeds ``budget_s`` stops after its warm-up call, which is then
    its time.  A busy spell of the machine (another process on a core) then hits all paths
    alike.  Between two paths a ``PAUSE_S`` sleep lets the previous runtime's spinning worker
    threads (OpenMP, TBB, TVM's pool) go idle, and a batch amortizes the wake-up of its own.
    Returns label -> ``{"ms": median, "min_ms", "n": rounds, "number": calls per round}``."""
    number, spent, times = {}, dict.fromkeys(runs, 0.0), {k: [] for k in runs}
    for label, fn in runs.items():           # warm-up, and the size of a round's batch
        time.sleep(PAUSE_S)
        t0 = time.perf_counter()
        fn()
        one = time.perf_counter() - t0
        number[label] = max(1, min(1000, int(ROUND_S / max(one, 1e-7))))
        if one > budget_s:                   # (too slow to repeat: that call is its time)
            times[label].append(1e3 * one)
            spent[label] = float("inf")
    for _ in range(max_rounds):
        live = [k for k in runs if spent[k] < budget_s or (len(times[k]) < 3 and spent[k] < float("inf"))]
        if not live:
            break
        for label in live:
            fn, n = runs[label], number[label]
            time.sleep(PAUSE_S)
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            dt = time.perf_counter() - t0
            spent[label] += dt
            times[label].append(1e3 * dt / n)
    return {k: {"ms": statistics.median(v), "min_ms": min(v), "n": len(v), "number": number[k]}
            for k, v in times.items()}


def tvm_path(which, mod, inputs, want):
    """Compile ``mod`` with (``which == "with"``) or without the pass and check it; returns
    ``(res, (run, vm, args))``, the runner None when the path failed."""
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
            runner = vm_runner(ex, inputs)
            runner[0]()
        res["runnable_s"] = res["compile_s"] + res["load_s"]
        res["rel_err"] = check(runner[0](), want)
        res["ok"] = res["rel_err"] <= TOL
    except Exception as e:  # a failed path is a failed cell, not a failed run
        res.update(ok=False, error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
        log(f"  {label}: FAILED: {res['error']}")
        return res, None
    log(f"  {label:14s} compile {res['compile_s']:.1f} s + JIT {res['load_s']:.1f} s = "
        f"{res['runnable_s']:.1f} s   rel err {res['rel_err']:.1e} {'OK' if res['ok'] else 'FAILED CHECK'}")
    return res, runner


def _log_profile(label, res):
    r, p = res["run"], res["profile"]
    log(f"  {label:14s} run {r['ms']:9.3f} ms (min {r['min_ms']:.3f}, n={r['n']})   [{p['calls']} VM "
        f"calls; scan kernel {p['scan_ms']:.3f} ms, other kernels {p['kernels_ms']:.3f} ms, "
        f"rest (VM) {p['rest_ms']:.3f} ms]")


def eager_runner(model, inputs, threads):
    import torch

    def run():
        torch.set_num_threads(threads)
        try:
            with torch.no_grad():
                return model(*inputs)
        finally:
            torch.set_num_threads(THREADS)
    return run


def openvino_runner(model, inputs, want, threads=THREADS):
    """OpenVINO on ``ov.convert_model`` of the same PyTorch module, compiled for its CPU plugin
    at f32 (``INFERENCE_PRECISION_HINT``: its default on AVX-512/AMX CPUs is bf16) with
    ``threads`` threads, checked against PyTorch.  Returns ``(res, run)``; where the
    conversion or the compile fails, ``res["error"]`` says why and ``run`` is None."""
    import torch

    res = {}
    try:
        import openvino as ov                      # (pyproject's bench extra)

        res["version"] = ov.__version__
        with step("converting to OpenVINO (ov.convert_model)", res, "convert_s"), torch.no_grad():
            converted = ov.convert_model(model, example_input=tuple(inputs))
        with step("compiling OpenVINO (CPU plugin, f32)", res, "compile_s"):
            compiled = ov.Core().compile_model(converted, "CPU", {
                "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads,
                "PERFORMANCE_HINT": "LATENCY"})
        res["precision"] = str(compiled.get_property("INFERENCE_PRECISION_HINT"))
        res["threads"] = int(compiled.get_property("INFERENCE_NUM_THREADS"))
        request = compiled.create_infer_request()
        feed = [x.numpy() for x in inputs]

        def run():
            request.infer(feed)
            return [request.get_output_tensor(i).data for i in range(len(compiled.outputs))]

        got = run()
        if len(got) != len(want):
            raise AssertionError(f"{len(got)} outputs from OpenVINO, {len(want)} from PyTorch")
        res["rel_err"] = max(rel_err(g, w) for g, w in zip(got, want))
        res["ok"] = res["rel_err"] <= TOL
        log(f"  OpenVINO       convert {res['convert_s']:.1f} s + compile {res['compile_s']:.1f} s   "
            f"rel err {res['rel_err']:.1e} ({res['precision']}, {res['threads']} threads)")
        return res, run
    except Exception as e:  # pylint: disable=broad-except  # a failed cell, not a failed run
        res["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        log(f"  OpenVINO: FAILED: {res['error']}")
        return res, None


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


def onnx_runtime(model, inputs, want):
    """ONNX Runtime (CPU provider, its default threads) on ``torch.onnx.export`` of ``model``
    (the TorchScript exporter: the loop unrolled, as our ONNX tests export), checked against
    PyTorch.  Returns ``(res, run)``; where the export or the session fails, the cell says why."""
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
        res["ok"] = res["rel_err"] <= TOL
        log(f"  ONNX Runtime   rel err {res['rel_err']:.1e}")
        return res, (lambda: session.run(None, feed))
    except Exception as e:  # pylint: disable=broad-except  # a failed cell, not a failed run
        res["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        log(f"  ONNX Runtime: FAILED: {res['error']}")
        return res, None


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
