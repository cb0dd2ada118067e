"""Every plain-scan realization against the float64 reference.

CPU realizations are built for llvm and run.  GPU realizations run here through the
phase-serial emulation of their own PrimFunc (tir_schedules.emulate); their CUDA build is
checked by test_cuda_build.py.  GPU *execution* is checked only by bench/gpu on a GPU machine.
"""
import numpy as np
import pytest
import tvm

import tir_schedules
from scanweaver_core.spec import AffineScanSpec
from tir_schedules.emulate import BothOrders

from harness import check_plain

LENGTHS = [1, 2, 3, 31, 1000, 1025, 4097]
# (name, config overrides): the chunked CPU and GPU variants are forced on small shapes.
REALIZATIONS = [("cpu", {}), ("cpu", {"chunks": 5}), ("blelloch", {}), ("warp", {}),
                ("warp", {"warps": 2, "items": 3}), ("chunked", {"warps": 1, "items": 2, "chunks": 3})]
IDS = [f"{n}{'-' + '-'.join(f'{k}{v}' for k, v in c.items()) if c else ''}" for n, c in REALIZATIONS]


def compile_for_cpu(spec, name, config):
    """llvm build of the realization; GPU ones through the emulator."""
    module = tir_schedules.REALIZATIONS[name]
    func = module.generate(spec, **{**module.default_config(spec), **config})
    if module.TARGET == "cuda":    # both thread orders, which must agree (a missing barrier fails)
        return BothOrders(func, lambda f: tvm.compile(f, target="llvm"))
    return tvm.compile(func, target="llvm")


@pytest.mark.parametrize("name,config", REALIZATIONS, ids=IDS)
@pytest.mark.parametrize("reverse", [False, True])
def test_symbolic_length_all_lengths(name, config, reverse):
    """One build with a symbolic L (a tirx.Var) runs every length, both directions."""
    spec = AffineScanSpec.create((2, None), (2, None), axis=1, reverse=reverse, has_h0=True,
                                 outputs=("states", "last"))
    kernel = compile_for_cpu(spec, name, config)
    rng = np.random.default_rng(len(name) + reverse)
    for length in LENGTHS:
        check_plain(kernel, spec, rng, length)


CASES = [  # shape, a_shape, axis, reverse, h0, dtype, outputs
    ((3, 1025), None, -1, False, False, "float32", ("states",)),
    ((2, 3, 31), (3, 1), -1, True, True, "float32", ("states", "last")),   # per-channel a
    ((4, 1000, 5), (1,), 1, False, True, "float32", ("last",)),            # scalar a
    ((5, 33, 4), (5, 1, 4), 1, True, False, "float32", ("states", "last")),
    ((1000, 3), (1000, 1), 0, True, True, "float16", ("states", "last")),
    ((2, 3, 1025), None, 2, False, True, "bfloat16", ("states", "last")),
    ((7, 2), None, 0, False, False, "float16", ("states",)),
]


@pytest.mark.parametrize("name,config", REALIZATIONS, ids=IDS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_layouts_dtypes_broadcast(name, config, case):
    """Static shapes: any axis, broadcast a, h0, fp16/bf16 inputs with fp32 accumulation."""
    shape, a_shape, axis, reverse, h0, dtype, outputs = CASES[case]
    spec = AffineScanSpec.create(shape, a_shape, axis, reverse, h0, dtype, outputs)
    check_plain(compile_for_cpu(spec, name, config), spec, np.random.default_rng(case))


def test_default_schedule_choice():
    """Few lanes and long L pick the L-splitting GPU schedule; many lanes the warp one."""
    long_few = AffineScanSpec.create((4, 65537))
    many = AffineScanSpec.create((1, 1536, 1024))
    assert tir_schedules._preferred(long_few, "cuda")[0] == "chunked"
    assert tir_schedules._preferred(many, "cuda")[0] == "warp"
    assert tir_schedules._preferred(many, "cpu") == ["cpu"]
    assert tir_schedules.realize(many, "llvm").attrs["global_symbol"] == "scanweaver_scan"


def test_cpu_chunking_default_for_few_lanes():
    assert tir_schedules.cpu.default_config(AffineScanSpec.create((1, 65537)))["chunks"] > 1
    assert tir_schedules.cpu.default_config(AffineScanSpec.create((1536, 1024)))["chunks"] == 1
