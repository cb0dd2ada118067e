"""Check and time prepared CUDA scan kernels on a GPU machine that has torch but not TVM.

    python bench/gpu/run_gpu_check.py ARTIFACT_DIR [--json results.json] [--budget 2]
    python bench/gpu/run_gpu_check.py --example DIR      # write hand-written example artifacts

Every ``*.json`` manifest in ARTIFACT_DIR (format: bench/gpu/README.md) is loaded, its inputs
generated on the device, its launches run (cupy.RawModule when cupy is installed, else a
ctypes driver + NVRTC), its outputs checked against a float64 torch reference, and its time
compared with a PyTorch loop and the device copy-bandwidth floor.  Needs only torch + numpy
(cupy optional); imports nothing from this repository but its ``run_gpu_check_*.py`` siblings
here (the manifest's inputs and reference, the launchers, the example artifacts): copy them with
it.
"""
import argparse
import glob
import json
import os
import statistics
import sys
import time

import torch

if __package__:             # python -m bench.gpu.run_gpu_check
    from .run_gpu_check_examples import write_examples
    from .run_gpu_check_launch import launcher, runner
    from .run_gpu_check_manifest import FORMAT, make_inputs, reference, torch_loop
else:                       # python bench/gpu/run_gpu_check.py: its folder is on sys.path
    from run_gpu_check_examples import write_examples
    from run_gpu_check_launch import launcher, runner
    from run_gpu_check_manifest import FORMAT, make_inputs, reference, torch_loop

TOL = {"float32": 2e-4, "float16": 2e-2, "bfloat16": 1e-1}


# ---------------------------------------------------------------- timing and report

def time_cuda_ms(fn, warmup=2, repeats=20, budget_s=2.0):
    """Median device time of ``fn()`` in ms (CUDA events around each call)."""
    for _ in range(warmup):
        fn()
    times, start = [], time.perf_counter()
    while len(times) < repeats and (len(times) < 3 or time.perf_counter() - start < budget_s):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def copy_bandwidth(nbytes=1 << 30):
    """Device copy bandwidth, bytes read + written per second."""
    src = torch.empty(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    return 2 * nbytes / (time_cuda_ms(lambda: dst.copy_(src), warmup=3) / 1e3)


def rel_err(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def _shape(m):
    s = m["spec"]
    return s["shape"] if m["kind"] == "plain" else [s[k] for k in ("batch", "dim", "length", "dstate")]


def check_one(path, bandwidth, budget_s, nvrtc_options):
    with open(path) as f:
        m = json.load(f)
    if m.get("format") != FORMAT:
        raise ValueError(f"{path}: format {m.get('format')!r}, expected {FORMAT!r}")
    row = {"name": m.get("name", os.path.basename(path)), "kind": m["kind"], "config": m.get("config"),
           "shape": _shape(m), "dtype": m["spec"].get("dtype", "float32")}
    bufs = make_inputs(m, "cuda")
    moved = sum(bufs[b["name"]].numel() * bufs[b["name"]].element_size()
                for b in m["buffers"] if b["role"] != "scratch")
    row["floor_ms"] = 1e3 * moved / bandwidth
    tol = m.get("tol", TOL.get(row["dtype"], 2e-4))
    try:
        source = os.path.join(os.path.dirname(path), m["source"])
        lib = launcher(source, sorted({ln["kernel"] for ln in m["launches"]}), nvrtc_options)
        run = runner(m, bufs, lib)
        run()
        torch.cuda.synchronize()
        ref = reference(m, bufs)
        outs = [b["name"] for b in m["buffers"] if b["role"] == "output"]
        row["rel_err"] = max(rel_err(bufs[o], ref[o]) for o in outs)
        row["ok"] = row["rel_err"] <= tol
        row["ours_ms"] = time_cuda_ms(run, budget_s=budget_s)
    except Exception as e:  # report and keep going with the next artifact
        row.update(ok=False, error=f"{type(e).__name__}: {e}")
    try:
        row["torch_ms"] = time_cuda_ms(torch_loop(m, bufs), warmup=1, repeats=5, budget_s=budget_s)
    except Exception as e:  # e.g. a faulting kernel above left the context unusable
        row.setdefault("error", f"torch loop: {type(e).__name__}: {e}")
    return row


def table(rows, bandwidth):
    head = ["artifact", "kind", "shape", "dtype", "check", "ours ms", "torch loop ms",
            "floor ms", "ours/floor", "speedup vs torch"]
    lines = [f"device copy bandwidth (read+write): {bandwidth / 1e9:.0f} GB/s",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ours, ref_ms = r.get("ours_ms"), r.get("torch_ms")
        check = (f"{'ok' if r['ok'] else 'FAIL'} {r['rel_err']:.1e}" if "rel_err" in r
                 else "ERROR")
        cells = [r["name"], r["kind"], "x".join(map(str, r["shape"])), r["dtype"], check,
                 f"{ours:.4f}" if ours else "—", f"{ref_ms:.3f}" if ref_ms else "—",
                 f"{r['floor_ms']:.4f}", f"{ours / r['floor_ms']:.2f}x" if ours else "—",
                 f"{ref_ms / ours:.1f}x" if ours and ref_ms else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [f"- {r['name']}: {r['error']}" for r in rows if "error" in r]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifacts", nargs="?", help="folder of *.json manifests + kernel files")
    p.add_argument("--example", metavar="DIR", help="write example artifacts to DIR and exit")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--budget", type=float, default=2.0, help="seconds of timing per method")
    p.add_argument("--nvrtc-opt", action="append", default=[],
                   help="extra NVRTC option for .cu sources, e.g. -I/usr/local/cuda/include")
    args = p.parse_args(argv)
    if args.example:
        write_examples(args.example)
        return 0
    if not args.artifacts:
        p.error("give an artifact folder (or --example DIR)")
    if not torch.cuda.is_available():
        print("no CUDA device visible to torch")
        return 2
    paths = sorted(glob.glob(os.path.join(args.artifacts, "*.json")))
    if not paths:
        print(f"no *.json manifests in {args.artifacts}")
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    bandwidth = copy_bandwidth()
    rows = []
    for path in paths:
        print(f"  {os.path.basename(path)} ...", flush=True)
        rows.append(check_one(path, bandwidth, args.budget, args.nvrtc_opt))
    print(table(rows, bandwidth))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "bandwidth": bandwidth,
                       "rows": rows}, f, indent=1)
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
