"""Matrix-state scan on the CPU: our kernel against a PyTorch per-step loop and fused numba
loops, timed in one run.

    python -m bench.matrix [--quick] [--rounds 11] [--out bench/out_matrix]

Shapes: GLA / linear attention (B=1, H=16, L=2048, K=V=64; decay none, scalar, key) and
Mamba-2 (B=1, H=24, L=2048, K=N=128 contracted, V=P=64, scalar decay; B and C, our k and q,
shared by the heads as in Mamba-2 with one group, and also per head).  Methods: the PyTorch
loop as reference implementations write it (float32, eager), numba @njit(fastmath=True) loops
over (b, h, t, k, v) with v innermost, single-threaded and prange over (b, h), and our kernel
(``tir_schedules.build(spec, "llvm")``).  Every method is checked against the float64 oracle
and against ours, then the methods are timed in interleaved rounds (one call of each per
round, after a warm-up, the order rotating), so a busy machine slows them alike; medians
(and minima) in ms.  TVM's idle workers wait passively, as numba's and PyTorch's OpenMP ones do
(``OMP_WAIT_POLICY=PASSIVE``), so no method's spinning threads slow the next one.  Writes
``matrix.json`` and ``matrix.md`` into ``--out``.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")   # before TVM's pool starts

from . import anchors, outputs, rel_err  # noqa: E402
from scanweaver_tvm import reference  # noqa: E402,F401 (sets TVM_NUM_THREADS to the cores)
from scanweaver_core.reference import matrix_scan  # noqa: E402
from scanweaver_core.spec import MatrixScanSpec  # noqa: E402

# (name, B, H, L, K, V, decay, q/k shared by the heads)
SHAPES = [("GLA", 1, 16, 2048, 64, 64, "none", False),
          ("GLA", 1, 16, 2048, 64, 64, "scalar", False),
          ("GLA", 1, 16, 2048, 64, 64, "key", False),
          ("Mamba-2 (B, C shared)", 1, 24, 2048, 128, 64, "scalar", True),
          ("Mamba-2 (B, C per head)", 1, 24, 2048, 128, 64, "scalar", False)]
QUICK = [("GLA", 1, 4, 256, 64, 64, "key", False),
         ("Mamba-2 (B, C shared)", 1, 4, 256, 128, 64, "scalar", True)]
TOL = 1e-4                       # max error relative to the oracle's magnitude (float32 inputs)
OURS, NUMBA1, NUMBAP, TORCH = "ours (TVM)", "numba njit", "numba parallel", "torch loop"


def inputs(b, h, length, key, value, decay, shared, seed=0):
    """float32 operands with a trained-layer-like decay in [0.9, 1) (k scaled to keep S O(1))."""
    rng = np.random.default_rng(seed)
    hq = 1 if shared else h
    x = {"q": rng.standard_normal((b, hq, length, key)),
         "k": rng.standard_normal((b, hq, length, key)) / np.sqrt(key),
         "v": rng.standard_normal((b, h, length, value))}
    if decay != "none":
        x["g"] = rng.uniform(0.9, 1.0, (b, h, length, key if decay == "key" else 1))
    return {n: a.astype(np.float32) for n, a in x.items()}


# ---------------------------------------------------------------- methods
# Each is ``(run, fetch)``: ``run()`` is what is timed, ``fetch()`` returns the last output o.

def torch_loop(x, decay):
    """The per-step loop of reference implementations: outer-product update, mul + sum readout."""
    torch = anchors._torch()
    q, k, v = (torch.from_numpy(x[n]) for n in ("q", "k", "v"))
    g = torch.from_numpy(x["g"]) if decay != "none" else None
    b, h, length, key = v.shape[0], v.shape[1], v.shape[2], k.shape[-1]
    last = []

    def run():
        with torch.no_grad():
            state = torch.zeros(b, h, key, v.shape[-1])
            outs = []
            for t in range(length):
                kv = k[:, :, t, :, None] * v[:, :, t, None, :]
                state = state * g[:, :, t, :, None] + kv if g is not None else state + kv
                outs.append((q[:, :, t, :, None] * state).sum(-2))
            last[:] = [torch.stack(outs, dim=2)]
    return run, lambda: last[0].numpy()


_NUMBA = {}


def _numba_kernel(decay, parallel):
    """One fused loop per (decay, parallel): the decay kind is a compile-time constant (numba
    folds the branches), the state and the output row are local arrays, v is innermost."""
    if (decay, parallel) in _NUMBA:
        return _NUMBA[decay, parallel]
    numba = anchors._numba()
    loop = numba.prange if parallel else range
    kind = {"none": 0, "scalar": 1, "key": 2}[decay]

    @numba.njit(fastmath=True, parallel=parallel, cache=False)
    def scan(q, k, v, g, o):
        nb, nh, length, nv = v.shape
        nk = k.shape[3]
        for bh in loop(nb * nh):
            b, h = bh // nh, bh % nh
            hq = h if q.shape[1] > 1 else 0
            state = np.zeros((nk, nv), np.float32)
            row = np.empty(nv, np.float32)
            for t in range(length):
                row[:] = 0.0
                for i in range(nk):
                    decay_i = np.float32(1.0)
                    if kind == 1:
                        decay_i = g[b, h, t, 0]
                    elif kind == 2:
                        decay_i = g[b, h, t, i]
                    k_i, q_i = k[b, hq, t, i], q[b, hq, t, i]
                    for j in range(nv):
                        s = state[i, j] * decay_i + k_i * v[b, h, t, j]
                        state[i, j] = s
                        row[j] += q_i * s
                for j in range(nv):
                    o[b, h, t, j] = row[j]

    _NUMBA[decay, parallel] = scan
    return scan


def numba_loop(x, decay, parallel):
    kernel = _numba_kernel(decay, parallel)
    g = x.get("g", np.ones((1, 1, 1, 1), np.float32))
    out = np.empty(x["v"].shape, np.float32)

    def run():
        kernel(x["q"], x["k"], x["v"], g, out)
    return run, lambda: out


def ours(x, decay):
    """Our kernel: ``(run, fetch)`` and the compile seconds."""
    import tvm

    import tir_schedules

    spec = MatrixScanSpec.for_arrays(x["q"], x["k"], x["v"], x.get("g"), decay=decay)
    t0 = time.perf_counter()
    mod = tir_schedules.build(spec, "llvm")
    seconds = time.perf_counter() - t0
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(x[n], dev) for n in spec.operand_names()]
    args.append(tvm.runtime.tensor(np.empty(spec.out_shape, np.float32), dev))
    func = mod["scanweaver_scan"]
    return (lambda: func(*args), lambda: args[-1].numpy()), seconds


# ---------------------------------------------------------------- one row

def row(shape, rounds, bandwidth):
    name, b, h, length, key, value, decay, shared = shape
    print(f"{name} B={b} H={h} L={length} K={key} V={value} decay={decay}", flush=True)
    x = inputs(b, h, length, key, value, decay, shared)
    nbytes = sum(a.nbytes for a in x.values()) + x["v"].nbytes     # read the inputs, write o
    f64 = {n: a.astype(np.float64) for n, a in x.items()}
    want = matrix_scan(f64["q"], f64["k"], f64["v"], f64.get("g"), decay)
    our_pair, compile_s = ours(x, decay)
    pairs = {OURS: our_pair, NUMBA1: numba_loop(x, decay, False),
             NUMBAP: numba_loop(x, decay, True), TORCH: torch_loop(x, decay)}
    our_pair[0]()
    mine = our_pair[1]().copy()
    methods, results, ok = {m: p[0] for m, p in pairs.items()}, {}, {}
    for m, (run, fetch) in pairs.items():   # the check doubles as the warm-up (numba compiles)
        run()
        got = fetch()
        err, vs_ours = rel_err(got, want), rel_err(got, mine)
        ok[m] = err <= TOL
        results[m] = {"rel_err": err, "rel_diff_vs_ours": vs_ours, "times_ms": []}
        print(f"    {m:16s} rel err {err:.1e} (vs ours {vs_ours:.1e})"
              + ("" if ok[m] else f"  FAILED (> {TOL:.0e})"), flush=True)
    names = [m for m in methods if ok[m]]
    for i in range(rounds):
        for m in names[i % len(names):] + names[:i % len(names)]:
            t0 = time.perf_counter()
            methods[m]()
            results[m]["times_ms"].append(1e3 * (time.perf_counter() - t0))
    for m, r in results.items():
        if r["times_ms"]:
            r.update(ms=statistics.median(r["times_ms"]), min_ms=min(r["times_ms"]))
            print(f"    {m:16s} {r['ms']:9.2f} ms  (min {r['min_ms']:.2f}, n={len(r['times_ms'])})",
                  flush=True)
        else:
            r.update(ms=None, min_ms=None)
    ratios = {}
    if results[OURS]["ms"]:
        for m in (NUMBAP, NUMBA1, TORCH):
            if results[m]["ms"]:
                ratios[f"{m} / ours"] = results[m]["ms"] / results[OURS]["ms"]
                # the same round's calls saw about the same machine: median of per-round ratios
                paired = [t / o for t, o in zip(results[m]["times_ms"], results[OURS]["times_ms"])]
                ratios[f"{m} / ours (paired)"] = statistics.median(paired)
    print("    " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items() if "paired" not in k),
          flush=True)
    return {"name": name, "shape": {"B": b, "H": h, "L": length, "K": key, "V": value},
            "decay": decay, "qk_shared_by_heads": shared, "compile_s": compile_s,
            "bytes": nbytes, "floor_ms": anchors.floor_ms(nbytes, bandwidth),
            "methods": results, "ratios": ratios}


# ---------------------------------------------------------------- report

def report(result):
    m = result["machine"]
    lines = ["# Matrix-state scan (CPU)", "",
             f"{m['cpu']}, {m['cores']} cores; numba/torch/TVM threads: {anchors.THREADS}/"
             f"{anchors.THREADS}/{os.environ.get('TVM_NUM_THREADS')}; "
             f"1-min load average {m['loadavg_1min_start']:.1f} at start, "
             f"{m['loadavg_1min_end']:.1f} at end; TVM_THREAD_POOL_SPIN_COUNT="
             f"{os.environ.get('TVM_THREAD_POOL_SPIN_COUNT')}, OMP_WAIT_POLICY="
             f"{os.environ.get('OMP_WAIT_POLICY')}.  "
             f"Median of {result['rounds']} interleaved rounds, ms (min in parentheses); "
             "speedup = their median / ours (in parentheses: the median of the per-round "
             "ratios).  Memory floor: the bytes that must move (inputs read, o written) at "
             f"{result['bandwidth'] / 1e9:.1f} GB/s, the best copy bandwidth of "
             f"{anchors.THREADS} threads measured first.", "",
             "| shape | decay | memory floor | ours (TVM) | numba parallel | numba njit | torch loop "
             "| vs numba parallel | vs numba njit | vs torch loop |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        s = r["shape"]
        cells = [f"{r['name']} B={s['B']} H={s['H']} L={s['L']} K={s['K']} V={s['V']}", r["decay"],
                 f"{r['floor_ms']:.2f}"]
        for name in (OURS, NUMBAP, NUMBA1, TORCH):
            x = r["methods"][name]
            cells.append("fail" if x["ms"] is None else f"{x['ms']:.2f} ({x['min_ms']:.2f})")
        for name in (NUMBAP, NUMBA1, TORCH):
            v, p = r["ratios"].get(f"{name} / ours"), r["ratios"].get(f"{name} / ours (paired)")
            cells.append("—" if v is None else f"{v:.1f}x ({p:.1f}x)")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Max error relative to the float64 oracle: "
              + "; ".join(f"{r['name']} {r['decay']}: " + ", ".join(
                  f"{k} {v['rel_err']:.0e}" for k, v in r["methods"].items())
                  for r in result["rows"]), ""]
    return "\n".join(lines)


def main(argv=None):
    from .scan import _machine

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small shapes: a smoke run")
    p.add_argument("--rounds", type=int, default=11, help="timed calls of each method")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out_matrix"))
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    result = {"machine": _machine(), "rounds": args.rounds, "tol": TOL, "rows": []}
    result["bandwidth"] = anchors.copy_bandwidth(nbytes=64 << 20)["best"]
    print(f"copy bandwidth {result['bandwidth'] / 1e9:.1f} GB/s", flush=True)
    for shape in QUICK if args.quick else SHAPES:
        result["rows"].append(row(shape, args.rounds, result["bandwidth"]))
    result["machine"]["loadavg_1min_end"] = os.getloadavg()[0]
    result["seconds"] = time.perf_counter() - t0
    md = outputs.write(args.out, "matrix", result, report(result))
    print("\n" + md)
    print(f"wrote {args.out}/matrix.json and matrix.md in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
