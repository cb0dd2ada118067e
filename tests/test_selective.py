"""Fused selective scan: CPU kernel (llvm) and GPU kernel (ptxas resources; emulated on CPU)
against the float64 reference, on fresh random operands with NaN-poisoned outputs."""
import numpy as np
import pytest
import tvm

from harness import NP_DTYPES, assert_close, run
from scanweaver_tvm import reference as ref
from scanweaver_core.spec import SelectiveScanSpec
from tir_schedules import selective_cpu, selective_gpu
from tir_schedules.cuda_check import check_kernel
from tir_schedules.emulate import BothOrders

ALL = dict(has_D=True, has_z=True, has_delta_bias=True, delta_softplus=True, has_h0=True,
           return_last_state=True)
ORDER = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")


def spec_of(length=31, dstate=16, batch=2, dim=3, **options):
    return SelectiveScanSpec(batch, dim, length, dstate, **options)


def operands(spec, rng):
    """Random operands in the input dtype (A, D, delta_bias float32) with bounded dynamics:
    the effective delta lies in ~[0.01, 0.2] and A < 0, as in a trained Mamba layer."""
    b, d, l, n, dt = spec.batch, spec.dim, spec.length, spec.dstate, NP_DTYPES[spec.dtype]
    bias = rng.uniform(-0.05, 0.05, d) if spec.has_delta_bias else np.zeros(d)
    if spec.delta_softplus:  # softplus(x) in [0.01, 0.2] for x in [-4.6, -1.5]
        delta = rng.uniform(-4.5, -1.6, (b, d, l)) - bias[None, :, None]
    else:
        delta = rng.uniform(0.01, 0.2, (b, d, l)) - bias[None, :, None]
    x = {"u": rng.standard_normal((b, d, l)), "delta": delta, "A": -rng.uniform(0.1, 4.0, (d, n)),
         "B": rng.standard_normal(spec.bc_shape), "C": rng.standard_normal(spec.bc_shape),
         "D": rng.standard_normal(d) if spec.has_D else None,
         "z": rng.standard_normal((b, d, l)) if spec.has_z else None,
         "delta_bias": bias if spec.has_delta_bias else None,
         "h0": rng.standard_normal((b, d, n)) if spec.has_h0 else None}
    params = ("A", "D", "delta_bias")
    return {k: None if v is None else v.astype(np.float32 if k in params else dt) for k, v in x.items()}


def check(kernel, spec, rng):
    """Run ``kernel`` and compare out (and last_state) with the reference on the same rounded inputs."""
    x = operands(spec, rng)
    assert SelectiveScanSpec.for_arrays(**x, delta_softplus=spec.delta_softplus,
                                        return_last_state=spec.return_last_state) == spec
    want = ref.selective_scan(**{k: None if v is None else v.astype(np.float64) for k, v in x.items()},
                              delta_softplus=spec.delta_softplus,
                              return_last_state=spec.return_last_state)
    want = want if spec.return_last_state else (want,)
    shapes = [(spec.batch, spec.dim, spec.length), (spec.batch, spec.dim, spec.dstate)]
    got = run(kernel, [x[k] for k in ORDER], shapes[:len(want)], spec.dtype)
    for name, g, w in zip(("out", "last_state"), got, want):
        assert_close(g, w, spec.dtype, f"{name} ({spec})")


def build_cpu(spec, **config):
    func = selective_cpu.generate(spec, **{**selective_cpu.default_config(spec), **config})
    assert func.attrs["global_symbol"] == "scanweaver_scan" and func.attrs["tirx.noalias"]
    return tvm.compile(func, target="llvm").mod


def build_emulated(spec, **config):
    func = selective_gpu.generate(spec, **{**selective_gpu.default_config(spec), **config})
    return BothOrders(func, lambda f: tvm.compile(f, target="llvm").mod)   # thread orders agree


VARIANTS = {
    "plain": {}, "D": dict(has_D=True), "z": dict(has_z=True),
    "bias": dict(has_delta_bias=True), "softplus": dict(delta_softplus=True),
    "bias+softplus": dict(has_delta_bias=True, delta_softplus=True),
    "h0": dict(has_h0=True), "last": dict(return_last_state=True),
    "groups": dict(groups=3, **ALL), "one group": dict(groups=1, has_D=True, return_last_state=True),
    "all": ALL, "fp16": dict(dtype="float16", **ALL), "bf16": dict(dtype="bfloat16", **ALL),
    "bf16 groups": dict(dtype="bfloat16", groups=3, has_z=True, return_last_state=True),
}


@pytest.mark.parametrize("length", [1, 2, 3, 31, 1000, 1025])
@pytest.mark.parametrize("dstate", [1, 16])
def test_cpu_lengths(length, dstate):
    spec = spec_of(length, dstate, **ALL)
    check(build_cpu(spec), spec, np.random.default_rng(length * 100 + dstate))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cpu_variants(variant):
    spec = spec_of(33, 16, **VARIANTS[variant])
    check(build_cpu(spec), spec, np.random.default_rng(7))


@pytest.mark.parametrize("config", [dict(lanes=1), dict(lanes=2, tile=8), dict(lanes=4, tile=5),
                                    dict(lanes=8, unroll=False), dict(lanes=16, tile=64)])
def test_cpu_configs(config):
    spec = spec_of(70, 5, dim=6, groups=2, **ALL)
    check(build_cpu(spec, **config), spec, np.random.default_rng(11))


@pytest.mark.parametrize("length", [1, 31, 1025])
@pytest.mark.parametrize("dstate", [1, 16])
@pytest.mark.parametrize("config", [{}, dict(warps=2, items=3), dict(warps=1, items=1)])
def test_gpu_emulated(length, dstate, config):
    spec = spec_of(length, dstate, **ALL)
    check(build_emulated(spec, **config), spec, np.random.default_rng(length + dstate))


@pytest.mark.parametrize("variant", ["plain", "D", "z", "bias+softplus", "h0", "last", "groups",
                                     "fp16", "bf16 groups"])
def test_gpu_emulated_variants(variant):
    spec = spec_of(100, 16, **VARIANTS[variant])
    check(build_emulated(spec, warps=2, items=2), spec, np.random.default_rng(3))


def test_gpu_emulated_more_states_than_threads():
    spec = spec_of(45, 70, **ALL)  # 32 threads stride over 70 states (h0, carries, last_state)
    check(build_emulated(spec, warps=1, items=2), spec, np.random.default_rng(5))


@pytest.mark.parametrize("spec,config", [
    (spec_of(2048, 16, batch=1, dim=1536, **ALL), {}),
    (spec_of(1025, 16, groups=3, dtype="float16", **ALL), {}),
    (spec_of(4096, 16, dtype="bfloat16", **ALL), {}),
    (spec_of(31, 64, **ALL), {}),
    (spec_of(4096, 16, **ALL), dict(warps=8, items=4)),
], ids=["fp32 mamba", "fp16 groups", "bf16", "short N=64", "8 warps"])
def test_gpu_ptxas(spec, config):
    """The CUDA kernel compiles for sm_90 with no register spills and small shared memory."""
    func = selective_gpu.generate(spec, **{**selective_gpu.default_config(spec), **config})
    _, _, report = check_kernel(func)
    assert report.spill_stores == 0 and report.spill_loads == 0, report.text
    assert 0 < report.shared_bytes <= 48 * 1024, report.text
    assert report.registers <= 128, report.text


def test_module_api():
    spec = spec_of(8, 4)
    for module, target in ((selective_cpu, "cpu"), (selective_gpu, "cuda")):
        assert module.TARGET == target and module.FORM == "selective" and module.applies(spec)
        assert not module.applies(object())
    with pytest.raises(ValueError):
        selective_gpu.generate(spec, warps=0)


@pytest.mark.parametrize("change,message", [
    (dict(delta=np.zeros((2, 3, 30), np.float32)), "delta"),
    (dict(A=np.zeros((3, 4), np.float16)), "A"),
    (dict(B=np.zeros((2, 4, 30), np.float32)), "B"),
    (dict(C=np.zeros((2, 2, 4, 31), np.float32), B=np.zeros((2, 2, 4, 31), np.float32)), "groups"),
    (dict(z=np.zeros((2, 3, 31), np.float16)), "z"),
    (dict(h0=np.zeros((2, 3, 5), np.float32)), "h0"),
])
def test_bad_inputs(change, message):
    x = operands(spec_of(31, 4), np.random.default_rng(0))
    x.update(change)
    with pytest.raises(ValueError, match=message):
        SelectiveScanSpec.for_arrays(**x)
