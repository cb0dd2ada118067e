"""Dense and elementwise layers through ``sw.compile`` on the CPU, next to PyTorch eager in the
same run (the rules of ``tir_schedules/dense_cpu.py`` and ``elementwise_cpu.py``).

    python -m bench.cpu_layers [--out bench/out_cpu_layers] [--tile 4x16]

``--tile`` forces the dense rule's register tile (rows x columns) to compare tiles on this
host.  Medians of repeated calls, eager with 2 threads, interleaved per case.
"""
import argparse
import os
import time

import numpy as np

DENSE = [(256, 768, 50304), (256, 768, 3072), (1, 768, 50304)]
ELEMENTWISE = {"tanh(x/30)*30": lambda t, x: t.tanh(x / 30.0) * 30.0,
               "silu(x)*x": lambda t, x: t.nn.functional.silu(x) * x,
               "exp(x)+1": lambda t, x: t.exp(x) + 1, "2x+1": lambda t, x: x * 2 + 1}


def _median_ms(fn, rounds=8):
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def _compiled(module, args):
    import tvm
    from tvm import relax

    import scanweaver_tvm as sw

    vm = relax.VirtualMachine(sw.compile(sw.from_torch(module, args), "llvm"), tvm.cpu())
    inputs = [tvm.runtime.tensor(a.numpy()) for a in args]
    return lambda: vm["main"](*inputs)


def _first(out):
    return out.numpy() if hasattr(out, "numpy") else out[0].numpy()


def main(argv=None):
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out_cpu_layers"))
    p.add_argument("--tile", help="force the dense register tile, e.g. 4x16")
    args = p.parse_args(argv)
    if args.tile:
        from tir_schedules import dense_cpu
        tile = dense_cpu.RegisterTile(*map(int, args.tile.split("x")))
        dense_cpu.register_tile = lambda target: tile
    torch.set_num_threads(2)
    torch.manual_seed(0)
    lines = ["| layer | shape | ours ms | eager ms | eager / ours | max abs err |", "|---|---|---|---|---|---|"]
    for m, k, n in DENSE:
        lin = torch.nn.Linear(k, n, bias=False).eval()
        x = torch.randn(1, m, k)
        run = _compiled(lin, (x,))
        with torch.no_grad():
            err = float(np.max(np.abs(_first(run()) - lin(x).numpy())))
            eager = _median_ms(lambda: lin(x))
        ours = _median_ms(run)
        lines.append(f"| Linear | {m}x{k}x{n} | {ours:.1f} ({2 * m * k * n / ours / 1e6:.0f} GFLOP/s) | "
                     f"{eager:.1f} | {eager / ours:.2f} | {err:.1e} |")
        print(lines[-1], flush=True)
    x = torch.randn(256, 50304)
    for name, fn in ELEMENTWISE.items():
        class Layer(torch.nn.Module):
            def forward(self, x, fn=fn):
                return fn(torch, x)
        run = _compiled(Layer(), (x,))
        err = float(np.max(np.abs(_first(run()) - Layer()(x).numpy())))
        eager, ours = _median_ms(lambda: Layer()(x)), _median_ms(run)
        lines.append(f"| {name} | 256x50304 | {ours:.1f} | {eager:.1f} | {eager / ours:.2f} | {err:.1e} |")
        print(lines[-1], flush=True)
    from tir_schedules import dense_cpu, host_target
    tile = dense_cpu.register_tile(host_target())
    head = (f"# CPU layers\n\nTarget `{host_target()}`, dense register tile {tile.rows} x {tile.cols}, "
            "2 threads; medians of 8 calls.\n\n")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cpu_layers.md"), "w", encoding="utf-8") as f:
        f.write(head + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
