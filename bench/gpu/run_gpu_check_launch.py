"""How ``run_gpu_check.py`` loads and launches a manifest's kernels on the GPU machine: TVM's CUDA
source made NVRTC-ready, then cupy.RawModule when cupy is installed, else libcuda and libnvrtc
through ctypes; and one run of a manifest's launches in order.  Needs only torch + numpy."""
import ctypes
import glob
import os
import re
import sys

import numpy as np
import torch

SCALARS = {"int32": np.int32, "int64": np.int64, "float32": np.float32, "uint32": np.uint32}


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
