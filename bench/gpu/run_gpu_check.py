"""Check and time prepared CUDA scan kernels on a GPU machine that has torch but not TVM.

    python bench/gpu/run_gpu_check.py ARTIFACT_DIR [--json results.json] [--budget 2]
    python bench/gpu/run_gpu_check.py --example DIR      # write hand-written example artifacts

Every ``*.json`` manifest in ARTIFACT_DIR (format: bench/gpu/README.md) is loaded, its inputs
generated on the device, its launches run (cupy.RawModule when cupy is installed, else a
ctypes driver + NVRTC), its outputs checked against a float64 torch reference, and its time
compared with a PyTorch loop and the device copy-bandwidth floor.  Needs only torch + numpy
(cupy optional); imports nothing from this repository.
"""
import argparse
import ctypes
import glob
import json
import math
import os
import re
import statistics
import sys
import time

import numpy as np
import torch

FORMAT = "scanweaver-gpu/1"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64, "int32": torch.int32, "int64": torch.int64}
TOL = {"float32": 2e-4, "float16": 2e-2, "bfloat16": 1e-1}
SCALARS = {"int32": np.int32, "int64": np.int64, "float32": np.float32, "uint32": np.uint32}


# ---------------------------------------------------------------- scans in torch

def plain_scan(a, b, h0=None, axis=-1, reverse=False):
    """All states of h_t = a_t*h_{t-1} + b_t along ``axis``, in b's dtype (a broadcasts)."""
    a = torch.broadcast_to(a, b.shape).movedim(axis, -1)
    b = b.movedim(axis, -1)
    out = torch.empty_like(b)
    h = torch.zeros_like(b[..., 0]) if h0 is None else h0.to(b.dtype)
    for t in (range(b.shape[-1] - 1, -1, -1) if reverse else range(b.shape[-1])):
        h = torch.addcmul(b[..., t], a[..., t], h)
        out[..., t] = h
    return out.movedim(-1, axis)


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   h0=None):
    """Mamba's ``selective_scan_ref`` in the inputs' dtype: returns (out, last_state)."""
    F = torch.nn.functional
    dt = delta if delta_bias is None else delta + delta_bias[:, None].to(delta.dtype)
    dt = F.softplus(dt) if delta_softplus else dt
    A = A.to(u.dtype)
    deltaA = torch.exp(torch.einsum("bdl,dn->bdln", dt, A))
    if B.dim() == 3:
        deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", dt, B, u)
    else:  # groups: (B,G,N,L) -> (B,D,N,L)
        B, C = (x.repeat_interleave(u.shape[1] // x.shape[1], dim=1) for x in (B, C))
        deltaB_u = torch.einsum("bdl,bdnl,bdl->bdln", dt, B, u)
    h = u.new_zeros(u.shape[0], u.shape[1], A.shape[1]) if h0 is None else h0.to(u.dtype)
    ys = []
    for i in range(u.shape[2]):
        h = deltaA[:, :, i] * h + deltaB_u[:, :, i]
        ys.append(torch.einsum("bdn,bn->bd", h, C[:, :, i]) if C.dim() == 3
                  else torch.einsum("bdn,bdn->bd", h, C[:, :, :, i]))
    out = torch.stack(ys, dim=2)
    out = out if D is None else out + u * D[:, None].to(u.dtype)
    out = out if z is None else out * F.silu(z)
    return out, h


# ---------------------------------------------------------------- inputs and reference

def make_inputs(m, dev, seed=0):
    """Device tensors for every buffer: inputs drawn like bench.anchors, outputs/scratch zero."""
    g = torch.Generator(device=dev).manual_seed(seed)
    spec, bufs = m["spec"], {}
    for buf in m["buffers"]:
        name, shape, dtype = buf["name"], tuple(buf["shape"]), DTYPES[buf["dtype"]]
        f32 = dict(device=dev, dtype=torch.float32, generator=g)
        if buf["role"] != "input":
            x = torch.zeros(shape, device=dev, dtype=dtype)
        elif name == "a":
            x = 0.8 + 0.2 * torch.rand(shape, **f32)
        elif name == "A":
            x = -torch.arange(1, shape[1] + 1, device=dev, dtype=torch.float32).expand(shape)
        elif name == "delta":
            x = 0.5 * torch.randn(shape, **f32)
        elif name == "delta_bias":
            x = math.log(math.expm1(0.01)) + torch.rand(shape, **f32)
        else:
            x = torch.randn(shape, **f32)
        bufs[name] = x.to(dtype).contiguous()
    return bufs


def reference(m, bufs):
    """{output buffer name: float64 reference} for the manifest's kind and spec."""
    s, x = m["spec"], {k: v.double() for k, v in bufs.items()}
    if m["kind"] == "plain":
        a = x["a"].reshape(s["a_shape"])
        states = plain_scan(a, x["b"], x.get("h0"), s["axis"], s["reverse"])
        last = states.select(s["axis"], 0 if s["reverse"] else states.shape[s["axis"]] - 1)
        return {"states": states, "last": last}
    out, last = selective_scan(x["u"], x["delta"], x["A"], x["B"], x["C"], x.get("D"),
                               x.get("z"), x.get("delta_bias"), s["delta_softplus"], x.get("h0"))
    return {"out": out, "last_state": last}


def torch_loop(m, bufs):
    """The PyTorch eager baseline on the same (input-dtype) tensors."""
    s = m["spec"]
    if m["kind"] == "plain":
        a = bufs["a"].reshape(s["a_shape"])
        return lambda: plain_scan(a, bufs["b"], bufs.get("h0"), s["axis"], s["reverse"])
    args = [bufs.get(k) for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")]
    return lambda: selective_scan(*args, s["delta_softplus"], bufs.get("h0"))


# ---------------------------------------------------------------- launching

def _site_files(*parts):
    """Files matching ``nvidia/*/<parts>`` (the CUDA wheels) and ``<CUDA_HOME>/<parts>``."""
    roots = [os.path.join(p, "nvidia", "*") for p in sys.path if p] + [
        os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"]
    return [f for r in roots for f in sorted(glob.glob(os.path.join(r, *parts)))]


# Builtin integer types: what TVM's NVRTC preamble takes from <cuda/std/cstdint>.
_FREESTANDING = """typedef signed char int8_t; typedef unsigned char uint8_t;
typedef short int16_t; typedef unsigned short uint16_t; typedef int int32_t;
typedef unsigned int uint32_t; typedef long long int64_t; typedef unsigned long long uint64_t;
"""


def prepare_source(src, options=()):
    """TVM's CUDA source made NVRTC-ready: TVM's NVRTC branch includes libcu++ headers
    (<cuda/std/...>); add their include dir when one is installed (CUDA toolkit or the
    nvidia-cuda-cccl wheel), else swap that branch for builtin typedefs.  Returns (src, options)."""
    options = list(options)
    if "<cuda/std/" in src and not any(o.startswith("-I") for o in options):
        found = _site_files("include", "cuda", "std", "cstdint")
        if found:
            options.append("-I" + found[0].rsplit(os.sep + "cuda" + os.sep, 1)[0])
        else:
            src = re.sub(r"#ifdef __CUDACC_RTC__\n.*?\n#else", lambda _: "#ifdef __CUDACC_RTC__\n"
                         + _FREESTANDING + "#else", src, count=1, flags=re.S)
    return src, options


def nvrtc_compile(src, name="kernel.cu", options=(), arch=None):
    """CUDA source -> cubin with libnvrtc through ctypes (the wheel torch depends on, or the
    toolkit's).  ``arch``: (major, minor), default the current device's."""
    lib = None
    for cand in ["libnvrtc.so"] + [f for f in _site_files("lib", "libnvrtc.so*")
                                   if "builtins" not in f and ".alt." not in f]:
        try:
            lib = ctypes.CDLL(cand)
            break
        except OSError:
            pass
    if lib is None:
        raise RuntimeError("no libnvrtc found: install cupy or the nvidia-cuda-nvrtc wheel")
    major, minor = arch or torch.cuda.get_device_capability()
    opts = [f"--gpu-architecture=sm_{major}{minor}", *options]
    prog = ctypes.c_void_p()
    lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None)
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(
        *[o.encode() for o in opts]))
    size = ctypes.c_size_t()
    if rc:
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(f"NVRTC failed on {name}:\n{log.value.decode()}")
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return cubin.raw


def _read_source(path, options):
    with open(path) as f:
        return prepare_source(f.read(), options)


class CupyLauncher:
    """cupy.RawModule: compiles .cu with NVRTC, loads .ptx/.cubin; launches on torch's stream."""

    def __init__(self, path, names, options=()):
        import cupy as cp
        self.cp = cp
        if path.endswith(".cu"):
            src, options = _read_source(path, options)
            mod = cp.RawModule(code=src, options=tuple(options))
        else:
            mod = cp.RawModule(path=path)
        self.funcs = {n: mod.get_function(n) for n in names}

    def launch(self, name, grid, block, shmem, args):
        cp, f = self.cp, self.funcs[name]
        if shmem > 48 * 1024:
            f.max_dynamic_shared_size_bytes = shmem
        vals = [cp.from_dlpack(a) if isinstance(a, torch.Tensor) else a for a in args]
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            f(tuple(grid), tuple(block), tuple(vals), shared_mem=shmem)


class DriverLauncher:
    """Fallback without cupy: libcuda through ctypes, in torch's primary context; .cu sources
    go through ``nvrtc_compile``."""

    def __init__(self, path, names, options=()):
        torch.zeros(1, device="cuda")  # makes torch's primary context current
        self.cu = ctypes.CDLL("libcuda.so.1")
        if path.endswith(".cu"):
            src, opts = _read_source(path, options)
            image = nvrtc_compile(src, path, opts)
        else:
            with open(path, "rb") as f:
                image = f.read() + (b"\0" if path.endswith(".ptx") else b"")
        self._image = ctypes.create_string_buffer(image, len(image))
        mod = ctypes.c_void_p()
        self._check(self.cu.cuModuleLoadData(ctypes.byref(mod), self._image), "cuModuleLoadData")
        self.funcs = {}
        for n in names:
            f = ctypes.c_void_p()
            self._check(self.cu.cuModuleGetFunction(ctypes.byref(f), mod, n.encode()), n)
            self.funcs[n] = f

    def _check(self, rc, what):
        if rc:
            raise RuntimeError(f"{what}: CUresult {rc}")

    def launch(self, name, grid, block, shmem, args):
        f = self.funcs[name]
        if shmem > 48 * 1024:  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            self._check(self.cu.cuFuncSetAttribute(f, 8, ctypes.c_int(shmem)), "shared memory")
        vals = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor)
                else np.ctypeslib.as_ctypes_type(a.dtype)(a.item()) for a in args]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self._check(self.cu.cuLaunchKernel(f, *map(ctypes.c_uint, grid), *map(ctypes.c_uint, block),
                                           ctypes.c_uint(shmem), stream, params, None), name)


def launcher(path, names, options=()):
    try:
        import cupy  # noqa: F401
        return CupyLauncher(path, names, options)
    except ImportError:
        return DriverLauncher(path, names, options)


def _arg(a, bufs):
    """A launch argument: a buffer name -> its tensor; ``{"int32": 5}`` -> np.int32(5)."""
    if isinstance(a, str):
        return bufs[a]
    (dtype, value), = a.items()
    return SCALARS[dtype](value)


def runner(m, bufs, lib):
    """One run of the manifest: zero the scratch buffers, then every launch in order."""
    scratch = [bufs[b["name"]] for b in m["buffers"] if b["role"] == "scratch"]
    launches = [(ln["kernel"], ln["grid"], ln["block"], ln.get("shared_mem_bytes", 0),
                 [_arg(a, bufs) for a in ln["args"]]) for ln in m["launches"]]

    def run():
        for s in scratch:
            s.zero_()
        for launch in launches:
            lib.launch(*launch)
    return run


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


# ---------------------------------------------------------------- example artifacts

EXAMPLE_CU = r"""
extern "C" __global__ void plain_naive(const float* __restrict__ a, const float* __restrict__ b,
                                       float* __restrict__ states, int lanes, int L) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= lanes) return;
  float h = 0.f;
  for (int t = 0; t < L; ++t) { h = fmaf(a[(long)i * L + t], h, b[(long)i * L + t]); states[(long)i * L + t] = h; }
}
extern "C" __global__ void selective_naive(const float* u, const float* delta, const float* A,
    const float* B, const float* C, const float* D, const float* z, const float* bias,
    float* out, int batch, int dim, int L, int N) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= batch * dim) return;
  int bi = i / dim, d = i % dim;
  float h[16] = {0.f};  // N <= 16
  for (int t = 0; t < L; ++t) {
    long k = (long)i * L + t;
    float dt = delta[k] + bias[d];
    dt = dt <= 20.f ? log1pf(expf(dt)) : dt;
    float y = 0.f;
    for (int n = 0; n < N; ++n) {
      long j = ((long)bi * N + n) * L + t;
      h[n] = expf(dt * A[d * N + n]) * h[n] + dt * B[j] * u[k];
      y += C[j] * h[n];
    }
    out[k] = (y + D[d] * u[k]) * z[k] / (1.f + expf(-z[k]));
  }
}
"""


def write_examples(folder, batch=1, dim=1536, length=1024, dstate=16):
    """Hand-written naive kernels (one thread per lane) with their manifests: a test of this
    runner before the TVM preparer exists, and a worked example of the format."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "naive.cu"), "w") as f:
        f.write(EXAMPLE_CU)
    bdl, bnl, lanes = [batch, dim, length], [batch, dstate, length], batch * dim
    buf = lambda name, role, shape: {"name": name, "role": role, "shape": shape, "dtype": "float32"}
    grid = [-(-lanes // 128), 1, 1]
    plain = {
        "format": FORMAT, "name": f"plain_naive_{batch}x{dim}x{length}", "kind": "plain",
        "spec": {"shape": bdl, "a_shape": bdl, "axis": 2, "reverse": False, "has_h0": False,
                 "dtype": "float32", "outputs": ["states"]},
        "source": "naive.cu",
        "buffers": [buf("a", "input", bdl), buf("b", "input", bdl), buf("states", "output", bdl)],
        "launches": [{"kernel": "plain_naive", "grid": grid, "block": [128, 1, 1],
                      "shared_mem_bytes": 0,
                      "args": ["a", "b", "states", {"int32": lanes}, {"int32": length}]}],
    }
    selective = {
        "format": FORMAT, "name": f"selective_naive_{batch}x{dim}x{length}x{dstate}",
        "kind": "selective",
        "spec": {"batch": batch, "dim": dim, "length": length, "dstate": dstate, "groups": 0,
                 "has_D": True, "has_z": True, "has_delta_bias": True, "delta_softplus": True,
                 "has_h0": False, "dtype": "float32", "return_last_state": False},
        "source": "naive.cu",
        "buffers": [buf("u", "input", bdl), buf("delta", "input", bdl),
                    buf("A", "input", [dim, dstate]), buf("B", "input", bnl),
                    buf("C", "input", bnl), buf("D", "input", [dim]), buf("z", "input", bdl),
                    buf("delta_bias", "input", [dim]), buf("out", "output", bdl)],
        "launches": [{"kernel": "selective_naive", "grid": grid, "block": [128, 1, 1],
                      "shared_mem_bytes": 0,
                      "args": ["u", "delta", "A", "B", "C", "D", "z", "delta_bias", "out",
                               {"int32": batch}, {"int32": dim}, {"int32": length},
                               {"int32": dstate}]}],
    }
    for m in (plain, selective):
        with open(os.path.join(folder, m["name"] + ".json"), "w") as f:
            json.dump(m, f, indent=1)
    print(f"wrote naive.cu and 2 manifests to {folder}")


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
