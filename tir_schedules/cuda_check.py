"""Check a GPU PrimFunc without a GPU: CUDA source from TVM, PTX from nvcc, resources from ptxas.

This is how GPU realizations are verified on a CPU machine (with ``emulate.py`` for results).
"""
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm.support import nvcc

SM90 = {"kind": "cuda", "arch": "sm_90"}


@dataclass(frozen=True)
class PtxasReport:
    """What ``ptxas -v`` says about each kernel of a PTX file."""

    registers: int          # the most any kernel uses
    spill_stores: int
    spill_loads: int
    shared_bytes: int       # the most static shared memory any kernel uses
    text: str


def cuda_source(func, target=SM90):
    """Build a PrimFunc for CUDA and return the generated CUDA C source."""
    target = tvm.target.Target(target)
    ex = tvm.compile(tvm.IRModule({func.attrs["global_symbol"]: func}), target=target)
    return "\n".join(module_cuda_sources(ex.mod))


def _device_texts(module):
    """What every ``cuda`` module imported (at any depth) by ``module`` shows as its source."""
    found = [module.inspect_source()] if module.kind == "cuda" else []
    for sub in module.imports:
        found.extend(_device_texts(sub))
    return found


def _is_ptx(text):
    """PTX (a device module built from PTX, e.g. the MLIR realization's) rather than CUDA C."""
    return any(line.startswith(".version ") for line in text.splitlines()[:40])


def module_cuda_sources(module):
    """CUDA C of every ``cuda`` module imported (at any depth) by a built module/executable."""
    return [t for t in _device_texts(module) if not _is_ptx(t)]


def module_ptx(module):
    """PTX of every device module built from PTX (not CUDA C) in a module/executable."""
    return [t for t in _device_texts(module) if _is_ptx(t)]


def ptx(source, arch="sm_90"):
    """Compile CUDA C to PTX with nvcc (TVM's own wrapper, which also wants a current CUDA
    target even when ``arch`` is given)."""
    if shutil.which("nvcc") is None:
        raise RuntimeError("nvcc not found on PATH: install the CUDA toolkit to build GPU code")
    with tvm.target.Target({"kind": "cuda", "arch": arch}):
        out = nvcc.compile_cuda(source, target_format="ptx", arch=arch, compiler="nvcc")
    return bytes(out).decode() if not isinstance(out, str) else out


def ptxas(ptx_text, arch="sm_90"):
    """Assemble PTX with ``ptxas -v`` and parse its resource report."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "kernel.ptx"
        path.write_text(ptx_text)
        proc = subprocess.run(["ptxas", "-v", f"-arch={arch}", str(path), "-o", str(Path(d) / "k.cubin")],
                              capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"ptxas rejected the PTX:\n{proc.stderr}")
    text = proc.stderr

    def most(pattern):
        return max((int(x) for x in re.findall(pattern, text)), default=0)

    if not re.search(r"Used \d+ registers", text) or not re.search(r"bytes spill stores", text):
        raise RuntimeError(f"ptxas -v printed no resource report that could be read (a new ptxas "
                           f"format?); not reading it as 0 registers and 0 spills:\n{text[:2000]}")

    return PtxasReport(most(r"Used (\d+) registers"), most(r"(\d+) bytes spill stores"),
                       most(r"(\d+) bytes spill loads"), most(r"(\d+) bytes smem"), text)


def check_kernel(func, target=SM90):
    """Source, PTX and ptxas report of a GPU PrimFunc."""
    src = cuda_source(func, target)
    arch = str(tvm.target.Target(target).arch)
    text = ptx(src, arch)
    return src, text, ptxas(text, arch)
