"""Build every CUDA realization here (no GPU needed) and write artifacts for run_gpu_check.py.

    python -m bench.gpu.prepare [--out bench/gpu/artifacts] [--quick]

One ``NAME.cu`` (TVM's CUDA source) + ``NAME.json`` (format ``scanweaver-gpu/1``, see
README.md) per (realization, shape); for the MLIR realization ``NAME.ptx`` + ``NAME.json``.  Launch geometry and scratch buffers are read off the
PrimFunc; argument order off each kernel's C signature.  The selective shape is also written
for ``matrix_gpu``, Mamba-1 as the matrix scan it is on the same bytes
(``SelectiveScanSpec.as_matrix``): a ``selective`` manifest whose buffers keep the selective
names and shapes, so the GPU run checks and times it next to ``selective_gpu``.
"""
import argparse
import dataclasses
import json
import re
from pathlib import Path

import tvm_ffi
from tvm import tirx

import tir_schedules
from scanweaver_core.spec import SELECTIVE_AS_MATRIX, AffineScanSpec, SelectiveScanSpec
from tir_schedules import cuda_check

from ..scan import PLAIN_SHAPE, SELECTIVE_SHAPE, SWEEP

KERNEL_RE = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(([^)]*)\)\s*\{')


def _launch_extents(func):
    """[(grid_x, block_x)] per kernel launch, in program order."""
    found = []
    tvm_ffi.structural_walk(func.body, lambda x: found.append(x) if isinstance(x, tirx.AttrStmt)
                            and x.attr_key == "thread_extent" else None)
    launches, block = [], None
    for attr in found:  # post-order: a kernel's threadIdx comes before its blockIdx
        tag, extent = attr.node.thread_tag, int(attr.value)
        if tag == "threadIdx.x":
            block = extent
        elif tag == "blockIdx.x":
            launches.append((extent, block))
    return launches


def _scratch(func):
    found = []
    tvm_ffi.structural_walk(func.body, lambda x: found.append(x.buffer) if isinstance(x, tirx.AllocBuffer)
                            and x.buffer.scope() == "global" else None)
    return [{"name": b.name, "role": "scratch", "shape": [int(n) for n in b.shape], "dtype": str(b.dtype)}
            for b in found]


def _buffers(spec, func):
    if isinstance(spec, AffineScanSpec):
        shapes = {"a": spec.a_shape, "b": spec.shape, "h0": spec.state_shape,
                  "states": spec.shape, "last": spec.state_shape}
        f32 = ()
    else:
        shapes = {"u": (spec.batch, spec.dim, spec.length), "delta": (spec.batch, spec.dim, spec.length),
                  "A": (spec.dim, spec.dstate), "B": spec.bc_shape, "C": spec.bc_shape, "D": (spec.dim,),
                  "z": (spec.batch, spec.dim, spec.length), "delta_bias": (spec.dim,),
                  "h0": (spec.batch, spec.dim, spec.dstate), "out": (spec.batch, spec.dim, spec.length),
                  "last_state": (spec.batch, spec.dim, spec.dstate)}
        f32 = ("A", "D", "delta_bias")
    outputs = {"states", "last", "out", "last_state"}
    params = [p.name for p in func.params]
    return [{"name": n, "role": "output" if n in outputs else "input", "shape": list(shapes[n]),
             "dtype": "float32" if n in f32 else spec.dtype} for n in params] + _scratch(func)


def artifact(spec, realization, out_dir, name):
    """Write ``name.cu`` and ``name.json`` for one realization of ``spec``.  A matrix
    realization of a ``SelectiveScanSpec`` is generated for ``spec.as_matrix()`` and
    re-declared on the selective buffers (``instance.retarget``); its kernel's parameters keep
    the matrix names, read back through ``SELECTIVE_AS_MATRIX``."""
    borrowed = tir_schedules.REALIZATIONS[realization].FORM == "matrix" and \
        isinstance(spec, SelectiveScanSpec)
    config = tir_schedules.REALIZATIONS[realization].default_config(
        spec.as_matrix() if borrowed else spec)
    func = tir_schedules.realize(spec, "cuda", schedule=realization)
    rename = {m: s for s, m in SELECTIVE_AS_MATRIX.items()} if borrowed else {}
    source = cuda_check.cuda_source(func)
    buffers = _buffers(spec, func)
    known = {b["name"] for b in buffers}
    kernels = KERNEL_RE.findall(source)
    extents = _launch_extents(func)
    if len(kernels) != len(extents):
        raise RuntimeError(f"{name}: {len(kernels)} kernels in the source, {len(extents)} launches in the TIR")
    launches = []
    for (symbol, params), (grid, block) in zip(kernels, extents):
        args = []
        for p in filter(None, (s.strip() for s in params.split(","))):
            pname = p.split()[-1].removesuffix("_ptr").removesuffix("_view")
            pname = rename.get(pname, pname)
            if pname not in known:
                raise RuntimeError(f"{name}: kernel {symbol} parameter {p!r} is not a known buffer")
            args.append(pname)
        launches.append({"kernel": symbol, "grid": [grid, 1, 1], "block": [block, 1, 1],
                         "shared_mem_bytes": 0, "args": args})
    kind = "plain" if isinstance(spec, AffineScanSpec) else "selective"
    spec_json = json.loads(json.dumps(dataclasses.asdict(spec)))
    manifest = {"format": "scanweaver-gpu/1", "name": name, "kind": kind, "spec": spec_json,
                "source": f"{name}.cu", "buffers": buffers, "launches": launches,
                "config": {"realization": realization, **config}}
    (out_dir / f"{name}.cu").write_text(source)
    (out_dir / f"{name}.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def mlir_artifact(spec, out_dir, name, arch="sm_90"):
    """Write ``name.ptx`` and ``name.json`` for the MLIR realization of ``spec`` (the PTX that
    ``sw.compile(..., realization="mlir")`` puts in a CUDA executable)."""
    import mlir_bridge
    from mlir_bridge.operands import operands

    art = mlir_bridge.cuda_ptx(spec, arch=arch)
    f32 = ("A", "D", "delta_bias")
    buffers = [{"name": n, "role": "output" if is_out else "input", "shape": list(shape),
                "dtype": "float32" if n in f32 else spec.dtype} for n, shape, _, is_out in operands(spec)]
    launches = []
    for k in art.kernels:
        if any(kind != "ptr" for kind, _ in k.params):
            raise RuntimeError(f"{name}: kernel {k.name} takes scalars; static shapes only here")
        launches.append({"kernel": k.name, "grid": list(k.grid({"L": spec.length})),
                         "block": list(k.block), "shared_mem_bytes": 0,
                         "args": [operand for _, operand in k.params]})
    kind = "plain" if isinstance(spec, AffineScanSpec) else "selective"
    manifest = {"format": "scanweaver-gpu/1", "name": name, "kind": kind,
                "spec": json.loads(json.dumps(dataclasses.asdict(spec))), "source": f"{name}.ptx",
                "buffers": buffers, "launches": launches,
                "config": {"realization": "mlir", "ptxas": art.ptxas}}
    (out_dir / f"{name}.ptx").write_text(art.ptx)
    (out_dir / f"{name}.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/gpu/artifacts")
    parser.add_argument("--quick", action="store_true", help="one small plain and selective shape")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plain = [(1, 64, 256)] if args.quick else [PLAIN_SHAPE] + [(1, d, l) for d, l in SWEEP]
    b, d, l, n = (1, 64, 256, 16) if args.quick else SELECTIVE_SHAPE
    gpu_plain = [k for k, m in tir_schedules.REALIZATIONS.items() if m.TARGET == "cuda" and m.FORM == "affine"]
    for shape in plain:
        spec = AffineScanSpec.create(shape)
        for r in gpu_plain:
            m = artifact(spec, r, out, f"plain_{r}_{'x'.join(map(str, shape))}")
            print(f"wrote {m['name']}: {len(m['launches'])} launch(es)")
    sel = SelectiveScanSpec(b, d, l, n, has_D=True, has_z=True, has_delta_bias=True, delta_softplus=True)
    m = artifact(sel, "selective_gpu", out, f"selective_{b}x{d}x{l}x{n}")
    print(f"wrote {m['name']}: {len(m['launches'])} launch(es)")
    m = artifact(sel, "matrix_gpu", out, f"selective_matrix_gpu_{b}x{d}x{l}x{n}")
    print(f"wrote {m['name']}: {len(m['launches'])} launch(es)")
    for shape in plain:
        m = mlir_artifact(AffineScanSpec.create(shape), out, f"plain_mlir_{'x'.join(map(str, shape))}")
        print(f"wrote {m['name']}: {len(m['launches'])} launch(es)")
    m = mlir_artifact(sel, out, f"selective_mlir_{b}x{d}x{l}x{n}")
    print(f"wrote {m['name']}: {len(m['launches'])} launch(es)")


if __name__ == "__main__":
    main()
