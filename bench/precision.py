"""Dense layers at each precision: ours next to PyTorch eager (oneDNN), interleaved, one run.

    python -m bench.precision [--shapes 512x768x3072,512x768x50280,1x768x3072,1x768x50280]
                              [--rounds 5] [--repeat 5] [--out bench/out_precision]

Each shape M x K x N is a ``torch.nn.Linear(K, N)`` on an (M, K) input, in float32 and in bf16
(bf16 weights and activations, float32 accumulation, a bf16 result: as PyTorch computes it).
Ours is ``sw.compile`` of that layer.  OpenVINO (``ov.convert_model`` of the float32 layer, CPU
plugin) runs at f32 and at its default precision on this CPU (bf16 where the CPU has bf16
instructions; the precision it reports is named), next to our float32 and bf16 rows.  Per
round, every path (the order rotating) is the best of ``--repeat`` calls; the table has the
medians over ``--rounds``.  GFLOP/s
counts 2 M K N; for M = 1 (a decode step's GEMV, bound by reading the weight once) the
weight's GB/s too.  The CPU's name and features head the table, and our bf16 path is named:
``vdpbf16ps`` (AVX512-BF16, ``tir_schedules/bf16_dot.py``) or the weight widened in registers.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

from . import outputs
from .openvino_cpu import compile_openvino

DEFAULT_SHAPES = "512x768x3072,512x768x50280,1x768x3072,1x768x50280"


def _best(fn, repeat):
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _runners(shape, dtype):
    """``(ours, eager)``: zero-argument calls of the compiled layer and of PyTorch's."""
    import ml_dtypes
    import torch
    import tvm
    from tvm import relax

    import scanweaver_tvm as sw

    m, k, n = shape
    torch.manual_seed(0)
    layer = torch.nn.Linear(k, n, bias=False).to(getattr(torch, dtype)).eval()
    x = torch.randn(m, k).to(layer.weight.dtype)
    vm = relax.VirtualMachine(sw.compile(sw.from_torch(layer, (x,))), tvm.cpu())
    arg = tvm.runtime.tensor(x.float().numpy().astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32))

    def eager():
        with torch.no_grad():
            layer(x)

    return (lambda: vm["main"](arg)), eager


def _openvino(shape, hint):
    """OpenVINO on the float32 layer at ``hint`` (None: its default): ``(run, precision)``."""
    import torch

    m, k, n = shape
    torch.manual_seed(0)
    return compile_openvino(torch.nn.Linear(k, n, bias=False).eval(), (torch.randn(m, k),), (hint,))[hint]


def main(argv=None):
    import torch
    import tvm

    from tir_schedules import bf16_dot
    from scanweaver_core.targets import host_target

    from .scan import _machine

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out_precision"))
    args = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    machine = _machine()
    bf16_path = "vdpbf16ps" if bf16_dot.available(host_target()) else "bf16 weights widened in registers"
    rows = []
    for text in args.shapes.split(","):
        shape = tuple(int(v) for v in text.split("x"))
        m, k, n = shape
        for dtype in ("float32", "bfloat16"):
            ours, eager = _runners(shape, dtype)
            openvino, precision = _openvino(shape, "f32" if dtype == "float32" else None)
            paths = {"ours": ours, "eager": eager, **({"openvino": openvino} if openvino else {})}
            times = {name: [] for name in paths}
            for r in range(args.rounds):
                names = list(paths)
                for name in names[r % len(names):] + names[:r % len(names)]:
                    times[name].append(_best(paths[name], args.repeat))
            med = {name: statistics.median(v) for name, v in times.items()}
            flops, weight = 2 * m * k * n, k * n * (4 if dtype == "float32" else 2)
            row = {"shape": text, "dtype": dtype, "openvino_precision": precision, "seconds": times, "median_s": med,
                   "gflops": {name: flops / s / 1e9 for name, s in med.items()},
                   "weight_GBps": {name: weight / s / 1e9 for name, s in med.items()} if m == 1 else None}
            rows.append(row)
            print(row["shape"], dtype, {name: round(g, 1) for name, g in row["gflops"].items()}, flush=True)
    by = {(r["shape"], r["dtype"]): r for r in rows}
    lines = [f"# Dense layers at each precision, ours vs PyTorch eager ({torch.__version__}, oneDNN), CPU", "",
             f"{machine['cpu']}, {machine['cores']} cores, features {', '.join(machine['features'])}; "
             f"TVM {tvm.__version__}; our bf16 path: {bf16_path}. Medians of {args.rounds} interleaved rounds, "
             f"each the best of {args.repeat} calls. GFLOP/s (2 M K N); for M = 1, GB/s of "
             "the weight at the row's precision in brackets; OpenVINO's precision in square brackets.", "",
             "| M x K x N | ours fp32 | eager fp32 | OpenVINO f32 | ours bf16 | eager bf16 | OpenVINO default "
             "| ours bf16 / fp32 | ours / eager, bf16 |", "|---|---|---|---|---|---|---|---|---|"]
    for text in args.shapes.split(","):
        f32, b16 = by[(text, "float32")], by[(text, "bfloat16")]

        def cell(row, name):
            if name not in row["gflops"]:
                return row["openvino_precision"]
            gb = f" ({row['weight_GBps'][name]:.0f} GB/s)" if row["weight_GBps"] else ""
            own = f" [{row['openvino_precision']}]" if name == "openvino" else ""
            return f"{row['gflops'][name]:.0f}{gb}{own}"

        lines.append(f"| {text} | {cell(f32, 'ours')} | {cell(f32, 'eager')} | {cell(f32, 'openvino')} | "
                     f"{cell(b16, 'ours')} | {cell(b16, 'eager')} | {cell(b16, 'openvino')} | "
                     f"{f32['median_s']['ours'] / b16['median_s']['ours']:.2f}x | "
                     f"{b16['median_s']['eager'] / b16['median_s']['ours']:.2f}x |")
    result = {"machine": machine, "bf16_path": bf16_path, "rounds": args.rounds, "repeat": args.repeat, "rows": rows}
    print("\n".join(lines))
    outputs.write(args.out, "precision", result, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
