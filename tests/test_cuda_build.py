"""GPU realizations built for CUDA sm_90 without a GPU: source, PTX (nvcc), ptxas resources.

What this cannot show is the kernels running on a GPU: bench/gpu/ does that on a GPU machine.
"""
import pytest

import tir_schedules
from scanweaver_core.spec import AffineScanSpec, SelectiveScanSpec
from tir_schedules import cuda_check

SHARED_LIMIT = 48 * 1024

PLAIN_SPECS = [
    AffineScanSpec.create((1, 1536, 1024)),
    AffineScanSpec.create((2, None), (2, None), axis=1, reverse=True, has_h0=True,
                          outputs=("states", "last")),                    # symbolic L
    AffineScanSpec.create((4, 65537, 3), (1, 65537, 3), axis=1, dtype="bfloat16"),
    AffineScanSpec.create((8, 1000), (8, 1), dtype="float16", outputs=("last",)),
]
GPU_PLAIN = [n for n, m in tir_schedules.REALIZATIONS.items() if m.TARGET == "cuda" and m.FORM == "affine"]


def _assert_resources(report):
    assert report.spill_stores == 0 and report.spill_loads == 0, report.text
    assert report.shared_bytes <= SHARED_LIMIT, report.text
    assert report.registers <= 255, report.text


@pytest.mark.parametrize("name", GPU_PLAIN)
@pytest.mark.parametrize("spec_index", range(len(PLAIN_SPECS)))
def test_plain_gpu_kernel_ptxas(name, spec_index):
    spec = PLAIN_SPECS[spec_index]
    func = tir_schedules.realize(spec, cuda_check.SM90, schedule=name)
    source, ptx, report = cuda_check.check_kernel(func)
    assert "__global__" in source and ".entry" in ptx
    assert "__syncthreads" in source
    if name in ("warp", "chunked"):
        assert "__shfl_up_sync" in source
    _assert_resources(report)


def test_selective_gpu_kernel_ptxas():
    spec = SelectiveScanSpec(batch=1, dim=64, length=1024, dstate=16, has_D=True, has_z=True,
                             has_delta_bias=True, delta_softplus=True)
    source, ptx, report = cuda_check.check_kernel(tir_schedules.realize(spec, cuda_check.SM90))
    assert "__global__" in source
    _assert_resources(report)


def test_ptxas_rejects_garbage():
    with pytest.raises(RuntimeError, match="ptxas"):
        cuda_check.ptxas("this is not ptx")


@pytest.mark.parametrize("which", ["tir", "mlir"])
def test_an_unreadable_ptxas_report_fails_loudly(which, monkeypatch):
    """A ptxas whose -v output we cannot parse must not read as 0 registers and 0 spills."""
    import subprocess

    import mlir_bridge.ptx

    class Quiet:
        returncode, stdout = 0, ""
        stderr = "ptxas info    : Compiling entry function 'k' for 'sm_90'\nsomething new\n"

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Quiet())
    if which == "tir":
        with pytest.raises(RuntimeError, match="no resource report"):
            cuda_check.ptxas(".version 8.0")
    else:
        monkeypatch.setattr(mlir_bridge.ptx, "ptxas", lambda: "ptxas")
        with pytest.raises(mlir_bridge.ptx.MlirError, match="no resource report"):
            mlir_bridge.ptx.ptxas_check(".version 8.0")
