"""The CPU route (derived from the GPU kernel IR) against the float64 reference, run through
the shared library and ctypes, on fresh random operands with NaN-poisoned outputs."""
import re

import numpy as np
import pytest

import mlir_bridge
from harness import assert_close, plain_expected, plain_operands
from scanweaver_core.spec import AffineScanSpec, SelectiveScanSpec

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


# --- the selective (Mamba) kernel: the CPU route of the same gpu.func -----------------------
SEL_ALL = dict(has_D=True, has_z=True, has_delta_bias=True, delta_softplus=True, has_h0=True,
               return_last_state=True)
SEL_VARIANTS = {
    "plain": {}, "D+z": dict(has_D=True, has_z=True), "bias": dict(has_delta_bias=True),
    "softplus": dict(delta_softplus=True), "h0+last": dict(has_h0=True, return_last_state=True),
    "groups": dict(groups=3, **SEL_ALL), "one group": dict(groups=1, has_D=True, return_last_state=True),
    "fp16": dict(dtype="float16", **SEL_ALL),
    "bf16 groups": dict(dtype="bfloat16", groups=3, has_z=True, return_last_state=True),
}


def selective_operands(spec, rng, delta=None):
    """Operands (kernel order, None for absent) with a trained layer's dynamics: effective
    delta in ~[0.01, 0.2] (softplus input in [-4.5, -1.6]), A < 0; ``delta`` overrides the
    effective-input range."""
    from harness import NP_DTYPES
    b, d, l, n = spec.batch, spec.dim, spec.length, spec.dstate
    bias = rng.uniform(-0.05, 0.05, d) if spec.has_delta_bias else np.zeros(d)
    lo, hi = delta or ((-4.5, -1.6) if spec.delta_softplus else (0.01, 0.2))
    x = {"u": rng.standard_normal((b, d, l)), "delta": rng.uniform(lo, hi, (b, d, l)) - bias[:, None],
         "A": -rng.uniform(0.1, 4.0, (d, n)), "B": rng.standard_normal(spec.bc_shape),
         "C": rng.standard_normal(spec.bc_shape), "D": rng.standard_normal(d) if spec.has_D else None,
         "z": rng.standard_normal((b, d, l)) if spec.has_z else None, "delta_bias": bias if spec.has_delta_bias else None,
         "h0": rng.standard_normal((b, d, n)) if spec.has_h0 else None}
    dt = NP_DTYPES[spec.dtype]
    return {k: None if v is None else v.astype(np.float32 if k in ("A", "D", "delta_bias") else dt)
            for k, v in x.items()}


def selective_expected(spec, x):
    from scanweaver_tvm import reference as ref
    want = ref.selective_scan(**{k: None if v is None else v.astype(np.float64) for k, v in x.items()},
                              delta_softplus=spec.delta_softplus, return_last_state=spec.return_last_state)
    return want if spec.return_last_state else (want,)


def check_selective(spec, rng):
    x = selective_operands(spec, rng)
    got = mlir_bridge.run_cpu(spec, *x.values())
    want = selective_expected(spec, x)
    assert len(got) == len(want)
    for name, g, w in zip(("out", "last_state"), got, want):
        assert_close(g.astype(np.float64), w, spec.dtype, f"{name} ({spec})")


@pytest.mark.parametrize("length", [1, 2, 3, 31, 1000])
def test_selective_lengths(length):
    spec = SelectiveScanSpec(2, 3, length, 16, **SEL_ALL)
    check_selective(spec, np.random.default_rng(length))


@pytest.mark.parametrize("variant", list(SEL_VARIANTS))
def test_selective_variants(variant):
    spec = SelectiveScanSpec(2, 3, 33, 16, **SEL_VARIANTS[variant])
    check_selective(spec, np.random.default_rng(3))


def test_selective_softplus_both_sides_of_threshold():
    """softplus(delta + bias) from -30 to 30 (PyTorch switches to x above 20), each output
    element checked relatively: at L=1, N=1, out = softplus(.)*u*B*C, so a softplus that
    loses the digits of exp(-30) ~ 1e-13 (log(1 + v) instead of log1p) fails here."""
    spec = SelectiveScanSpec(1, 8, 1, 1, has_delta_bias=True, delta_softplus=True)
    x = selective_operands(spec, np.random.default_rng(5), delta=(-30.0, 30.0))
    x["delta"][0, :, 0] = np.linspace(-30, 30, 8, dtype=np.float32) - x["delta_bias"]
    (got,), (want,) = mlir_bridge.run_cpu(spec, *x.values()), selective_expected(spec, x)
    assert np.all(want != 0) and np.abs(want).min() < 1e-12    # softplus(-30) ~ 9e-14 kept
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-6, atol=0)


def test_selective_abi():
    spec = SelectiveScanSpec(2, 4, 5, 3, groups=2, has_D=True, has_h0=True, return_last_state=True)
    art = mlir_bridge.cpu_llvm_ir(spec)
    assert art.operand_names == ["u", "delta", "A", "B", "C", "D", "h0", "out", "last_state"]
    assert art.symbolic == [] and art.entry.startswith("scanweaver_mlir_")
    defines = [l for l in art.llvm_ir.splitlines() if l.startswith("define")]
    assert defines == [f"define i32 @{art.entry}(" + ", ".join(f"ptr %{i}" for i in range(9)) + ") {"]
    declared = re.findall(r"^declare \S+ @([\w.]+)", art.llvm_ir, re.M)
    assert all(name.startswith("llvm.") for name in declared), declared   # libm via llc only
    assert not re.findall(r"^@\w+ = (?!private|internal)", art.llvm_ir, re.M)


def test_cpu_route_leaves_no_temporary_folders(tmp_path, monkeypatch):
    """Code review: each build left a ``scanweaver_mlir_*`` folder behind."""
    import tempfile

    from scanweaver_core.spec import AffineScanSpec as Spec

    import mlir_bridge.native

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(mlir_bridge.native, "_LIBS", {})        # build it here, not from cache
    spec = Spec.create((2, 3, 5), axis=1)
    a = np.random.default_rng(0).uniform(-1, 1, (2, 3, 5)).astype("float32")
    mlir_bridge.run_cpu(spec, a, a)
    assert mlir_bridge.native._LIBS and list(tmp_path.iterdir()) == []
