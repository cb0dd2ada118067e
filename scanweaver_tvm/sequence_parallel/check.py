"""Run one scan split across the ranks of a torch.distributed job and check it against the
same scan in one process::

    torchrun --nproc-per-node 2 -m scanweaver_tvm.sequence_parallel.check --form delta --length 4099

Every rank draws the same operands (one seed), runs its part through the compiled module's
``main`` (one all-gather), and rank 0 compares every rank's outputs with the whole scan compiled
and run in one process (1e-5 of each output's scale in float32), and the bytes each rank sent
with ``cost.summary_bytes``.  Exits non-zero on a mismatch."""
import argparse
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import tvm
from tvm import relax

from relax_pass.split.summaries import run_scan
from scanweaver_core.sequence_parts import output_time_axis, view
from scanweaver_core.targets import physical_cores
from scanweaver_core.spec import (AffineScanSpec, DeltaScanSpec, MatrixScanSpec, MLSTMScanSpec, SelectiveScanSpec,
                                  StabilizedScanSpec)

from .. import api
from .collective import TRAFFIC
from .cost import summary_bytes
from .run import run_whole_split

FORMS = {   # name: the whole scan's spec over `length` steps (small widths: a correctness check)
    "affine": lambda n: AffineScanSpec.create((2, n, 8), (2, n, 8), axis=1, has_h0=True, outputs=("states", "last")),
    "selective": lambda n: SelectiveScanSpec(1, 8, n, 4, has_D=True, has_z=True, has_delta_bias=True,
                                             delta_softplus=True, return_last_state=True),
    "matrix": lambda n: MatrixScanSpec.create(1, 2, n, 8, 4, decay="key", has_h0=True, return_last_state=True),
    "mamba2": lambda n: MatrixScanSpec.create(1, 2, n, 8, 4, decay="scalar", k_shape=(1, 1, n, 8),
                                              q_shape=(1, 1, n, 8), return_last_state=True),
    "stabilized": lambda n: StabilizedScanSpec(1, 8, n, decay="channel", has_bonus=True, return_last_state=True),
    "mlstm": lambda n: MLSTMScanSpec(1, 2, n, 8, 4, return_last_state=True),
    "delta": lambda n: DeltaScanSpec(1, 2, n, 8, 4, decay="head", l2norm=True, scale=8 ** -0.5,
                                     return_last_state=True),
    "dplr": lambda n: DeltaScanSpec(1, 2, n, 8, 4, decay="key", rule="dplr", return_last_state=True),
}


def random_operands(spec, rng):
    """``{input name: array}`` for ``spec`` with the dynamics trained layers have: decays below
    one, gates in range, unit keys where the rule expects them."""

    ops = view(spec).operands
    draw = _draws(spec, rng)
    out = {}
    for name, (shape, dtype) in ops.items():
        x = draw.get(name, rng.standard_normal)(tuple(shape))
        out[name] = np.asarray(x, dtype=np.float32 if dtype == "float32" else dtype)
    if isinstance(spec, DeltaScanSpec) and spec.is_dplr:
        unit = _unit(rng.standard_normal(ops["a"][0]))
        out["a"], out["b"] = -unit, (unit * rng.uniform(0, 1, unit.shape)).astype(np.float32)
    return out


def _unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _draws(spec, rng):
    normal = rng.standard_normal
    if isinstance(spec, AffineScanSpec):
        return {"a": lambda s: rng.uniform(0.3, 1.0, s)}
    if isinstance(spec, SelectiveScanSpec):
        return {"delta": lambda s: rng.uniform(-4.5, -1.6, s), "A": lambda s: -rng.uniform(0.1, 4.0, s),
                "delta_bias": lambda s: rng.uniform(-0.05, 0.05, s)}
    if isinstance(spec, MatrixScanSpec):
        return {"k": lambda s: 0.3 * normal(s), "g": lambda s: rng.uniform(0.6, 1.0, s),
                "dt": lambda s: rng.uniform(-4.5, 0.0, s), "A": lambda s: -rng.uniform(0.1, 4.0, s)}
    if isinstance(spec, StabilizedScanSpec):
        return {"k": lambda s: 3 * normal(s), "den0": lambda s: rng.random(s) + 0.5,
                "w": lambda s: -np.exp(normal(s)) if spec.decay == "channel" else 0.5 * normal(s)}
    if isinstance(spec, MLSTMScanSpec):
        return {"i": lambda s: 3 * normal(s), "f": lambda s: -np.log1p(np.exp(-normal(s) - 2))}
    unit = (lambda s: normal(s)) if spec.l2norm else (lambda s: _unit(normal(s)))
    return {"k": unit, "p": unit, "beta": lambda s: rng.uniform(0.05, 1.0, s),
            "g": lambda s: -rng.uniform(0.0, 1.0, s)}


def whole_scan(spec, operands, target="llvm"):
    """``{output name: array}`` of ``spec`` run whole, in one process."""
    shown = view(spec)
    params = {n: relax.Var(n, relax.TensorType(list(s), d)) for n, (s, d) in shown.operands.items()}
    bb = relax.BlockBuilder()
    with bb.function("main", list(params.values())):
        got = run_scan(bb, spec, params)
        out = [got[n] for n in shown.outputs]
        bb.emit_func_output(out[0] if len(out) == 1 else relax.Tuple(out))
    vm = relax.VirtualMachine(api.compile(bb.get(), target), tvm.cpu())
    res = vm["main"](*[tvm.runtime.tensor(operands[n]) for n in shown.operands])
    res = [res] if hasattr(res, "numpy") else list(res)
    return dict(zip(shown.outputs, (r.numpy() for r in res)))


def compare(spec, parts, whole, rtol=1e-5):
    """Problems (strings) between every rank's outputs ``parts`` and the ``whole`` run: the
    per-step outputs concatenated along time, the last state on every rank."""

    problems = []
    for name, want in whole.items():
        axis = output_time_axis(spec, name)
        got = [np.concatenate([p[name] for p in parts], axis=axis)] if axis is not None else [p[name] for p in parts]
        scale = max(float(np.abs(want).max()), 1.0)
        for g in got:
            err = float(np.abs(g.astype(np.float64) - want).max()) / scale
            if not err <= rtol:
                problems.append(f"{name}: {err:.2e} of its scale (limit {rtol:g})")
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--form", choices=sorted(FORMS), default="delta")
    parser.add_argument("--length", type=int, default=4099)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)


    torch.set_num_threads(1)
    os.environ["TVM_NUM_THREADS"] = str(max(1, physical_cores() // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = FORMS[args.form](args.length)
    operands = random_operands(spec, np.random.default_rng(args.seed))
    mine = run_whole_split(spec, operands, rank, world)
    sent = TRAFFIC.bytes_sent
    gathered = [None] * world if rank == 0 else None
    dist.gather_object((mine, sent), gathered, dst=0)
    failed = 0
    if rank == 0:
        problems = compare(spec, [g[0] for g in gathered], whole_scan(spec, operands))
        want = summary_bytes(spec)
        problems += [f"rank {r} sent {g[1]} bytes, the cost model says {want}"
                     for r, g in enumerate(gathered) if g[1] != want]
        print(f"{args.form}, L = {args.length} over {world} ranks: "
              + ("equal to one process" if not problems else "; ".join(problems))
              + f" ({want} bytes a rank in one all-gather)", flush=True)
        failed = int(bool(problems))
    flag = torch.tensor([failed])
    dist.broadcast(flag, 0)
    dist.destroy_process_group()
    return int(flag.item())


if __name__ == "__main__":
    sys.exit(main())
