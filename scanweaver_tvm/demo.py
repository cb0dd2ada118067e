"""``make demo``: build the scan realizations for this CPU, check them, time them.

    python -m scanweaver_tvm.demo

Plain scan at (1, 1536, 1024) and selective scan at (1, 1536, 1024, N=16): each realization
is built by TVM for the host CPU, run on fresh random inputs, compared with the float64
reference, and timed next to a PyTorch loop measured in the same run.
"""
import time

import numpy as np
import torch
import tvm

import tir_schedules

from . import reference
from .spec import AffineScanSpec, SelectiveScanSpec


def _median_ms(fn, repeats=7):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return float(np.median(times))


def _run(spec, inputs, out_shape):
    t0 = time.perf_counter()
    mod = tir_schedules.build(spec, "llvm")
    build_s = time.perf_counter() - t0
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(x, dev) for x in inputs]
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, np.float32), dev)
    mod["scanweaver_scan"](*args, out)
    ms = float(np.median(mod.time_evaluator("scanweaver_scan", dev, number=10, repeat=5)(*args, out).results)) * 1e3
    return out.numpy(), build_s, ms


def _report(name, got, want, build_s, ms, torch_ms):
    err = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
    print(f"  {name:30s} rel. error {err:.1e}   build {build_s:5.2f} s   run {ms:8.3f} ms   "
          f"PyTorch loop {torch_ms:8.1f} ms   ({torch_ms / ms:.0f}x)")
    return err


def plain(rng, shape=(1, 1536, 1024)):
    a = rng.uniform(0.5, 1.0, shape).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    got, build_s, ms = _run(AffineScanSpec.create(shape), [a, b], shape)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)

    def loop():
        h, out = torch.zeros(shape[:-1]), torch.empty(shape)
        for t in range(shape[-1]):
            h = ta[..., t] * h + tb[..., t]
            out[..., t] = h
    return _report(f"plain {shape}", got, reference.affine_scan(a, b), build_s, ms, _median_ms(loop, 3))


def selective(rng, batch=1, dim=1536, length=1024, dstate=16):
    u = rng.standard_normal((batch, dim, length)).astype(np.float32)
    delta = rng.uniform(-3.0, 0.0, (batch, dim, length)).astype(np.float32)
    A = -np.tile(np.arange(1, dstate + 1, dtype=np.float32), (dim, 1))
    B, C = (rng.standard_normal((batch, dstate, length)).astype(np.float32) for _ in range(2))
    D, bias = np.ones(dim, np.float32), rng.uniform(-1, 0, dim).astype(np.float32)
    z = rng.standard_normal((batch, dim, length)).astype(np.float32)
    spec = SelectiveScanSpec.for_arrays(u, delta, A, B, C, D, z, bias, delta_softplus=True)
    got, build_s, ms = _run(spec, [u, delta, A, B, C, D, z, bias], u.shape)
    want = reference.selective_scan(u, delta, A, B, C, D, z, bias, delta_softplus=True)
    t = {k: torch.from_numpy(v) for k, v in dict(u=u, delta=delta, A=A, B=B, C=C, D=D, z=z, bias=bias).items()}

    def loop():  # Mamba's selective_scan_ref
        dt = torch.nn.functional.softplus(t["delta"] + t["bias"][:, None])
        dA = torch.exp(torch.einsum("bdl,dn->bdln", dt, t["A"]))
        dBu = torch.einsum("bdl,bnl,bdl->bdln", dt, t["B"], t["u"])
        h, ys = torch.zeros(batch, dim, dstate), []
        for i in range(length):
            h = dA[:, :, i] * h + dBu[:, :, i]
            ys.append(torch.einsum("bdn,bn->bd", h, t["C"][:, :, i]))
        y = torch.stack(ys, 2) + t["u"] * t["D"][:, None]
        return y * torch.nn.functional.silu(t["z"])
    return _report(f"selective {(batch, dim, length, dstate)}", got, want, build_s, ms, _median_ms(loop, 1))


def main():
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    print(f"ScanWeaver-TVM demo: TVM {tvm.__version__}, target {tir_schedules.host_target()}")
    errors = [plain(rng), selective(rng)]
    ok = all(e < 1e-4 for e in errors)
    print("all results match the float64 reference" if ok else "MISMATCH against the float64 reference")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
