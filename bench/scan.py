"""Side-by-side CPU benchmark of our scans against the anchors, in one run.

    python -m bench.scan [--quick] [--only plain|selective|sweep] [--out bench/out]

Plain affine scan at (1, 1536, 1024), an L sweep 128..65536, and the selective scan at
(1, 1536, 1024, N=16), the latter also by the matrix-state kernel (Mamba-1 as an instance of
``MatrixScanSpec``, same arrays).  Every method is checked once against the float64 reference, then
timed (median of repeats, ms).  Writes ``scan.json`` and ``scan.md`` into ``--out``.
Our TVM realizations come in through ``ours()``; their rows are skipped with a note while
``tir_schedules.build`` does not exist.
"""
import argparse
import functools
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import namedtuple

import numpy as np

from . import anchors, outputs, rel_err, time_ms
from scanweaver_tvm import reference

PLAIN_SHAPE = (1, 1536, 1024)
SELECTIVE_SHAPE = (1, 1536, 1024, 16)                  # (batch, dim, L, N)
SWEEP = [(1536, 128 << k) for k in range(6)] + [(256, 8192), (256, 16384), (128, 32768), (64, 65536)]
QUICK = {"plain": (1, 64, 256), "selective": (1, 64, 256, 16),
         "sweep": [(64, 128), (64, 1024), (16, 4096)]}
TOL = 1e-4                                             # max rel. error vs the float64 oracle
SELECTIVE_ARGS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
OURS = "ours (TVM)"
OURS_MLIR = "ours (MLIR CPU route)"
OURS_MATRIX = "ours (as matrix scan)"     # the matrix-state kernel on the same bytes

# run() -> output; timer() -> {"ms", "min_ms", "n"}, or None to time run() with time_ms.
Method = namedtuple("Method", "run timer", defaults=(None,))


def ours(spec_kind, arrays, realization="tir", schedule=None):
    """Our realization of ``spec_kind`` ("plain" or "selective") as a ``Method``, or a string
    saying why it is unavailable.  Plain ``arrays`` is ``(a, b)``, selective a dict.
    ``realization``: "tir" (TensorIR schedule) or "mlir" (the MLIR bridge's CPU route, linked
    into a TVM module the same way ``sw.compile(..., realization="mlir")`` does); ``schedule``
    names a TIR realization (``"matrix_cpu"``: the selective scan as its matrix-scan
    instance, ``SelectiveScanSpec.as_matrix``, on the same arrays)."""
    try:
        import tir_schedules
        build = tir_schedules.build
        if realization == "mlir":
            from mlir_bridge.tvm_wrap import build_cpu as build
    except (ImportError, AttributeError) as e:
        return f"the {realization} realization is not available ({e})"
    import tvm
    from scanweaver_core.spec import AffineScanSpec, SelectiveScanSpec

    if spec_kind == "plain":
        a, b = arrays
        spec = AffineScanSpec.create(b.shape)
        host = [a, b, np.empty_like(b)]                 # (a, b, states_out)
    else:
        spec = SelectiveScanSpec.for_arrays(*(arrays[k] for k in SELECTIVE_ARGS[:5]),
                                            D=arrays["D"], z=arrays["z"],
                                            delta_bias=arrays["delta_bias"], delta_softplus=True)
        host = [arrays[k] for k in SELECTIVE_ARGS] + [np.empty_like(arrays["u"])]
    try:
        mod = build(spec, target="llvm", **({"schedule": schedule} if schedule else {}))
    except NotImplementedError as e:
        return f"tir_schedules.build has no {spec_kind} CPU realization ({e})"
    if not hasattr(mod, "time_evaluator"):              # a tvm.compile Executable
        mod = mod.jit()
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(x, dev) for x in host]
    func = mod["scanweaver_scan"]
    evaluator = mod.time_evaluator("scanweaver_scan", dev, number=1, repeat=7, min_repeat_ms=20)

    def run():
        func(*args)
        return args[-1].numpy()

    def timer():
        res = [1e3 * t for t in evaluator(*args).results]
        return {"ms": statistics.median(res), "min_ms": min(res), "n": len(res)}
    return Method(run, timer)


def measure(name, method, ref, budget_s):
    """Check once against ``ref``, then time: ``{"ms", "min_ms", "n", "rel_err"[, "error"]}``."""
    err = None
    try:
        err = rel_err(method.run(), ref)
        if not err <= TOL:
            raise AssertionError(f"relative error {err:.2e} exceeds {TOL:.0e}")
        t = method.timer() if method.timer else time_ms(method.run, budget_s=budget_s, stats=True)
    except Exception as e:  # one broken method must not sink the whole run
        print(f"    {name:22s} FAILED: {type(e).__name__}: {e}", flush=True)
        return {"ms": None, "rel_err": err, "error": f"{type(e).__name__}: {e}"}
    print(f"    {name:22s} {t['ms']:10.3f} ms   (min {t['min_ms']:.3f}, n={t['n']})"
          f"   rel err {err:.1e}", flush=True)
    return {**t, "rel_err": err}


def _row(shape, nbytes, bandwidth, methods, ref, notes, budget_s):
    print(f"  shape {shape}", flush=True)
    # The floor copies the same number of bytes as the scan moves, so a working set that stays
    # in the last-level cache between repeats gets the cache's bandwidth, as the scans do;
    # ``bandwidth`` (a 256 MB copy: DRAM) is kept only as the lower of the two.
    same_size = anchors.copy_bandwidth(nbytes=max(nbytes // 2, 1 << 20))["best"]
    floor = anchors.floor_ms(nbytes, max(bandwidth, same_size))
    print(f"    {'memory floor':22s} {floor:10.3f} ms   ({nbytes / 1e6:.1f} MB moved, "
          f"{max(bandwidth, same_size) / 1e9:.1f} GB/s)", flush=True)
    results = {}
    for name, build in methods.items():
        try:
            method = build()
        except Exception as e:  # a failed build is a failed cell, not a failed run
            print(f"    {name:22s} FAILED to build: {type(e).__name__}: {e}", flush=True)
            results[name] = {"ms": None, "rel_err": None, "error": f"{type(e).__name__}: {e}"}
            continue
        if isinstance(method, str):
            notes.add(f"{name}: skipped, {method}")
            print(f"    {name:22s} skipped: {method}", flush=True)
            continue
        results[name] = measure(name, method, ref, budget_s)
    return {"shape": list(shape), "bytes": nbytes, "floor_ms": floor, "methods": results}


def plain_row(shape, bandwidth, notes, budget_s):
    a, b = anchors.plain_inputs(shape)
    ref = reference.affine_scan(a, b)
    methods = {name: (lambda f=f: Method(f(a, b))) for name, f in anchors.PLAIN.items()}
    methods[OURS] = lambda: ours("plain", (a, b))
    methods[OURS_MLIR] = lambda: ours("plain", (a, b), "mlir")
    row = _row(shape, anchors.plain_bytes(a, b), bandwidth, methods, ref, notes, budget_s)
    return {**row, "kernel": kernel_fingerprint(shape)}


def kernel_fingerprint(shape):
    """The first 12 hex digits of the SHA-1 of our plain kernel's TIR for ``shape`` on this host:
    two tables whose times differ but whose fingerprints agree measured the same code, so the
    machine moved, not the kernel."""
    import hashlib

    import tir_schedules
    from scanweaver_core.spec import AffineScanSpec

    text = tir_schedules.realize(AffineScanSpec.create(shape), target="llvm").script()
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def selective_row(shape, bandwidth, notes, budget_s):
    x = anchors.selective_inputs(*shape)
    ref = reference.selective_scan(*(x[k] for k in SELECTIVE_ARGS[:5]), D=x["D"], z=x["z"],
                                   delta_bias=x["delta_bias"], delta_softplus=True)
    methods = {name: (lambda f=f: Method(f(x))) for name, f in anchors.SELECTIVE.items()}
    methods[OURS] = functools.cache(lambda: ours("selective", x))
    methods[OURS_MLIR] = lambda: ours("selective", x, "mlir")
    methods[OURS_MATRIX] = functools.cache(lambda: ours("selective", x, schedule="matrix_cpu"))
    row = _row(shape, anchors.selective_bytes(x), bandwidth, methods, ref, notes, budget_s)
    if all(row["methods"].get(n, {}).get("ms") is not None for n in (OURS, OURS_MATRIX)):
        row["paired"] = paired_ratio(methods[OURS](), methods[OURS_MATRIX]())  # built: cached
    return row


def paired_ratio(mine, other, rounds=9):
    """``other``'s time over ``mine``'s, both timed in turn in each of ``rounds`` rounds (a
    busy machine slows both of a round alike): ``{"median", "min", "max", "rounds"}``."""
    ratios = sorted(other.timer()["ms"] / mine.timer()["ms"] for _ in range(rounds))
    return {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1],
            "rounds": rounds}


# ---------------------------------------------------------------- report

def _ratios(row):
    """``ours`` against the floor (x floor, >= 1 ideally ~1) and speedup over each anchor."""
    ms = {k: v["ms"] for k, v in row["methods"].items() if v["ms"] is not None}
    if OURS not in ms:
        return {}
    mine = ms.pop(OURS)
    out = {"vs memory floor": mine / row["floor_ms"]}
    if OURS_MLIR in ms:
        out["MLIR route / TIR"] = ms.pop(OURS_MLIR) / mine
    if OURS_MATRIX in ms:
        out["as matrix scan / TIR"] = ms.pop(OURS_MATRIX) / mine
    out.update({f"speedup vs {k}": v / mine for k, v in ms.items()})
    return out


def _table(title, rows, shape_label):
    names = list(dict.fromkeys(k for r in rows for k in r["methods"]))
    ratio_names = list(dict.fromkeys(k for r in rows for k in r["ratios"]))
    head = [shape_label, "memory floor"] + names + ratio_names
    lines = [f"## {title}", "", "times in ms (median of repeats); ratios: ours / floor, anchor / ours", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = ["x".join(map(str, r["shape"])), f"{r['floor_ms']:.3f}"]
        for n in names:
            m = r["methods"].get(n)
            cells.append("—" if m is None else ("fail" if m["ms"] is None else f"{m['ms']:.3f}"))
        cells += [f"{r['ratios'][k]:.2f}x" if k in r["ratios"] else "—" for k in ratio_names]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def report(result):
    bw = result["bandwidth"]
    lines = ["# Scan benchmark (CPU)", "",
             f"{result['machine']['cpu']} ({', '.join(result['machine']['features']) or 'no AVX'}), "
             f"{result['machine']['cores']} cores, code at {result['machine']['revision']}, "
             f"{anchors.THREADS} threads, OMP_WAIT_POLICY={result['machine']['OMP_WAIT_POLICY']}.  "
             "Copy bandwidth (read+write): "
             + ", ".join(f"{k} thread(s) {v / 1e9:.1f} GB/s" for k, v in bw.items() if k != "best")
             + f"; floor uses {bw['best'] / 1e9:.1f} GB/s.", ""]
    sections = [("plain", "Plain affine scan", "B x D x L"),
                ("sweep", "Plain affine scan, L sweep", "B x D x L"),
                ("selective", "Selective scan (delta_softplus, D, z, delta_bias)", "B x D x L x N")]
    for key, title, label in sections:
        if result.get(key):
            lines += _table(title, result[key], label)
            kernels = [f"{'x'.join(map(str, r['shape']))} `{r['kernel']}`" for r in result[key] if "kernel" in r]
            if kernels:
                lines += ["Kernel TIR fingerprints (SHA-1 of the scheduled TIR; equal: same code): "
                          + ", ".join(kernels) + ".", ""]
    for row in result.get("selective", []):
        p = row.get("paired")
        if p:
            lines += [f"Mamba-1 as a matrix scan (`{OURS_MATRIX}`) over the selective kernel "
                      f"(`{OURS}`), timed in turn in {p['rounds']} rounds: median "
                      f"{p['median']:.2f}x the time (rounds {p['min']:.2f}-{p['max']:.2f}x).", ""]
    if result["notes"]:
        lines += ["Notes:", ""] + [f"- {n}" for n in result["notes"]] + [""]
    return "\n".join(lines)


def _machine():
    info = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "loadavg_1min_start": os.getloadavg()[0],
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
            "date": datetime.date.today().isoformat()}
    info["features"], info["revision"] = [], "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.readlines()
        info["cpu"] = next(l.split(":", 1)[1].strip() for l in lines if l.startswith("model name"))
        flags = next(l.split(":", 1)[1].split() for l in lines if l.startswith("flags"))
        info["features"] = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8") if f in flags]
    except (OSError, StopIteration):
        pass
    try:
        info["revision"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                          cwd=os.path.dirname(__file__), check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    for mod in ("numpy", "torch", "numba", "jax", "tvm"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:
            pass
    return info


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small shapes: a smoke run")
    p.add_argument("--only", choices=("plain", "selective", "sweep"), action="append",
                   help="run only this part (repeatable)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out"))
    p.add_argument("--budget", type=float, default=5.0, help="seconds of timing per method")
    args = p.parse_args(argv)
    parts = args.only or ["plain", "sweep", "selective"]
    budget = 0.5 if args.quick else args.budget
    t0 = time.perf_counter()

    machine = _machine()
    print("copy bandwidth ...", flush=True)
    bw = anchors.copy_bandwidth(nbytes=(64 << 20) if args.quick else (256 << 20))
    print("  " + ", ".join(f"{k}: {v / 1e9:.1f} GB/s" for k, v in bw.items()), flush=True)
    notes, done = set(), {}
    result = {"machine": machine, "bandwidth": bw, "tol": TOL}

    def plain(shape):  # the headline shape is also a sweep point: measure it once
        if shape not in done:
            done[shape] = plain_row(shape, bw["best"], notes, budget)
        return done[shape]

    if "plain" in parts:
        print("plain affine scan", flush=True)
        result["plain"] = [plain(QUICK["plain"] if args.quick else PLAIN_SHAPE)]
    if "sweep" in parts:
        print("plain affine scan, L sweep", flush=True)
        result["sweep"] = [plain((1, d, l)) for d, l in (QUICK["sweep"] if args.quick else SWEEP)]
    if "selective" in parts:
        print("selective scan", flush=True)
        result["selective"] = [selective_row(QUICK["selective"] if args.quick else SELECTIVE_SHAPE,
                                             bw["best"], notes, budget)]
    for key in ("plain", "sweep", "selective"):
        for row in result.get(key, []):
            row["ratios"] = _ratios(row)
    load = os.getloadavg()[0]
    result["machine"]["loadavg_1min_end"] = load
    if max(load, result["machine"]["loadavg_1min_start"]) > 0.5:
        notes.add(f"the machine was busy (1-min load average {result['machine']['loadavg_1min_start']:.1f}"
                  f" at start, {load:.1f} at end): parallel rows suffer most")
    result["notes"] = sorted(notes)
    result["seconds"] = time.perf_counter() - t0

    md = outputs.write(args.out, "scan", result, report(result))
    print("\n" + md)
    print(f"wrote {args.out}/scan.json and scan.md in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
