"""Qwen3-Next's Gated DeltaNet layers through ``sw.compile`` next to PyTorch eager (transformers'
torch path), timed in one run on the CPU.

    python -m bench.delta_layers [--lengths 512] [--rounds 5] [--out bench/out_delta]

The issue's shape: two decoder layers, both linear attention (hidden 1024, 8 key heads and 16
value heads of 128, dense MLPs), batch 1, no embedding or lm head (``Qwen3NextModel``'s layers
on a hidden-state input).  Checked against eager (max relative error), then both timed in
interleaved rounds (medians, ms).  Writes ``delta_layers.json`` / ``.md`` into ``--out``.
"""
import argparse
import inspect
import os
import statistics
import sys
import time

import numpy as np

os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")

from . import outputs, rel_err  # noqa: E402


class Layers:
    """Two Gated DeltaNet decoder layers on hidden states (what the issue timed)."""

    def __init__(self):
        import torch
        import transformers
        from transformers.models.qwen3_next import modeling_qwen3_next as mq
        for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn"):
            setattr(mq, name, inspect.unwrap(getattr(mq, name)))    # transformers' torch path
        torch.manual_seed(0)
        cfg = transformers.Qwen3NextConfig(
            vocab_size=256, hidden_size=1024, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
            head_dim=128, intermediate_size=2816, linear_num_key_heads=8, linear_num_value_heads=16,
            linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
            layer_types=["linear_attention", "linear_attention"], mlp_only_layers=[0, 1])
        model = mq.Qwen3NextModel(cfg).eval()

        class Stack(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = model.layers

            def forward(self, h):
                for layer in self.layers:
                    h = layer(h, attention_mask=None, position_embeddings=None)
                    h = h[0] if isinstance(h, tuple) else h
                return h
        self.module = Stack().eval()


def row(length, rounds):
    import torch
    import tvm
    from tvm import relax

    import scanweaver_tvm as sw

    torch.set_num_threads(2)
    layers = Layers().module
    x = torch.randn(1, length, 1024, generator=torch.Generator().manual_seed(length))
    t0 = time.perf_counter()
    mod = sw.from_torch(layers, (x,))
    import_s = time.perf_counter() - t0
    found = [r for r in sw.find_recurrences(mod, include_rejected=True)]
    t0 = time.perf_counter()
    vm = relax.VirtualMachine(sw.compile(mod, "llvm"), tvm.cpu())
    compile_s = time.perf_counter() - t0
    arg = tvm.runtime.tensor(x.numpy())
    box = {}

    def ours():
        box["ours"] = vm["main"](arg)

    def eager():
        with torch.no_grad():
            box["eager"] = layers(x)
    ours()
    eager()
    got = box["ours"]
    got = (got[0] if isinstance(got, (list, tuple)) or hasattr(got, "__getitem__") and not hasattr(got, "numpy")
           else got).numpy()
    err = rel_err(got, box["eager"].numpy())
    times = {"ours": [], "eager": []}
    for i in range(rounds):
        for name, fn in (("ours", ours), ("eager", eager))[::1 if i % 2 == 0 else -1]:
            start = time.perf_counter()
            fn()
            times[name].append(1e3 * (time.perf_counter() - start))
    ms = {k: statistics.median(v) for k, v in times.items()}
    print(f"L={length}: ours {ms['ours']:.1f} ms, eager {ms['eager']:.1f} ms "
          f"({ms['eager'] / ms['ours']:.2f}x), rel err {err:.1e}, scans "
          f"{[(r.form, r.rejected) for r in found]}", flush=True)
    return {"L": length, "import_s": import_s, "compile_s": compile_s, "rel_err": err, "times_ms": times,
            "ms": ms, "vs_eager": ms["eager"] / ms["ours"],
            "found": [repr(r) for r in found]}


def main(argv=None):
    from .scan import _machine

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[512])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out_delta"))
    args = p.parse_args(argv)
    result = {"machine": _machine(), "rows": [row(n, args.rounds) for n in args.lengths]}
    result["machine"]["loadavg_1min_end"] = os.getloadavg()[0]
    lines = ["# Qwen3-Next Gated DeltaNet layers (CPU)", "",
             "Two linear-attention decoder layers (hidden 1024, 8 key / 16 value heads of 128, dense MLP), "
             f"batch 1; {result['machine']['cpu']}, {result['machine']['cores']} cores; median of interleaved "
             "rounds.", "", "| L | ours ms | eager ms | vs eager | rel err | compile s |", "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['L']} | {r['ms']['ours']:.1f} | {r['ms']['eager']:.1f} | {r['vs_eager']:.2f}x | "
                     f"{r['rel_err']:.0e} | {r['compile_s']:.1f} |")
    print("\n".join(lines))
    outputs.write(args.out, "delta_layers", result, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
