"""Timing of ``bench.models``: the progress log and its timed steps, the interleaved round-robin
timing of every path of a row, and the per-kernel profile of a TVM path, apart from what is
timed so that the same clock and rules serve every path (and ``bench.tune_model``)."""
import contextlib
import os
import statistics
import sys
import tempfile
import time

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


def _log_profile(label, res):
    r, p = res["run"], res["profile"]
    log(f"  {label:14s} run {r['ms']:9.3f} ms (min {r['min_ms']:.3f}, n={r['n']})   [{p['calls']} VM "
        f"calls; scan kernel {p['scan_ms']:.3f} ms, other kernels {p['kernels_ms']:.3f} ms, "
        f"rest (VM) {p['rest_ms']:.3f} ms]")
