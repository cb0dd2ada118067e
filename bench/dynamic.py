"""Length-generic vs fixed-length import of HF Mamba at the real width, measured in one run.

    python -m bench.dynamic [--layers 2 24] [--lengths 256 1024] [--fixed-lengths 256 1024]
                            [--fixed-timeout 1200] [--no-generic] [--out bench/out_dynamic]

For each layer count: the length-generic route (``sw.from_torch(..., dynamic_shapes=...)``
with L symbolic: traced at three short lengths, fused, generalized) imported and compiled once,
then run at every L; and the fixed-length route (``sw.from_torch`` at that L, as before) at
each L, in a child process that is stopped after ``--fixed-timeout`` seconds (reported as not
finished, never extrapolated).  Every run is checked against PyTorch.  Run times are medians
of repeated calls after a warm-up.  Writes ``dynamic.json`` (after every row; a later run adds
its rows to it) and ``dynamic.md``.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from . import rel_err, time_ms
from .models_runners import vm_runner
from .models_zoo import hf_mamba


def log(msg):
    print(f"[bench.dynamic {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _run_ms(ex, ids, want):
    run, _, _ = vm_runner(ex, [ids])
    err = rel_err(run()[0].numpy(), want)
    return time_ms(run, warmup=1, repeats=5, budget_s=20.0, stats=True), err


def _want(model, ids):
    import torch

    with torch.no_grad():
        return model(ids).numpy()


def generic(layers, lengths):
    import torch

    import scanweaver_tvm as sw

    model, inputs = hf_mamba(8, layers)
    t0 = time.perf_counter()
    mod = sw.from_torch(model, inputs, dynamic_shapes=({1: torch.export.Dim("L")},))
    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    ex = sw.compile(mod, "llvm")
    t_compile = time.perf_counter() - t0
    log(f"generic, {layers} layers: import {t_import:.1f} s, compile {t_compile:.1f} s")
    runs = {}
    for length in lengths:
        ids = torch.randint(0, model.lm.config.vocab_size, (1, length),
                            generator=torch.Generator().manual_seed(length))
        timing, err = _run_ms(ex, ids, _want(model, ids))
        runs[length] = {**timing, "rel_err": err}
        log(f"  L={length}: {timing['ms']:.1f} ms (rel err {err:.1e})")
    return {"import_s": t_import, "compile_s": t_compile, "runs": runs}


def fixed_child(layers, length):
    """One fixed-length import + compile + run (in the child process); prints its JSON."""
    import scanweaver_tvm as sw

    model, inputs = hf_mamba(length, layers)
    t0 = time.perf_counter()
    mod = sw.from_torch(model, inputs)
    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    ex = sw.compile(mod, "llvm")
    t_compile = time.perf_counter() - t0
    timing, err = _run_ms(ex, inputs[0], _want(model, inputs[0]))
    print(json.dumps({"import_s": t_import, "compile_s": t_compile, **timing, "rel_err": err}))


def fixed(layers, length, timeout_s):
    cmd = [sys.executable, "-m", "bench.dynamic", "--fixed-child", str(layers), str(length)]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=True)
    except subprocess.TimeoutExpired:
        log(f"fixed, {layers} layers, L={length}: not finished in {timeout_s} s")
        return {"finished": False, "timeout_s": timeout_s}
    except subprocess.CalledProcessError as err:
        return {"finished": False, "error": err.stderr.strip().splitlines()[-1:]}
    row = json.loads(out.stdout.strip().splitlines()[-1])
    log(f"fixed, {layers} layers, L={length}: import {row['import_s']:.1f} s, compile "
        f"{row['compile_s']:.1f} s, run {row['ms']:.1f} ms ({time.perf_counter() - t0:.0f} s in all)")
    return {"finished": True, **row}


def _markdown(result):
    lengths = sorted({int(n) for row in result["rows"].values()
                      for n in [*row.get("generic", {}).get("runs", {}), *row.get("fixed", {})]})
    lines = ["| layers | route | import s | compile s | " + " | ".join(f"run ms at L={n}" for n in lengths)
             + " | generic / fixed run |", "|---|---|---|---|" + "---|" * (len(lengths) + 1)]
    for layers, row in sorted(result["rows"].items(), key=lambda kv: int(kv[0])):
        g = row.get("generic")
        if g:
            lines.append(f"| {layers} | length-generic (once) | {g['import_s']:.1f} | {g['compile_s']:.1f} | "
                         + " | ".join(f"{g['runs'][str(n)]['ms']:.1f}" if str(n) in g["runs"] else ""
                                      for n in lengths) + " | |")
        for n in lengths:
            f = row.get("fixed", {}).get(str(n))
            if f is None:
                continue
            if not f["finished"]:
                why = (f"not finished in {f['timeout_s'] / 60:.0f} min" if "timeout_s" in f
                       else f"failed: {f['error']}")
                lines.append(f"| {layers} | fixed L={n} | {why} | |" + " |" * (len(lengths) + 1))
                continue
            cells = [f"{f['ms']:.1f}" if m == n else "" for m in lengths]
            ratio = (f"{g['runs'][str(n)]['ms'] / f['ms']:.2f}" if g and str(n) in g["runs"] else "")
            lines.append(f"| {layers} | fixed L={n} | {f['import_s']:.1f} | {f['compile_s']:.1f} | "
                         + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, nargs="+", default=[2, 24])
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024],
                   help="lengths the length-generic executable runs at")
    p.add_argument("--fixed-lengths", type=int, nargs="*", default=None,
                   help="lengths imported through the fixed-length route (default: --lengths)")
    p.add_argument("--fixed-timeout", type=int, default=1200)
    p.add_argument("--no-generic", action="store_true", help="only the fixed-length route")
    p.add_argument("--out", default="bench/out_dynamic")
    p.add_argument("--fixed-child", type=int, nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.fixed_child:
        fixed_child(*args.fixed_child)
        return 0
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "dynamic.json")
    result = {"rows": {}}
    if os.path.exists(path):          # runs add to what earlier runs measured
        with open(path) as f:
            result = json.load(f)

    def save():
        with open(path, "w") as f:
            json.dump(result, f, indent=1)

    fixed_lengths = args.lengths if args.fixed_lengths is None else args.fixed_lengths
    for layers in args.layers:
        row = result["rows"].setdefault(str(layers), {"fixed": {}})
        if not args.no_generic:
            row["generic"] = generic(layers, args.lengths)
            row["generic"]["runs"] = {str(k): v for k, v in row["generic"]["runs"].items()}
            save()
        for length in fixed_lengths:
            row.setdefault("fixed", {})[str(length)] = fixed(layers, length, args.fixed_timeout)
            save()
    with open(os.path.join(args.out, "dynamic.md"), "w") as f:
        f.write(_markdown(result))
    print(_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
