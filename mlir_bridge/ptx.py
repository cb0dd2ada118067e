"""PTX from the gpu stage (``--gpu-lower-to-nvvm-pipeline``), launch descriptions, ptxas report."""
import os
import re
import subprocess
import tempfile

from .artifacts import KernelInfo, PtxArtifact
from .tools import MlirError, cuda_root, mlir_opt, ptxas


def nvvm_pipeline(arch):
    return ("--gpu-lower-to-nvvm-pipeline=cubin-chip=" + arch + " cubin-features=+ptx80 cubin-format=isa "
            "opt-level=3 kernel-bare-ptr-calling-convention=1")


def extract_ptx(lowered):
    """The PTX in ``gpu.binary ... assembly = "..."``, unescaped (MLIR prints bytes as \\XX)."""
    match = re.search(r'assembly = "((?:[^"\\]|\\.)*)"', lowered)
    if not match:
        raise MlirError("no PTX assembly in the lowered gpu.binary")
    return re.sub(r"\\([0-9A-Fa-f]{2}|\\|\")",
                  lambda m: m.group(1) if m.group(1) in ("\\", '"') else chr(int(m.group(1), 16)),
                  match.group(1))


def ptxas_check(ptx_text, arch="sm_90"):
    """Per kernel: registers, spill stores/loads (bytes), shared memory bytes, from ptxas -v."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx_text)
        proc = subprocess.run([ptxas(), "-v", f"-arch={arch}", src, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise MlirError(f"ptxas rejected the PTX:\n{proc.stderr[:4000]}")
    report, current = {}, None
    for line in proc.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = report.setdefault(m.group(1), {"registers": 0, "spill_stores": 0,
                                                      "spill_loads": 0, "shared_bytes": 0})
        elif current is not None:
            if "spill stores" in line:
                current["spill_stores"], current["spill_loads"] = (int(x) for x in re.findall(r"(\d+) bytes spill", line))
            m = re.search(r"Used (\d+) registers", line)
            if m:
                current["registers"] = int(m.group(1))
            m = re.search(r"(\d+) bytes smem", line)
            if m:
                current["shared_bytes"] = int(m.group(1))
    unread = [k for k, r in report.items() if "Used" not in proc.stderr or r["registers"] == 0]
    if not report or unread:
        raise MlirError(f"ptxas -v printed no resource report that could be read for "
                        f"{unread or 'any kernel'} (a new ptxas format?); not reading it as 0 "
                        f"registers and 0 spills:\n{proc.stderr[:2000]}")
    return report


def cuda_ptx(spec, arch="sm_90"):
    from .pipeline import gpu_stage
    gpu = gpu_stage(spec)[-1]
    lowered = mlir_opt(gpu.text, [nvvm_pipeline(arch)], "gpu stage (NVVM lowering)",
                       env={"CUDA_ROOT": cuda_root()})
    text = extract_ptx(lowered)
    k = gpu.kernel
    info = KernelInfo(k.name, list(k.params), k.grid, (k.threads, 1, 1), k.shared_bytes)
    return PtxArtifact(text, [info], ptxas_check(text, arch))
