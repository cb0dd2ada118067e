"""PTX of the MLIR kernels: ptxas accepts it for sm_90 without spills, and the launch
description names the kernel's parameters in order."""
import re

import pytest

import mlir_bridge
from scanweaver_core.spec import AffineScanSpec, SelectiveScanSpec

SPECS = [AffineScanSpec.create((2, None), (2, None), axis=1, reverse=True, has_h0=True,
                               outputs=("states", "last")),
         AffineScanSpec.create((4, 1000, 5), (1,), axis=1, has_h0=True, dtype="bfloat16", outputs=("last",)),
         AffineScanSpec.create((7, 2), None, axis=0, dtype="float16")]


@pytest.mark.parametrize("spec", SPECS, ids=["symbolic", "bf16-last", "fp16-short"])
def test_ptx_passes_ptxas_without_spills(spec):
    art = mlir_bridge.cuda_ptx(spec)
    (kernel,) = art.kernels
    report = art.ptxas[kernel.name]
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0
    assert 0 < report["registers"] <= 255 and report["shared_bytes"] == kernel.shared_bytes
    assert f".entry {kernel.name}(" in art.ptx and "bar.sync" in art.ptx
    n_params = len(re.findall(rf"{kernel.name}_param_\d+", art.ptx.split(".entry", 1)[1].split("{", 1)[0]))
    assert n_params == len(kernel.params)
    names = [p[1] for p in kernel.params if p[0] == "ptr"]
    assert names[:2] == ["a", "b"]
    assert kernel.grid({}) == (spec.lanes, 1, 1) and kernel.block[0] * 2 >= min(spec.length or 512, 512)
    assert mlir_bridge.ptxas_check(art.ptx) == art.ptxas


SELECTIVE = [SelectiveScanSpec(1, 1536, 1024, 16, has_D=True, has_z=True, has_delta_bias=True, delta_softplus=True),
             SelectiveScanSpec(2, 6, 1025, 16, groups=3, has_h0=True, return_last_state=True, dtype="float16"),
             SelectiveScanSpec(2, 4, 3, 64, has_D=True, has_z=True, dtype="bfloat16", return_last_state=True)]


@pytest.mark.parametrize("spec", SELECTIVE, ids=["mamba", "fp16-groups-h0-last", "bf16-short-N64"])
def test_selective_ptx_passes_ptxas_without_spills(spec):
    art = mlir_bridge.cuda_ptx(spec)
    (kernel,) = art.kernels
    report = art.ptxas[kernel.name]
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0
    assert 0 < report["registers"] <= 128 and report["shared_bytes"] == kernel.shared_bytes <= 48 * 1024
    assert f".entry {kernel.name}(" in art.ptx and "bar.sync" in art.ptx
    assert "call.uni" not in art.ptx                       # exp/log inlined from libdevice
    n_params = len(re.findall(rf"{kernel.name}_param_\d+", art.ptx.split(".entry", 1)[1].split("{", 1)[0]))
    assert n_params == len(kernel.params) and all(kind == "ptr" for kind, _ in kernel.params)
    assert [p[1] for p in kernel.params][:5] == ["u", "delta", "A", "B", "C"]
    assert kernel.grid({}) == (spec.batch * spec.dim, 1, 1)
    assert kernel.block[0] * 2 >= min(spec.length, 512)
