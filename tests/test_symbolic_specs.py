"""Symbolic extents: a spec whose batch / length are names builds ONE kernel that runs at any
value (1 included), on every realization, and through LowerScans with Relax's own shape vars.

CPU kernels are built once and run at several values against the float64 references.  CUDA
kernels are built for sm_90 (ptxas resources checked) and their schedules run through the
phase-serial emulator (tir_schedules.emulate) in both thread orders; the GPU run itself is
still to do (bench/gpu on a GPU machine).
"""
import dataclasses

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import scanweaver_tvm as sw
import tir_schedules
from harness import NP_DTYPES, assert_close, plain_expected, run
from scanweaver_core import scan_op
from scanweaver_core.spec import AffineScanSpec, SelectiveScanSpec, is_symbolic, symbol_identifiers
from scanweaver_tvm import reference as ref
from test_selective import ALL, ORDER, operands
from tir_schedules import cuda_check, search, selective_cpu, selective_gpu
from tir_schedules.emulate import BothOrders

LENGTHS = [1, 2, 7, 100, 1025]
BATCHES = [1, 3]


def concrete(shape, values):
    """A spec shape with its names (None: ``"L"``) replaced by ``values``."""
    return tuple(values["L" if d is None else d] if is_symbolic(d) else d for d in shape)


def check_affine(kernel, spec, values, rng):
    """Operands at ``values``; every output against the float64 reference."""
    dt = NP_DTYPES[spec.dtype]
    a = rng.uniform(-1.0, 1.0, concrete(spec.a_shape, values)).astype(dt)
    b = rng.standard_normal(concrete(spec.shape, values)).astype(dt)
    h0 = np.asarray(rng.standard_normal(concrete(spec.state_shape, values))).astype(dt) \
        if spec.has_h0 else None
    want = plain_expected(spec, a, b, h0)
    got = run(kernel, [a, b, h0], [want[k].shape for k in spec.outputs], spec.dtype)
    for name, g in zip(spec.outputs, got):
        assert_close(g, want[name], spec.dtype, f"{name} at {values} ({spec})")


def check_selective(kernel, sym, batch, length, rng):
    spec = dataclasses.replace(sym, batch=batch, length=length)
    x = operands(spec, rng)
    want = ref.selective_scan(**{k: None if v is None else v.astype(np.float64) for k, v in x.items()},
                              delta_softplus=spec.delta_softplus, return_last_state=spec.return_last_state)
    want = want if spec.return_last_state else (want,)
    shapes = [(batch, spec.dim, length), (batch, spec.dim, spec.dstate)]
    got = run(kernel, [x[k] for k in ORDER], shapes[:len(want)], spec.dtype)
    for name, g, w in zip(("out", "last_state"), got, want):
        assert_close(g, w, spec.dtype, f"{name} at batch={batch} L={length} ({sym})")


# -- the convention --------------------------------------------------------------------------

def test_spec_convention_and_json_round_trip():
    spec = AffineScanSpec.create(("batch", "L + 3", 4), (1, "L + 3", 4), axis=1, has_h0=True,
                                 outputs=("states", "last"))
    assert spec.length == "L + 3" and spec.state_shape == ("batch", 4)
    assert spec.lanes is None and spec.inner == 4 and spec.is_symbolic
    assert symbol_identifiers(spec) == {"batch": "batch", "L + 3": "L_3"}
    assert is_symbolic(None) and is_symbolic("n") and not is_symbolic(3)
    sel = SelectiveScanSpec("batch", 8, "L", 4, groups=2, has_D=True)
    assert sel.bc_shape == ("batch", 2, 4, "L") and sel.is_symbolic
    for s in (spec, sel, AffineScanSpec.create((2, None), axis=1)):
        kind = type(s)
        assert scan_op.spec_from_json(kind, scan_op.spec_to_json(s)) == s
        assert search.spec_from_json(search.spec_to_json(s)) == s
    with pytest.raises(ValueError, match="non-empty"):
        AffineScanSpec.create((" ", 4))
    with pytest.raises(ValueError, match="broadcast"):
        AffineScanSpec.create(("B", "L"), ("C", "L"))
    with pytest.raises(ValueError, match="dim"):
        SelectiveScanSpec(1, "D", 8, 4)


def test_output_types_one_var_per_name():
    spec = AffineScanSpec.create(("batch", "L", 4), axis=1, outputs=("states", "last"))
    states, last = scan_op.output_types(spec)
    b, ell, _ = states.shape.values
    assert isinstance(b, tirx.Var) and b.ty == "int64" and b.name == "batch" and ell.name == "L"
    assert last.shape.values[0].same_as(b)          # the same name is the same var
    out, last_state = scan_op.output_types(SelectiveScanSpec("B", 4, "L", 2, return_last_state=True))
    assert out.shape.values[0].same_as(last_state.shape.values[0])


# -- CPU realizations ------------------------------------------------------------------------

AFFINE_SPECS = [  # shape, a_shape, axis: symbolic batch before the axis / L innermost
    (("batch", "L", 4), (1, "L", 4), 1),
    ((3, "batch", "L"), (3, 1, "L"), 2),
]


@pytest.mark.parametrize("config", [{}, {"chunks": 3}], ids=["lanes", "chunked"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("case", range(len(AFFINE_SPECS)))
def test_cpu_affine_symbolic_batch_and_length(case, reverse, config):
    shape, a_shape, axis = AFFINE_SPECS[case]
    spec = AffineScanSpec.create(shape, a_shape, axis, reverse, True, outputs=("states", "last"))
    kernel = tvm.compile(tir_schedules.realize(spec, "llvm", **config), target="llvm")
    rng = np.random.default_rng(case)
    for batch in BATCHES:
        for length in LENGTHS:
            check_affine(kernel, spec, {"batch": batch, "L": length}, rng)


SELECTIVE = {"all-fp32": ("float32", 2, ALL), "all-bf16": ("bfloat16", 2, ALL),
             "all-fp16": ("float16", 0, ALL), "plain": ("float32", 0, {})}


@pytest.mark.parametrize("variant", sorted(SELECTIVE))
def test_cpu_selective_symbolic_batch_and_length(variant):
    dtype, groups, options = SELECTIVE[variant]
    sym = SelectiveScanSpec("batch", 6, "L", 4, groups=groups, dtype=dtype, **options)
    kernel = tvm.compile(selective_cpu.generate(sym, **{**selective_cpu.default_config(sym),
                                                         "lanes": 4, "tile": 16}), target="llvm")
    rng = np.random.default_rng(len(variant))
    for batch, length in [(1, 1), (3, 2), (1, 15), (2, 100), (1, 1025)]:
        check_selective(kernel, sym, batch, length, rng)


# -- CUDA realizations: built and ptxas-checked, emulated at a few values ------------------

GPU_AFFINE = [("warp", {"warps": 2, "items": 3}), ("chunked", {"warps": 1, "items": 2, "chunks": 3}),
              ("blelloch", {"threads": 32})]


@pytest.mark.parametrize("name,config", GPU_AFFINE, ids=[n for n, _ in GPU_AFFINE])
def test_gpu_affine_symbolic(name, config):
    spec = AffineScanSpec.create(("batch", "L", 3), (1, "L", 3), axis=1, reverse=True, has_h0=True,
                                 outputs=("states", "last"))
    source, _, report = cuda_check.check_kernel(tir_schedules.realize(spec, cuda_check.SM90, schedule=name))
    assert "int64_t L" in source      # an argument, not baked in (batch only sizes the grid)
    assert report.spill_stores == 0 and report.registers <= 255
    module = tir_schedules.REALIZATIONS[name]
    kernel = BothOrders(module.generate(spec, **config), lambda f: tvm.compile(f, target="llvm"))
    rng = np.random.default_rng(len(name))
    for batch, length in [(1, 1), (3, 7), (2, 300)]:
        check_affine(kernel, spec, {"batch": batch, "L": length}, rng)


def test_gpu_selective_symbolic():
    sym = SelectiveScanSpec("batch", 3, "L", 4, groups=3, **ALL)
    source, _, report = cuda_check.check_kernel(tir_schedules.realize(sym, cuda_check.SM90))
    assert "int64_t L" in source and "int64_t batch" in source
    assert report.spill_stores == 0 and report.registers <= 255
    kernel = BothOrders(selective_gpu.generate(sym, warps=1, items=2),
                        lambda f: tvm.compile(f, target="llvm").mod)
    rng = np.random.default_rng(5)
    for batch, length in [(1, 1), (2, 65), (1, 130)]:
        check_selective(kernel, sym, batch, length, rng)


# -- LowerScans with Relax's symbolic shapes -------------------------------------------------

def _function(params, body):
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb))
        bb.emit_func_output(out)
    return bb.get()


def test_lower_scans_symbolic_affine_end_to_end():
    B, L = tirx.Var("batch", "int64"), tirx.Var("L", "int64")
    spec = AffineScanSpec.create(("batch", "L", 4), (1, "L", 4), axis=1, has_h0=True,
                                 outputs=("states", "last"))
    a, b, h0 = (relax.Var(n, relax.TensorType(s, "float32"))
                for n, s in (("a", (1, L, 4)), ("b", (B, L, 4)), ("h0", (B, 4))))

    def body(bb):
        first = bb.emit(scan_op.make_scan(spec, [a, b, h0]))
        again = bb.emit(scan_op.make_scan(spec, [a, b, h0]))     # equal specs share one PrimFunc
        return relax.Tuple([bb.emit(relax.TupleGetItem(first, 0)), bb.emit(relax.TupleGetItem(again, 1))])

    mod = _function([a, b, h0], body)
    vm = relax.VirtualMachine(sw.compile(mod, "llvm"), tvm.cpu())
    rng = np.random.default_rng(0)
    for batch, length in [(1, 1), (3, 100)]:
        av = rng.uniform(-1, 1, (1, length, 4)).astype(np.float32)
        bv = rng.standard_normal((batch, length, 4)).astype(np.float32)
        hv = rng.standard_normal((batch, 4)).astype(np.float32)
        states, last = vm["main"](*[tvm.runtime.tensor(x) for x in (av, bv, hv)])
        want = plain_expected(spec, av, bv, hv)
        assert_close(states.numpy().astype(np.float64), want["states"], "float32", "states")
        assert_close(last.numpy().astype(np.float64), want["last"], "float32", "last")
    lowered = sw.passes("llvm")(mod)
    assert sum(isinstance(f, tirx.PrimFunc) for _, f in lowered.functions_items()) == 1


def test_lower_scans_symbolic_selective_end_to_end():
    B, L = tirx.Var("batch", "int64"), tirx.Var("L", "int64")
    sym = SelectiveScanSpec("batch", 6, "L", 4, has_D=True, return_last_state=True)
    shapes = {"u": (B, 6, L), "delta": (B, 6, L), "A": (6, 4), "B": (B, 4, L), "C": (B, 4, L), "D": (6,)}
    params = [relax.Var(n, relax.TensorType(s, "float32")) for n, s in shapes.items()]
    mod = _function(params, lambda bb: bb.emit(scan_op.make_scan(sym, params)))
    vm = relax.VirtualMachine(sw.compile(mod, "llvm"), tvm.cpu())
    rng = np.random.default_rng(1)
    for batch, length in [(1, 1), (2, 70)]:
        x = operands(dataclasses.replace(sym, batch=batch, length=length), rng)
        out, last = vm["main"](*[tvm.runtime.tensor(x[n]) for n in shapes])
        want = ref.selective_scan(**{k: None if v is None else v.astype(np.float64) for k, v in x.items()},
                                  return_last_state=True)
        assert_close(out.numpy().astype(np.float64), want[0], "float32", "out")
        assert_close(last.numpy().astype(np.float64), want[1], "float32", "last_state")


def test_make_scan_type_from_operands_or_given():
    B = tirx.Var("n", "int64")
    spec = AffineScanSpec.create(("batch", 5), axis=1)
    a, b = (relax.Var(x, relax.TensorType((B, 5), "float32")) for x in "ab")
    ty = scan_op.make_scan(spec, [a, b]).ty_args[0]
    assert ty.shape.values[0].same_as(B)            # the operands' var, not a fresh one
    given = relax.TensorType((7, 5), "float32")
    assert scan_op.make_scan(spec, [a, b], ty=given).ty_args[0].same_as(given)


# -- MLIR and tuning: clean refusals ---------------------------------------------------------

@pytest.mark.parametrize("spec,field", [
    (AffineScanSpec.create(("batch", None), axis=1), "dimension 0"),
    (SelectiveScanSpec("batch", 4, 16, 4), "batch"),
    (SelectiveScanSpec(2, 4, "L", 4), "length"),
])
def test_mlir_refuses_other_symbolic_extents(spec, field):
    from mlir_bridge import tvm_wrap

    with pytest.raises(ValueError, match=f"mlir realization: symbolic {field}.*realization='tir'"):
        tvm_wrap.cpu_primfunc(spec)
    with pytest.raises(ValueError, match="realization='tir'"):
        tvm_wrap.cuda_primfunc(spec, tvm.target.Target(cuda_check.SM90), tvm.target.Target("llvm"))


def test_symbolic_specs_are_not_tuned():
    spec = AffineScanSpec.create(("batch", 64), axis=1)
    with pytest.raises(ValueError, match="symbolic"):
        search.scan_workload(spec)
    with pytest.raises(ValueError, match="symbolic"):
        search.knob_values("cpu", spec)
    with pytest.raises(ValueError, match="symbolic"):
        search.tune_task(SelectiveScanSpec("b", 4, "L", 4), "llvm", trials=1)
    assert search.best_choice(None, spec, "llvm") is None        # LowerScans keeps the default
    assert search.default_choice(spec, "llvm").schedule == "cpu"


def test_mlir_symbolic_length_through_lower_scans():
    """The MLIR route takes a named L (its one scalar) with Relax's own var; a symbolic batch
    is refused at LowerScans with the clear error, not deep in the MLIR tools."""
    L = tirx.Var("T", "int64")
    spec = AffineScanSpec.create((2, "T"), (2, "T"), axis=1, has_h0=True)
    a, b, h0 = (relax.Var(n, relax.TensorType(s, "float32")) for n, s in (("a", (2, L)), ("b", (2, L)),
                                                                            ("h0", (2,))))
    mod = _function([a, b, h0], lambda bb: bb.emit(scan_op.make_scan(spec, [a, b, h0])))
    vm = relax.VirtualMachine(sw.compile(mod, "llvm", realization="mlir"), tvm.cpu())
    rng = np.random.default_rng(2)
    for length in (1, 300):
        av, bv = rng.uniform(-1, 1, (2, length)).astype(np.float32), rng.standard_normal((2, length)).astype(np.float32)
        hv = rng.standard_normal(2).astype(np.float32)
        got = vm["main"](*[tvm.runtime.tensor(x) for x in (av, bv, hv)]).numpy()
        assert_close(got.astype(np.float64), plain_expected(spec, av, bv, hv)["states"], "float32", "states")
    B = tirx.Var("batch", "int64")
    spec = AffineScanSpec.create(("batch", 8), axis=1)
    a, b = (relax.Var(n, relax.TensorType((B, 8), "float32")) for n in "ab")
    mod = _function([a, b], lambda bb: bb.emit(scan_op.make_scan(spec, [a, b])))
    with pytest.raises(ValueError, match="mlir realization: symbolic dimension 0"):
        sw.compile(mod, "llvm", realization="mlir")
