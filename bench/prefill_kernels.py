"""Where a prefill's time goes: a whole model's first token, ours next to PyTorch eager (and
OpenVINO where it converts the model) in the same interleaved rounds, at each precision, and our
prefill split by kernel kind against the machine's roof for that kind.

    python -m bench.prefill_kernels [--model qwen3_5] [--prompt 512] [--rounds 3]
                                    [--dtypes float32,bfloat16] [--out bench/out_prefill_kernels]

Models at a real width, random weights: ``qwen3_5`` (transformers' ``Qwen3_5ForCausalLM``:
hidden 1024, 3 Gated DeltaNet layers + 1 gated-attention layer, 16 linear heads of 128 and 8
attention heads of 128, MLP 3072, vocabulary 50280) and ``mamba`` (HF Mamba, 768 / 1536 / 16,
4 layers).  The first token: ours is one ``prefill`` call; eager is the model's forward over the
prompt on its torch path (``torch_kernels``), which is what its ``generate`` does first.

The kernel split comes from one prefill timed call by call (``VirtualMachine.set_instrument``),
each kernel put in a kind by its name.  What each kind is held to, measured in the same run:
dense layers against PyTorch's own 2048^3 matmul at that precision (oneDNN: a vendor kernel's
rate on this CPU, not its theoretical peak, which a VM does not report: ours may exceed it);
every other kind against the copy bandwidth (numpy, 256 MB), with a kernel's bytes counted as
the sizes of its arguments (each read or written once: a lower bound; a scan is bound by its
arithmetic, not its bytes, so its share of the bandwidth says little).
"""
import argparse
import collections
import math
import os
import statistics
import sys
import time

from . import outputs
from .generate import copy_bandwidth
from .models_zoo import logits_module
from .openvino_cpu import compile_openvino

KINDS = ("dense", "scan", "attention", "conv", "norm", "layout", "elementwise", "vm")


def kind_of(name):
    """A kernel's kind from its name (TVM names a fused kernel by the ops it holds)."""
    if name.startswith("vm.builtin"):
        return "vm"
    if name.startswith("scanweaver") or "_scan" in name:
        return "scan"
    for kind, marks in (("attention", ("attention",)), ("dense", ("matmul", "dense")), ("conv", ("conv",)),
                        ("norm", ("mean", "rsqrt", "norm", "variance"))):
        if any(m in name for m in marks):
            return kind
    math = ("exp", "sigmoid", "tanh", "multiply", "add", "subtract", "divide", "power", "log", "where", "sum")
    if any(m in name for m in ("transpose", "split", "concatenate", "reshape", "take", "cast", "slice")) \
            and not any(m in name for m in math):
        return "layout"
    return "elementwise"


def model_of(name):
    import transformers as T

    if name == "qwen3_5":
        return T.Qwen3_5ForCausalLM(T.Qwen3_5TextConfig(
            vocab_size=50280, hidden_size=1024, intermediate_size=3072, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=2, head_dim=128, linear_num_key_heads=16,
            linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
            linear_conv_kernel_dim=4, layer_types=["linear_attention"] * 3 + ["full_attention"]))
    if name == "mamba":
        return T.MambaForCausalLM(T.MambaConfig(vocab_size=50280, hidden_size=768, state_size=16,
                                                num_hidden_layers=4, expand=2))
    raise ValueError(f"--model: {name!r} is not one of qwen3_5, mamba")


def _nbytes(x):
    import tvm

    shape = getattr(x, "shape", None)
    if shape is None or not hasattr(x, "dtype"):
        return 0
    return math.prod(int(n) for n in shape) * tvm.DataType(str(x.dtype)).bits // 8


def _dense_flops(args):
    """2 M N K of a matmul kernel: its first argument (M x K activations), its last (the output)."""
    tensors = [a for a in args if getattr(a, "shape", None) is not None and len(a.shape) >= 2]
    if len(tensors) < 2:
        return 0
    out, k = tensors[-1], int(tensors[0].shape[-1])
    return 2 * math.prod(int(n) for n in out.shape) * k


def kernel_split(vm, call):
    """``call()`` once with every VM call timed: name -> (seconds, calls, bytes, flops)."""
    totals = collections.defaultdict(lambda: [0.0, 0, 0, 0])
    started = {}

    def instrument(_func, name, before, _ret, *args):
        if before:
            started[name] = time.perf_counter()
            return 0
        row = totals[name]
        row[0] += time.perf_counter() - started.pop(name)
        row[1] += 1
        row[2] += sum(_nbytes(a) for a in args)
        if kind_of(name) == "dense":
            row[3] += _dense_flops(args)
        return 0

    vm.set_instrument(instrument)
    try:
        call()
    finally:
        vm.set_instrument(lambda *_: 0)
    return dict(totals)


def dense_roof(dtype, repeat=3):
    """GFLOP/s of PyTorch's 2048^3 matmul at ``dtype`` (best of ``repeat``)."""
    import torch

    a, b = torch.randn(2048, 2048).to(dtype), torch.randn(2048, 2048).to(dtype)
    best = float("inf")
    for _ in range(repeat + 1):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * 2048 ** 3 / best / 1e9


def measure(model_name, dtype_name, prompt, rounds):
    """One precision: first-token times of each path in interleaved rounds, and our kernel split."""
    import copy

    import torch

    import scanweaver_tvm as sw
    from scanweaver_tvm.causal_lm import torch_kernels

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    model = model_of(model_name).eval().to(dtype)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(1))
    start = time.perf_counter()
    lm = sw.compile_causal_lm(model)
    lm.module()
    compile_s = time.perf_counter() - start

    def eager():
        with torch.no_grad(), torch_kernels():
            return model(ids, use_cache=False).logits[:, -1]

    paths = {"ours": lambda: lm.prefill(ids.numpy()), "eager": eager}
    with torch_kernels():
        fp32 = logits_module(copy.deepcopy(model).float(), last=True)
        openvino, ov_precision = compile_openvino(fp32, (ids,),
                                                  ("f32" if dtype_name == "float32" else None,)).popitem()[1]
    if openvino is not None:
        paths["openvino"] = openvino
    times = {name: [] for name in paths}
    for fn in paths.values():
        fn()                                                   # (warm: first calls allocate)
    for r in range(rounds):
        names = list(paths)
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            paths[name]()
            times[name].append(time.perf_counter() - start)
    split = kernel_split(lm._build(1)[1], paths["ours"])     # pylint: disable=protected-access
    return {"dtype": dtype_name, "compile_s": compile_s, "seconds": times,
            "median_ms": {k: 1e3 * statistics.median(v) for k, v in times.items()},
            "openvino_precision": ov_precision, "kernels": split,
            "dense_roof_GFLOPs": dense_roof(dtype), "copy_GBps": copy_bandwidth() / 1e9}


def kind_table(result):
    """Rows per kind: ms, share, calls, what it attains and the reference it is held to."""
    by_kind = {k: [0.0, 0, 0, 0] for k in KINDS}
    for name, (s, calls, nbytes, flops) in result["kernels"].items():
        row = by_kind[kind_of(name)]
        row[0], row[1], row[2], row[3] = row[0] + s, row[1] + calls, row[2] + nbytes, row[3] + flops
    total = sum(r[0] for r in by_kind.values())
    lines = ["| kind | ms | share | calls | attains | held to | ratio |", "|---|---|---|---|---|---|---|"]
    for kind, (s, calls, nbytes, flops) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        if not calls:
            continue
        if kind == "dense":
            got, roof, unit = flops / s / 1e9, result["dense_roof_GFLOPs"], "GFLOP/s"
        elif kind == "vm":
            got, roof, unit = None, None, ""
        else:
            got, roof, unit = nbytes / s / 1e9, result["copy_GBps"], "GB/s"
        cells = ("-", "-", "-") if got is None else (f"{got:.0f} {unit}", f"{roof:.0f} {unit}", f"{got / roof:.0%}")
        lines.append(f"| {kind} | {1e3 * s:.1f} | {s / total:.0%} | {calls} | " + " | ".join(cells) + " |")
    top = sorted(result["kernels"].items(), key=lambda kv: -kv[1][0])[:8]
    lines += ["", "Slowest kernels: " + "; ".join(
        f"`{name[:60]}` ({kind_of(name)}) {1e3 * s:.1f} ms / {calls}" for name, (s, calls, _, _) in top) + "."]
    return lines, total


def main(argv=None):
    import torch

    from .scan import _machine

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3_5", choices=["qwen3_5", "mamba"])
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out_prefill_kernels"))
    args = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    machine = _machine()
    results = [measure(args.model, d, args.prompt, args.rounds) for d in args.dtypes.split(",")]
    lines = [f"# First token of {args.model} at a real width, prompt {args.prompt}: ours, eager, OpenVINO; where "
             "our time goes", "",
             f"{machine['cpu']}, {machine['cores']} cores, features {', '.join(machine['features'])}; medians of "
             f"{args.rounds} interleaved rounds. OpenVINO converts the float32 model and runs at the precision in "
             "brackets (its default for a bf16 row).", "",
             "| precision | ours ms | eager ms | OpenVINO ms | ours vs eager | ours vs OpenVINO |", "|---|---|---|---|---|---|"]
    for r in results:
        med = r["median_ms"]
        ov = med.get("openvino")
        lines.append(f"| {r['dtype']} | {med['ours']:.0f} | {med['eager']:.0f} | "
                     + (f"{ov:.0f} [{r['openvino_precision']}]" if ov else r["openvino_precision"])
                     + f" | {med['eager'] / med['ours']:.2f}x | " + (f"{ov / med['ours']:.2f}x |" if ov else "- |"))
    for r in results:
        table, total = kind_table(r)
        lines += ["", f"## Our {r['dtype']} prefill by kernel kind ({1e3 * total:.0f} ms timed call by call; "
                  f"held to: dense {r['dense_roof_GFLOPs']:.0f} GFLOP/s (PyTorch 2048^3), memory "
                  f"{r['copy_GBps']:.1f} GB/s (copy))", "", *table]
    print("\n".join(lines))
    outputs.write(args.out, f"prefill_kernels_{args.model}", {"machine": machine, "model": args.model,
                                                              "prompt": args.prompt, "results": results},
                  "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
