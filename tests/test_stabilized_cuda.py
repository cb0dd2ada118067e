"""The CUDA realization of the stabilized scan (``tir_schedules.stabilized_gpu``), without a GPU.

Checked here: it builds for sm_90 at real shapes (RWKV-4's (8, 768, 1024) WKV with the bonus,
bf16, channel-major, logcumsumexp's den-only form) and ptxas accepts it without spills; its
algorithm (chunk elements, one barrier, carries, replay), emulated on the CPU in both thread
orders (``tir_schedules.emulate``; the reverse order through test_matrix_cuda's workaround of
TVM's floordiv rewrite of a reversed thread id, which otherwise reads out of bounds), matches the float64 oracle over odd lengths, both layouts
and directions, every option, extreme keys and fp16/bf16; a Relax module holding the scan
lowers and compiles for CUDA.

STILL TO DO: the GPU run itself (results and timing on an H100/H200) has not happened; nothing
here executes the kernel on a GPU.
"""
import numpy as np
import pytest
import tvm
from tvm import relax

import tir_schedules
from relax_pass.lower import LowerScans
from scanweaver_core.scan_op import make_scan
from scanweaver_core.spec import StabilizedScanSpec
from tests.test_stabilized_cpu import check, spec_of
from test_matrix_cuda import Emulated   # BothOrders, around TVM's reversed-thread-id bug
from tir_schedules import cuda_check, stabilized_gpu

CUDA = {"kind": "cuda", "arch": "sm_90"}


def emulated(spec, **config):
    func = tir_schedules.realize(spec, CUDA, "stabilized_gpu", **config)
    return Emulated(func)


@pytest.mark.parametrize("layout", ["time_major", "channel_major"])
@pytest.mark.parametrize("length", [1, 2, 3, 1000, 1025])
def test_lengths_emulated(layout, length):
    spec = spec_of(length, channels=11, layout=layout, has_bonus=True, has_h0=True, return_last_state=True)
    check(emulated(spec, tile=8, chunks=4), spec, np.random.default_rng(length))


@pytest.mark.parametrize("layout", ["time_major", "channel_major"])
@pytest.mark.parametrize("decay", ["none", "channel", "step"])
@pytest.mark.parametrize("values, bonus, h0, reverse", [
    (True, True, True, True), (True, False, False, False), (False, True, False, True),
    (False, False, True, False)])
def test_every_option_emulated(layout, decay, values, bonus, h0, reverse):
    spec = spec_of(77, channels=9, layout=layout, decay=decay, has_values=values, has_bonus=bonus,
                   has_h0=h0, reverse=reverse, return_last_state=True)
    check(emulated(spec, tile=4, chunks=8), spec, np.random.default_rng(3))


@pytest.mark.parametrize("values", [True, False])
def test_extreme_keys_emulated(values):
    spec = spec_of(300, channels=6, has_values=values, has_bonus=values, return_last_state=True)
    check(emulated(spec, tile=8, chunks=16), spec, np.random.default_rng(5), k_range=(-100, 100), tol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_inputs_emulated(dtype):
    spec = spec_of(200, channels=5, decay="step", has_bonus=True, has_h0=True, return_last_state=True,
                   dtype=dtype, layout="channel_major")
    check(emulated(spec, tile=8, chunks=4), spec, np.random.default_rng(7))


REAL = {
    "rwkv4": StabilizedScanSpec(8, 768, 1024, "channel", True, True),
    "rwkv4-state-bf16": StabilizedScanSpec(1, 2048, 4096, "channel", True, True, True, False, True,
                                           dtype="bfloat16"),
    "channel-major-step-reverse": StabilizedScanSpec(4, 512, 2048, "step", True, False, False, True,
                                                     layout="channel_major"),
    "logcumsumexp": StabilizedScanSpec(16, 256, 1024, "none", False),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_ptxas_real_shapes(name):
    spec = REAL[name]
    config = stabilized_gpu.default_config(spec)
    assert config["tile"] * config["chunks"] <= 1024
    src, _, report = cuda_check.check_kernel(tir_schedules.realize(spec, CUDA))
    assert "__syncthreads" in src and "expf" in src
    assert report.spill_stores == 0 and report.spill_loads == 0, report.text
    assert report.registers <= 64, report.text


def test_default_config():
    assert stabilized_gpu.default_config(REAL["rwkv4"]) == {"tile": 32, "chunks": 8}   # ~11 warps an SM
    assert stabilized_gpu.default_config(spec_of(20, channels=3)) == {"tile": 4, "chunks": 1}
    assert stabilized_gpu.default_config(spec_of(4096, batch=1, channels=64))["chunks"] == 16


def test_realize_picks_it_for_cuda_and_lower_scans_compiles():
    spec = spec_of(64, has_bonus=True, has_h0=True, return_last_state=True)
    assert tir_schedules._preferred(spec, "cuda") == ["stabilized_gpu"]  # pylint: disable=protected-access
    bb = relax.BlockBuilder()
    dtypes = spec.operand_dtypes()
    params = [relax.Var(n, relax.TensorType(s, dtypes[n])) for n, s in spec.operand_shapes().items()]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(make_scan(spec, params))
        bb.emit_func_output(out)
    target = tvm.target.Target(CUDA)
    lowered = LowerScans(target)(bb.get())
    ex = tvm.compile(lowered, target=target)
    assert any("__syncthreads" in s for s in cuda_check.module_cuda_sources(ex.mod))


def test_sampled_gpu_decisions_compile_to_cuda():
    """Points of the MetaSchedule space (tile x chunks threads) build as CUDA kernels of that size."""
    import random

    from tir_schedules import search

    spec = REAL["rwkv4"]
    rng = random.Random(5)
    for _ in range(3):
        values = search.knob_values("stabilized_gpu", spec)
        knobs = {k: rng.choice(v) for k, v in values.items()}
        mod = search.sample(tvm.s_tir.Schedule(search.workload_module(spec)), "stabilized_gpu", spec, knobs).mod
        source = tvm.compile(search.realize_module(mod, CUDA), target=tvm.target.Target(CUDA)).mod \
            .imports[0].inspect_source()
        assert f"__launch_bounds__({knobs['tile'] * knobs['chunks']})" in source, knobs


def test_symbolic_batch_and_length_emulated():
    import dataclasses

    spec = spec_of("L", batch="batch", channels=7, has_bonus=True, has_h0=True, return_last_state=True)
    kernel = emulated(spec, tile=4, chunks=4)
    for batch, length in ((1, 1), (2, 5), (3, 77)):
        check(kernel, dataclasses.replace(spec, batch=batch, length=length), np.random.default_rng(length))
