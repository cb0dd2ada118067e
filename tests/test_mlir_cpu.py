"""The CPU route (derived from the GPU kernel IR) against the float64 reference, run through
the shared library and ctypes, on fresh random operands with NaN-poisoned outputs."""
import numpy as np
import pytest

import mlir_bridge
from harness import assert_close, plain_expected, plain_operands
from scanweaver_tvm.spec import AffineScanSpec

LENGTHS = [1, 2, 3, 31, 1000, 1025]
CASES = [  # shape, a_shape, axis, reverse, h0, dtype, outputs (as test_affine_realizations)
    ((3, 1025), None, -1, False, False, "float32", ("states",)),
    ((2, 3, 31), (3, 1), -1, True, True, "float32", ("states", "last")),
    ((4, 1000, 5), (1,), 1, False, True, "float32", ("last",)),
    ((5, 33, 4), (5, 1, 4), 1, True, False, "float32", ("states", "last")),
    ((1000, 3), (1000, 1), 0, True, True, "float16", ("states", "last")),
    ((2, 3, 1025), None, 2, False, True, "bfloat16", ("states", "last")),
    ((7, 2), None, 0, False, False, "float16", ("states",)),
]


def check(spec, rng, length=None):
    a, b, h0 = plain_operands(spec, rng, length)
    want = plain_expected(spec, a, b, h0)
    got = mlir_bridge.run_cpu(spec, a, b, h0)
    for name, g in zip(spec.outputs, got):
        assert_close(g.astype(np.float64), want[name], spec.dtype, f"{name} (shape {b.shape}, {spec})")


@pytest.mark.parametrize("reverse", [False, True])
def test_symbolic_length_all_lengths(reverse):
    spec = AffineScanSpec.create((2, None), (2, None), axis=1, reverse=reverse, has_h0=True,
                                 outputs=("states", "last"))
    rng = np.random.default_rng(7 + reverse)
    for length in LENGTHS + ([65537] if reverse else []):
        check(spec, rng, length)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_layouts_dtypes_broadcast(case):
    shape, a_shape, axis, reverse, h0, dtype, outputs = CASES[case]
    check(AffineScanSpec.create(shape, a_shape, axis, reverse, h0, dtype, outputs), np.random.default_rng(case))


def test_artifact_abi(tmp_path):
    static = mlir_bridge.cpu_llvm_ir(AffineScanSpec.create((3, 8), outputs=("states", "last")))
    symbolic = mlir_bridge.cpu_llvm_ir(AffineScanSpec.create((3, None)))
    assert static.operand_names == ["a", "b", "states", "last"] and static.symbolic == []
    assert symbolic.operand_names == ["a", "b", "states"] and symbolic.symbolic == ["L"]
    assert static.entry != symbolic.entry and static.entry.startswith("scanweaver_mlir_")
    assert f"define i32 @{static.entry}(ptr %0, ptr %1, ptr %2, ptr %3)" in static.llvm_ir
    assert f"define i32 @{symbolic.entry}(ptr %0, ptr %1, ptr %2, i64 %3)" in symbolic.llvm_ir
    assert (tmp_path / "s.so").exists() is False
    mlir_bridge.build_shared_library(static, str(tmp_path / "s.so"))
    assert (tmp_path / "s.so").stat().st_size > 0


def test_bad_operands_are_named():
    spec = AffineScanSpec.create((2, 5))
    a = np.ones((2, 5), np.float32)
    with pytest.raises(ValueError, match="b: shape"):
        mlir_bridge.run_cpu(spec, a, np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match="b: dtype"):
        mlir_bridge.run_cpu(spec, a, np.ones((2, 5), np.float64))
