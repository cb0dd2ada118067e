"""Putting our pass into a user's Relax pipeline, timed: each documented way next to
``sw.compile`` and the peers, the same model, interleaved in one run.

    python -m bench.pipeline_insertion [--layers 2] [--length 256] [--budget 2] [--out bench/out_pipeline]

The model: HF ``MambaForCausalLM`` at the real width (d_model 768, d_inner 1536, N 16,
vocabulary 50280; random weights), float32, one prompt of ``--length`` tokens, its logits.
Paths: ``sw.compile``; ``tvm.compile(relax_pipeline=Sequential([user pass, sw.pipeline(target)]))``
(the documented insertion) and ``relax_pipeline="scanweaver"`` (the registered name); our two
passes in front of ``relax.get_default_pipeline(target)`` (the pass alone: TVM's CPU pipeline
then lowers the dense layers without our rules); TVM's default pipeline without the pass; and
PyTorch eager.  Every path's logits are checked against eager's.  Writes
``pipeline_insertion.json`` / ``.md`` into ``--out``.
"""
import argparse
import os

import numpy as np

from . import outputs
from .models_timing import interleaved
from .models_zoo import hf_mamba
from .scan import _machine


def builds(mod, target):
    """label -> the executable of each way of lowering ``mod`` (imported, not lowered)."""
    import tvm
    from tvm import relax

    import scanweaver_tvm as sw

    def user_pass():          # (any pass of the user's own, before ours)
        return relax.transform.Normalize()

    return {
        "sw.compile": lambda: sw.compile(mod, "llvm"),
        "tvm.compile + sw.pipeline (documented)": lambda: tvm.compile(
            mod, target=target, relax_pipeline=tvm.transform.Sequential([user_pass(), sw.pipeline(target)])),
        'tvm.compile + "scanweaver" (registered)': lambda: tvm.compile(
            mod, target=target, relax_pipeline="scanweaver"),
        "sw.passes + TVM's default pipeline": lambda: tvm.compile(
            mod, target=target,
            relax_pipeline=tvm.transform.Sequential([sw.passes(target), relax.get_default_pipeline(target)])),
        "TVM's default pipeline, no pass": lambda: tvm.compile(mod, target=target),
    }


def main(argv=None):
    import torch
    import tvm
    from tvm import relax

    import scanweaver_tvm as sw
    from scanweaver_tvm import api

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--budget", type=float, default=2.0, help="seconds of timing per path")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out_pipeline"))
    args = p.parse_args(argv)

    torch.set_num_threads(os.cpu_count() or 1)
    model, inputs = hf_mamba(args.length, layers=args.layers)
    with torch.no_grad():
        want = model(*inputs).float().numpy()
    mod, target = sw.from_torch(model, inputs), api._target("llvm")
    feed = [tvm.runtime.tensor(x.numpy()) for x in inputs]
    runs, errors = {}, {}
    for label, build in builds(mod, target).items():
        vm = relax.VirtualMachine(build(), tvm.cpu())
        out = vm["main"](*feed)
        got = (out if hasattr(out, "numpy") else out[0]).numpy()
        errors[label] = float(np.abs(got - want).max() / np.abs(want).max())
        runs[label] = lambda vm=vm: vm["main"](*feed)

    def eager():
        with torch.no_grad():
            model(*inputs)

    runs["PyTorch eager"], errors["PyTorch eager"] = eager, 0.0
    times = interleaved(runs, args.budget)
    base = times["sw.compile"]["ms"]
    result = {"machine": _machine(), "shape": {"layers": args.layers, "length": args.length, "hidden": 768,
                                               "vocab": 50280, "dtype": "float32"},
              "paths": {k: {**times[k], "relative_error": errors[k]} for k in runs}}
    lines = [f"# Pipeline insertion: HF Mamba ({args.layers} layers, hidden 768, vocab 50280), "
             f"one prompt of {args.length} tokens, float32, CPU", "",
             f"{result['machine']['cpu']}, {result['machine']['cores']} cores; medians of interleaved rounds.", "",
             "| path | ms | time / sw.compile's | max error vs eager (relative) |", "|---|---|---|---|"]
    for label in runs:
        lines.append(f"| {label} | {times[label]['ms']:.2f} | {times[label]['ms'] / base:.2f}x | "
                     f"{errors[label]:.1e} |")
    print(outputs.write(args.out, "pipeline_insertion", result, "\n".join(lines) + "\n"))


if __name__ == "__main__":
    main()
