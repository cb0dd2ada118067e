"""Delta-rule scan on the CPU (Gated DeltaNet, ``DeltaScanSpec``): our kernel against fused
numba loops of the recurrent form and PyTorch's loop (transformers' own
``torch_recurrent_gated_delta_rule``), timed in one run.

    python -m bench.delta [--quick] [--rounds 7] [--out bench/out_delta]

Shape: the issue's (B=1, H=16, L=4096, K=V=128), a scalar log-decay per head, q and k
normalized (as Qwen3-Next feeds them), q scaled by K^-1/2.  numba: @njit(fastmath=True) over
(b, h, t, k, v) with v innermost, two passes over the state a step (decay + read, update +
readout: the same work as ours), single-threaded and prange over (b, h).  Every method is
checked against the float64 oracle, then timed in interleaved rounds (the order rotating);
medians (and minima) in ms.  Writes ``delta.json`` and ``delta.md`` into ``--out``.
"""
import argparse
import inspect
import os
import statistics
import sys
import time

import numpy as np

os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")   # before TVM's pool starts

from . import anchors, outputs, rel_err  # noqa: E402
from scanweaver_tvm import reference  # noqa: E402,F401 (sets TVM_NUM_THREADS to the cores)
from scanweaver_core.reference import delta_scan  # noqa: E402
from scanweaver_core.spec import DeltaScanSpec  # noqa: E402

SHAPES = [(1, 16, 4096, 128, 128), (1, 16, 512, 128, 128)]
QUICK = [(1, 4, 256, 64, 64)]
TOL = 1e-3
OURS, NUMBA1, NUMBAP, TORCH = "ours (TVM)", "numba njit", "numba parallel", "transformers loop"


def inputs(b, h, length, key, value, seed=0):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((b, h, length, key))
    q = rng.standard_normal((b, h, length, key))
    x = {"q": q / np.linalg.norm(q, axis=-1, keepdims=True) * key ** -0.5,
         "k": k / np.linalg.norm(k, axis=-1, keepdims=True),
         "v": rng.standard_normal((b, h, length, value)), "beta": rng.uniform(0.05, 1.0, (b, h, length)),
         "g": -rng.uniform(0.0, 0.2, (b, h, length))}
    return {n: np.ascontiguousarray(a, dtype=np.float32) for n, a in x.items()}


_NUMBA = {}


def _numba_kernel(parallel):
    if parallel in _NUMBA:
        return _NUMBA[parallel]
    numba = anchors._numba()
    loop = numba.prange if parallel else range

    @numba.njit(fastmath=True, parallel=parallel, cache=False)
    def scan(q, k, v, beta, g, o):
        nb, nh, length, nv = v.shape
        nk = k.shape[3]
        for bh in loop(nb * nh):
            b, h = bh // nh, bh % nh
            state = np.zeros((nk, nv), np.float32)
            u = np.empty(nv, np.float32)
            row = np.empty(nv, np.float32)
            for t in range(length):
                d = np.exp(g[b, h, t])
                u[:] = 0.0
                for i in range(nk):
                    k_i = k[b, h, t, i]
                    for j in range(nv):
                        s = state[i, j] * d
                        state[i, j] = s
                        u[j] += k_i * s
                for j in range(nv):
                    u[j] = beta[b, h, t] * (v[b, h, t, j] - u[j])
                row[:] = 0.0
                for i in range(nk):
                    k_i, q_i = k[b, h, t, i], q[b, h, t, i]
                    for j in range(nv):
                        s = state[i, j] + k_i * u[j]
                        state[i, j] = s
                        row[j] += q_i * s
                for j in range(nv):
                    o[b, h, t, j] = row[j]

    _NUMBA[parallel] = scan
    return scan


def numba_loop(x, parallel):
    kernel = _numba_kernel(parallel)
    out = np.empty(x["v"].shape, np.float32)
    return (lambda: kernel(x["q"], x["k"], x["v"], x["beta"], x["g"], out)), (lambda: out)


def torch_loop(x):
    """transformers' own loop (its layout: (B, L, H, .)), q already scaled: it scales by
    K^-1/2 itself, so it gets q * K^1/2."""
    torch = anchors._torch()
    from transformers.models.qwen3_next import modeling_qwen3_next
    fn = inspect.unwrap(modeling_qwen3_next.torch_recurrent_gated_delta_rule)
    key = x["q"].shape[-1]
    t = {n: torch.from_numpy(a).transpose(1, 2).contiguous() for n, a in x.items()}
    t["q"] = t["q"] * key ** 0.5
    box = {}

    def run():
        with torch.no_grad():
            box["o"] = fn(t["q"], t["k"], t["v"], t["g"], t["beta"])[0]
    return run, lambda: box["o"].transpose(1, 2).numpy()


def ours(x):
    import tvm

    import tir_schedules

    spec = DeltaScanSpec.for_arrays(x["q"], x["k"], x["v"], x["beta"], x["g"])
    t0 = time.perf_counter()
    mod = tir_schedules.build(spec, "llvm")
    seconds = time.perf_counter() - t0
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(x[n], dev) for n in spec.operand_names()]
    args.append(tvm.runtime.tensor(np.empty(spec.output_shapes()["o"], np.float32), dev))
    func = mod["scanweaver_scan"]
    return (lambda: func(*args), lambda: args[-1].numpy()), seconds


def row(shape, rounds):
    b, h, length, key, value = shape
    print(f"B={b} H={h} L={length} K={key} V={value}", flush=True)
    x = inputs(*shape)
    f64 = {n: a.astype(np.float64) for n, a in x.items()}
    want = delta_scan(f64["q"], f64["k"], f64["v"], f64["beta"], f64["g"])
    our_pair, compile_s = ours(x)
    pairs = {OURS: our_pair, NUMBAP: numba_loop(x, True), NUMBA1: numba_loop(x, False), TORCH: torch_loop(x)}
    results, ok = {}, {}
    for m, (run, fetch) in pairs.items():      # the check doubles as the warm-up
        run()
        err = rel_err(fetch(), want)
        ok[m] = err <= TOL
        results[m] = {"rel_err": err, "times_ms": []}
        print(f"    {m:18s} rel err {err:.1e}" + ("" if ok[m] else f"  FAILED (> {TOL:.0e})"), flush=True)
    names = [m for m in pairs if ok[m]]
    for i in range(rounds):
        for m in names[i % len(names):] + names[:i % len(names)]:
            t0 = time.perf_counter()
            pairs[m][0]()
            results[m]["times_ms"].append(1e3 * (time.perf_counter() - t0))
    for m, r in results.items():
        r.update(ms=statistics.median(r["times_ms"]) if r["times_ms"] else None,
                 min_ms=min(r["times_ms"]) if r["times_ms"] else None)
        if r["ms"] is not None:
            print(f"    {m:18s} {r['ms']:9.2f} ms (min {r['min_ms']:.2f})", flush=True)
    ratios = {f"{m} / ours": results[m]["ms"] / results[OURS]["ms"]
              for m in (NUMBAP, NUMBA1, TORCH) if results[m]["ms"] and results[OURS]["ms"]}
    return {"shape": dict(zip("BHLKV", shape)), "compile_s": compile_s, "methods": results, "ratios": ratios}


def report(result):
    m = result["machine"]
    lines = ["# Delta-rule scan (CPU, Gated DeltaNet)", "",
             f"{m['cpu']}, {m['cores']} cores; 1-min load {m['loadavg_1min_start']:.1f} at start, "
             f"{m['loadavg_1min_end']:.1f} at end.  Median of {result['rounds']} interleaved rounds, ms "
             "(min in parentheses); speedup = their median / ours.", "",
             f"| shape | {OURS} | {NUMBAP} | {NUMBA1} | {TORCH} | vs {NUMBAP} | vs {NUMBA1} | vs {TORCH} |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        s = r["shape"]
        cells = [" ".join(f"{k}={v}" for k, v in s.items())]
        for name in (OURS, NUMBAP, NUMBA1, TORCH):
            x = r["methods"][name]
            cells.append("fail" if x["ms"] is None else f"{x['ms']:.1f} ({x['min_ms']:.1f})")
        for name in (NUMBAP, NUMBA1, TORCH):
            v = r["ratios"].get(f"{name} / ours")
            cells.append("—" if v is None else f"{v:.1f}x")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Max error relative to the float64 oracle: " + "; ".join(
        ", ".join(f"{k} {v['rel_err']:.0e}" for k, v in r["methods"].items()) for r in result["rows"]), ""]
    return "\n".join(lines)


def main(argv=None):
    from .scan import _machine

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a small shape: a smoke run")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out_delta"))
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    result = {"machine": _machine(), "rounds": args.rounds, "tol": TOL, "rows": []}
    for shape in QUICK if args.quick else SHAPES:
        result["rows"].append(row(shape, args.rounds))
    result["machine"]["loadavg_1min_end"] = os.getloadavg()[0]
    result["seconds"] = time.perf_counter() - t0
    md = outputs.write(args.out, "delta", result, report(result))
    print("\n" + md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
