"""Anchors: the alternatives every ScanWeaver realization is measured against.

Each builder takes the input arrays (float32 numpy) and returns a zero-argument callable that
runs the method once and returns its output (anything ``np.asarray`` accepts).  ``bench.scan``
checks each callable once against the float64 reference, then times it.

Plain scan inputs: ``a, b`` of shape (B, D, L).  Selective inputs: a dict with ``u, delta, A,
B, C, D, z, delta_bias`` (B, C of shape (B, N, L)); ``delta_softplus`` is always on.
"""
import math
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

THREADS = 2


# ---------------------------------------------------------------- memory floor

def copy_bandwidth(nbytes=256 << 20, threads=THREADS, repeats=9):
    """Copy bandwidth in bytes/s (bytes read + bytes written, per second), median of repeats,
    for 1 thread and for ``threads`` threads each copying a slice (np.copyto drops the GIL).
    Returns ``{"1": bw1, str(threads): bwT, "best": max}``."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    step = -(-src.size // threads)
    slices = [slice(i, i + step) for i in range(0, src.size, step)]
    result = {}
    with ThreadPoolExecutor(threads) as pool:
        for n in (1, threads):
            def copy():
                if n == 1:
                    np.copyto(dst, src)
                else:
                    list(pool.map(lambda s: np.copyto(dst[s], src[s]), slices))
            copy()
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                copy()
                times.append(time.perf_counter() - t0)
            result[str(n)] = 2 * src.nbytes / statistics.median(times)
    result["best"] = max(result.values())
    return result


def plain_bytes(a, b):
    """Bytes a plain scan must move: read a, b; write the states."""
    return a.nbytes + 2 * b.nbytes


def selective_bytes(x):
    """Bytes a selective scan must move: read u, delta, z, B, C; write out (A, D, bias ~0)."""
    return sum(x[k].nbytes for k in ("u", "delta", "z", "B", "C")) + x["u"].nbytes


def floor_ms(nbytes, bandwidth):
    return 1e3 * nbytes / bandwidth


# ---------------------------------------------------------------- PyTorch eager

def _torch():
    import torch
    torch.set_num_threads(THREADS)
    return torch


def plain_torch_loop(a, b):
    """Eager PyTorch: one addcmul per step over all lanes."""
    torch = _torch()
    at, bt = torch.from_numpy(a), torch.from_numpy(b)
    out = torch.empty_like(bt)

    def run():
        h = torch.zeros(bt.shape[:-1])
        for t in range(bt.shape[-1]):
            h = torch.addcmul(bt[..., t], at[..., t], h)
            out[..., t] = h
        return out
    return run


def selective_torch_ref(x):
    """Mamba's ``selective_scan_ref`` (variable B, C of shape (B, N, L), no groups)."""
    torch = _torch()
    F = torch.nn.functional
    u, delta, A, B, C, D, z, bias = (torch.from_numpy(x[k]) for k in
                                     ("u", "delta", "A", "B", "C", "D", "z", "delta_bias"))

    def run():
        dt = F.softplus(delta + bias[..., None])
        deltaA = torch.exp(torch.einsum("bdl,dn->bdln", dt, A))
        deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", dt, B, u)
        h = A.new_zeros((u.shape[0], A.shape[0], A.shape[1]))
        ys = []
        for i in range(u.shape[2]):
            h = deltaA[:, :, i] * h + deltaB_u[:, :, i]
            ys.append(torch.einsum("bdn,bn->bd", h, C[:, :, i]))
        y = torch.stack(ys, dim=2)
        return (y + u * D[:, None]) * F.silu(z)
    return run


# ---------------------------------------------------------------- numba

def _numba():
    import numba
    numba.set_num_threads(min(THREADS, numba.config.NUMBA_NUM_THREADS))
    return numba


_KERNELS = {}


def _kernels():
    """Compile-on-first-use numba kernels (cached per process)."""
    if _KERNELS:
        return _KERNELS
    numba = _numba()
    njit, prange = numba.njit, numba.prange

    @njit(fastmath=True)
    def lanes_serial(a, b, out):
        for i in range(b.shape[0]):
            h = np.float32(0.0)
            for t in range(b.shape[1]):
                h = a[i, t] * h + b[i, t]
                out[i, t] = h

    @njit(fastmath=True, parallel=True)
    def lanes_parallel(a, b, out):
        for i in prange(b.shape[0]):
            h = np.float32(0.0)
            for t in range(b.shape[1]):
                h = a[i, t] * h + b[i, t]
                out[i, t] = h

    @njit(fastmath=True, parallel=True)
    def selective_fused(u, delta, A, B, C, D, z, bias, out):
        nb, nd, nl = u.shape
        ns = A.shape[1]
        for i in prange(nb * nd):
            bi, d = i // nd, i % nd
            h = np.zeros(ns, dtype=np.float32)
            for t in range(nl):
                dt = delta[bi, d, t] + bias[d]
                if dt <= 20.0:
                    dt = np.float32(np.log1p(np.exp(dt)))
                ut = u[bi, d, t]
                y = np.float32(0.0)
                for n in range(ns):
                    h[n] = np.exp(dt * A[d, n]) * h[n] + dt * B[bi, n, t] * ut
                    y += C[bi, n, t] * h[n]
                zt = z[bi, d, t]
                out[bi, d, t] = (y + D[d] * ut) * zt / (np.float32(1.0) + np.exp(-zt))

    _KERNELS.update(lanes_serial=lanes_serial, lanes_parallel=lanes_parallel,
                    selective_fused=selective_fused)
    return _KERNELS


def _plain_numba(kernel_name, a, b):
    kernel = _kernels()[kernel_name]
    a2, b2 = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    out = np.empty_like(b2)

    def run():
        kernel(a2, b2, out)
        return out.reshape(b.shape)
    return run


def plain_numba_serial(a, b):
    """numba @njit, one lane after another, single thread."""
    return _plain_numba("lanes_serial", a, b)


def plain_numba_parallel(a, b):
    """numba @njit(parallel=True): prange over lanes."""
    return _plain_numba("lanes_parallel", a, b)


def selective_numba_fused(x):
    """numba parallel fused loop: prange over (b, d), N states local, all math on the fly."""
    kernel = _kernels()["selective_fused"]
    args = [x[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")]
    out = np.empty_like(x["u"])

    def run():
        kernel(*args, out)
        return out
    return run


# ---------------------------------------------------------------- JAX

def plain_jax_assoc(a, b):
    """``jax.lax.associative_scan`` under jit (CPU): pairs (a, b), combine
    (a1, b1), (a2, b2) -> (a1*a2, a2*b1 + b2)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    def combine(x, y):
        return x[0] * y[0], y[0] * x[1] + y[1]
    f = jax.jit(lambda a, b: jax.lax.associative_scan(combine, (a, b), axis=-1)[1])
    ja, jb = jax.device_put(a), jax.device_put(b)

    def run():
        return f(ja, jb).block_until_ready()
    return run


PLAIN = {
    "torch loop": plain_torch_loop,
    "numba serial": plain_numba_serial,
    "numba parallel": plain_numba_parallel,
    "jax assoc": plain_jax_assoc,
}
SELECTIVE = {
    "torch ref loop": selective_torch_ref,
    "numba fused parallel": selective_numba_fused,
}


# ---------------------------------------------------------------- inputs

def plain_inputs(shape, seed=0):
    """Decays in [0.8, 1) (a stable, long-memory recurrence) and standard-normal drives."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.8, 1.0, shape).astype(np.float32)
    b = rng.standard_normal(shape, dtype=np.float32)
    return a, b


def selective_inputs(batch, dim, length, dstate, seed=0):
    """Mamba-like operands: S4D-real A = -(1..N), small deltas, D and bias per channel."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    return {
        "u": rng.standard_normal((batch, dim, length), dtype=f32),
        "delta": (0.5 * rng.standard_normal((batch, dim, length))).astype(f32),
        "A": -np.tile(np.arange(1, dstate + 1, dtype=f32), (dim, 1)),
        "B": rng.standard_normal((batch, dstate, length), dtype=f32),
        "C": rng.standard_normal((batch, dstate, length), dtype=f32),
        "D": rng.standard_normal(dim, dtype=f32),
        "z": rng.standard_normal((batch, dim, length), dtype=f32),
        "delta_bias": np.full(dim, math.log(math.expm1(0.01)), dtype=f32) +
        rng.uniform(0, 1, dim).astype(f32),
    }
