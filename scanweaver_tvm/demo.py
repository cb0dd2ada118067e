"""``make demo``: the main job end to end on a Mamba block.

    python -m scanweaver_tvm.demo [--length 1024] [--no-baseline]

Imports a Mamba block (its selective scan written as Mamba's reference loop) from PyTorch,
prints what the pass finds, compiles it for this CPU with ScanWeaver, checks the result
against PyTorch, and times compile and run next to TVM without the pass (the unrolled loop)
and PyTorch eager, all measured in this run.
"""
import argparse
import contextlib
import os
import sys
import time

import numpy as np
import torch
import tvm
from tvm import relax

from . import api, models


def _step(what):
    print(f"  {what} ...", end="", flush=True)
    return time.perf_counter()


def _done(t0):
    dt = time.perf_counter() - t0
    print(f" {dt:.1f} s", flush=True)
    return dt


@contextlib.contextmanager
def _native_stderr_silenced():
    """TVM's C++ logs one warning per ``take`` of the unrolled graph (thousands of lines at
    L=1024) straight to file descriptor 2; keep them off the demo's output."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _median_ms(fn, repeats=20):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return float(np.median(times))


def _vm(ex, args):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    tensors = [tvm.runtime.tensor(a.numpy()) for a in args]
    return lambda: vm["main"](*tensors)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024, help="sequence length L (default 1024)")
    parser.add_argument("--no-baseline", action="store_true", help="skip compiling TVM without the pass")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    model, inputs = models.mamba_block(length=args.length)
    print(f"ScanWeaver-TVM demo: Mamba block, input {tuple(inputs[0].shape)}, TVM {tvm.__version__}, "
          f"target {api._target('llvm')}")
    t0 = _step("importing from PyTorch (torch.export + Relax frontend)")
    mod = api.from_torch(model, inputs)
    _done(t0)
    print("  recurrences found:")
    for rec in api.find_recurrences(mod, include_rejected=True):
        print(f"    {rec}")
    t0 = _step("compiling with ScanWeaver")
    ex = api.compile(mod, "llvm")
    run = _vm(ex, inputs)                            # TVM generates the machine code here
    ours_compile = _done(t0)
    got = run()[0].numpy()
    with torch.no_grad():
        want = model(*inputs).numpy()
    err = float(np.abs(got - want).max() / max(1e-30, np.abs(want).max()))
    ok = err <= 1e-4
    print(f"  check against PyTorch: max relative error {err:.1e} ({'OK' if ok else 'MISMATCH'})")
    rows = [("ScanWeaver (TVM + pass)", ours_compile, _median_ms(run))]
    if not args.no_baseline:
        t0 = _step("compiling with TVM alone: the unrolled loop, minutes at L=1024 "
                   "(--no-baseline skips it)")
        with _native_stderr_silenced():
            ex_plain = tvm.compile(mod, target=api._target("llvm"))
            run_plain = _vm(ex_plain, inputs)      # TVM generates the machine code here
        plain_compile = _done(t0)
        rows.append(("TVM without the pass", plain_compile, _median_ms(run_plain, 5)))

    def eager():
        with torch.no_grad():
            model(*inputs)
    rows.append(("PyTorch eager", None, _median_ms(eager, 5)))
    ours_ms = rows[0][2]
    print(f"\n  {'':26s} {'compile':>9s} {'run':>10s} {'run vs ours':>12s}   (compile: until runnable)")
    for name, compile_s, ms in rows:
        c = f"{compile_s:8.1f}s" if compile_s is not None else f"{'-':>9s}"
        print(f"  {name:26s} {c} {ms:8.2f}ms {ms / ours_ms:11.1f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
