"""Benchmark harness: anchors (what we compare against) and the side-by-side scan benchmark.

``python -m bench.scan`` runs everything on the CPU; ``bench/gpu/run_gpu_check.py`` runs
prepared CUDA artifacts on a lent GPU machine (no TVM needed there).
"""
import os
import statistics
import time

import numpy as np

# torch and numba each bring an OpenMP runtime; spinning idle workers of one starve the other
# on a small machine.  Passive waiting keeps one method's threads from slowing the next.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def time_ms(fn, warmup=1, repeats=7, budget_s=5.0, stats=False):
    """Median wall time of ``fn()`` in ms: ``warmup`` calls, then up to ``repeats`` calls
    (at least 3) until ``budget_s`` seconds are spent.  ``stats=True``: also min and count."""
    for _ in range(warmup):
        fn()
    times, start = [], time.perf_counter()
    while len(times) < repeats and (len(times) < 3 or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    median = statistics.median(times)
    return {"ms": median, "min_ms": min(times), "n": len(times)} if stats else median


def rel_err(x, ref):
    """max |x - ref| / max |ref| (computed in float64)."""
    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1e-30))
