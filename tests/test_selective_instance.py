"""Mamba-1's selective scan as an instance of the matrix-state spec.

``SelectiveScanSpec.as_matrix`` names the same scan on the same bytes (reshaped) as a
``MatrixScanSpec`` with the selective decay in channel-major layout; ``as_selective`` goes back.
Checked here: the two float64 oracles agree on every option, the layouts agree with each other,
the mapping round-trips and refuses what is not Mamba's form, and a kernel of either spec runs
on the other's buffers (``tir_schedules.instance``), through ``LowerScans`` too.
"""
import numpy as np
import pytest
import tvm
from tvm import relax

import tir_schedules
from harness import NP_DTYPES, assert_close, run
from relax_pass.interpret import _scan
from scanweaver_core import reference
from scanweaver_core.scan_op import make_scan, parse_scan
from scanweaver_core.spec import SELECTIVE_AS_MATRIX, MatrixScanSpec, SelectiveScanSpec

TO_SELECTIVE = {m: s for s, m in SELECTIVE_AS_MATRIX.items()}


def selective_spec(batch=2, dim=8, length=37, dstate=3, groups=0, **options):
    flags = dict(has_D=True, has_z=True, has_delta_bias=True, delta_softplus=True, has_h0=True,
                 return_last_state=True)
    return SelectiveScanSpec(batch, dim, length, dstate, groups, **{**flags, **options})


def selective_arrays(spec, rng, dtype=np.float64):
    """Random operands in the selective scan's own buffers (A < 0: a decaying state)."""
    x = {n: rng.standard_normal(s) for n, s in spec.buffer_shapes().items()
         if n not in ("out", "last_state")}
    x["A"] = -rng.uniform(0.2, 2.0, x["A"].shape)
    x["delta"] = 0.5 * x["delta"]
    return {n: v.astype(np.float32 if n in ("A", "D", "delta_bias") else dtype) for n, v in x.items()}


def as_matrix_arrays(spec, x):
    """The same bytes, named and shaped as the matrix instance's operands."""
    shapes = spec.as_matrix().buffer_shapes()
    return {SELECTIVE_AS_MATRIX[n]: v.reshape(shapes[SELECTIVE_AS_MATRIX[n]]) for n, v in x.items()}


def selective_reference(spec, x):
    got = reference.selective_scan(**x, delta_softplus=spec.delta_softplus,
                                   return_last_state=spec.return_last_state)
    return list(got) if isinstance(got, tuple) else [got]


def matrix_reference(spec, y):
    m = spec if isinstance(spec, MatrixScanSpec) else spec.as_matrix()
    kwargs = {"g" if n == "dt" else n: v for n, v in y.items() if n in m.operand_names()}
    got = reference.matrix_scan(**kwargs, dt_softplus=m.dt_softplus, reverse=m.reverse,
                                return_last_state=m.return_last_state, layout=m.layout)
    return list(got) if isinstance(got, tuple) else [got]


OPTIONS = [dict(), dict(groups=2), dict(groups=4, has_z=False), dict(has_D=False, has_h0=False),
           dict(delta_softplus=False, has_delta_bias=False, return_last_state=False)]


@pytest.mark.parametrize("length", [1, 2, 3, 37])
@pytest.mark.parametrize("options", OPTIONS)
def test_oracles_agree(length, options):
    spec = selective_spec(length=length, **options)
    x = selective_arrays(spec, np.random.default_rng(length))
    want = selective_reference(spec, x)
    got = matrix_reference(spec, as_matrix_arrays(spec, x))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.reshape(w.shape), w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reverse", [False, True])
def test_layouts_agree(reverse):
    """Time-major operands (the transposes) give the transposed outputs."""
    rng = np.random.default_rng(3)
    b, h, l, k, v = 2, 3, 11, 4, 5
    y = {"q": rng.standard_normal((b, 1, l, k)), "k": rng.standard_normal((b, 1, l, k)),
         "v": rng.standard_normal((b, h, l, v)), "g": rng.standard_normal((b, h, l, v)),
         "A": -rng.uniform(0.1, 1, (h, k, v)), "dt_bias": rng.standard_normal((h, v)),
         "D": rng.standard_normal((h, v)), "z": rng.standard_normal((b, h, l, v)),
         "h0": rng.standard_normal((b, h, k, v))}
    kwargs = dict(dt_softplus=True, reverse=reverse, return_last_state=True)
    o, last = reference.matrix_scan(**y, **kwargs)
    swapped = {n: x if n in ("dt_bias", "D") else np.swapaxes(x, -1, -2) for n, x in y.items()}
    o2, last2 = reference.matrix_scan(**swapped, **kwargs, layout="channel_major")
    np.testing.assert_allclose(np.swapaxes(o2, -1, -2), o, rtol=1e-12)
    np.testing.assert_allclose(np.swapaxes(last2, -1, -2), last, rtol=1e-12)
    spec = MatrixScanSpec.for_arrays(y["q"], y["k"], y["v"], y["g"], A=y["A"], h0=y["h0"],
                                     check_dtypes=False)
    assert spec.decay == "selective" and spec.q_shape == (b, 1, l, k)


@pytest.mark.parametrize("options", OPTIONS + [dict(batch="batch", length="L", groups=2)])
def test_round_trip(options):
    spec = selective_spec(**options)
    m = spec.as_matrix()
    assert m.as_selective() == spec
    assert (m.decay, m.layout, m.heads, m.key, m.value) == (
        "selective", "channel_major", spec.groups or 1, spec.dstate, spec.dim // (spec.groups or 1))
    # same bytes: every buffer has as many elements as its selective namesake
    mine = spec.buffer_shapes()
    for name, shape in m.buffer_shapes().items():
        other = mine[TO_SELECTIVE[name]]
        if not spec.is_symbolic:
            assert np.prod(shape) == np.prod(other), name


def test_not_mambas_form_has_no_selective_counterpart():
    base = selective_spec(groups=2).as_matrix()
    fields = base.__dict__
    assert MatrixScanSpec(**{**fields, "reverse": True}).as_selective() is None
    assert MatrixScanSpec(**{**fields, "layout": "time_major"}).as_selective() is None
    shared_batch = (1,) + base.k_shape[1:]
    assert MatrixScanSpec(**{**fields, "k_shape": shared_batch, "q_shape": shared_batch}).as_selective() is None
    gla = MatrixScanSpec.create(2, 3, 5, 4, 4, decay="key", layout="channel_major")
    assert gla.as_selective() is None


def test_bad_specs_name_the_operand():
    with pytest.raises(ValueError, match="dt_bias"):
        MatrixScanSpec.create(1, 2, 5, 4, 4, decay="key", has_dt_bias=True)
    with pytest.raises(ValueError, match="layout"):
        MatrixScanSpec.create(1, 2, 5, 4, 4, layout="bhld")
    q = np.zeros((1, 2, 5, 4))
    with pytest.raises(ValueError, match="A: expected shape"):
        MatrixScanSpec.for_arrays(q, q, q, q, A=np.zeros((2, 4, 3)), check_dtypes=False)
    with pytest.raises(ValueError, match="z: expected shape"):
        MatrixScanSpec.for_arrays(q, q, q, check_dtypes=False, z=np.zeros((1, 2, 5, 3)))
    with pytest.raises(ValueError, match="A: this spec takes no A"):
        MatrixScanSpec.for_arrays(q, q, q, A=np.zeros((2, 4, 4)), check_dtypes=False)
    with pytest.raises(ValueError, match="A: dtype"):
        MatrixScanSpec.for_arrays(*(x.astype(np.float32) for x in (q, q, q, q)),
                                  A=np.zeros((2, 4, 4)))


def test_relax_call_and_interpreter():
    """The instance travels as ``scanweaver.matrix_scan`` (JSON round trip, output types from
    the channel-major operands' symbolic dims) and the interpreter evaluates it."""
    spec = selective_spec(batch="batch", length="L", groups=2).as_matrix()
    b, l = tvm.tirx.Var("b", "int64"), tvm.tirx.Var("l", "int64")
    params = [relax.Var(n, relax.TensorType([b if d == "batch" else l if d == "L" else d for d in s],
                                            spec.operand_dtypes()[n]))
              for n, s in spec.operand_shapes().items()]
    call = make_scan(spec, params)
    assert parse_scan(call)[0] == spec
    def dims(ty):   # the operands' own vars flow into the result
        return [d if isinstance(d, tvm.tirx.Var) else int(d) for d in ty.shape]

    o_ty, last_ty = call.ty_args[0].fields
    assert dims(o_ty)[1:3] == [2, 4] and dims(o_ty)[0].same_as(b) and dims(o_ty)[3].same_as(l)
    assert dims(last_ty)[1:] == [2, 4, 3] and dims(last_ty)[0].same_as(b)
    concrete = selective_spec(groups=2)
    x = selective_arrays(concrete, np.random.default_rng(5))
    y = as_matrix_arrays(concrete, x)
    got = _scan(concrete.as_matrix(), [y[n] for n in concrete.as_matrix().operand_names()])
    for g, w in zip(got, selective_reference(concrete, x)):
        np.testing.assert_allclose(g.reshape(w.shape), w, rtol=1e-10)


def _run_instance(kernel, spec, y):
    m = spec.as_matrix()
    shapes = [s for n, s in m.buffer_shapes().items() if n not in m.operand_names()]
    return run(kernel, [y[n] for n in m.operand_names()], shapes, spec.dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("options", [dict(), dict(groups=2, length=1), dict(has_h0=False, length=65)])
def test_selective_kernel_serves_the_matrix_instance(dtype, options):
    spec = selective_spec(dtype=dtype, **options)
    m = spec.as_matrix()
    assert "selective_cpu" in tir_schedules._preferred(m, "cpu")
    kernel = tvm.compile(tvm.IRModule({"scanweaver_scan": tir_schedules.realize(
        m, "llvm", schedule="selective_cpu")}), target="llvm")["scanweaver_scan"]
    x = selective_arrays(spec, np.random.default_rng(7), NP_DTYPES[dtype])
    want = selective_reference(spec, {n: v.astype(np.float64) for n, v in x.items()})
    for g, w, name in zip(_run_instance(kernel, spec, as_matrix_arrays(spec, x)), want, ("o", "last")):
        assert_close(g.reshape(w.shape), w, dtype, name)


def scan_module(spec):
    """A Relax module whose ``main`` is the one ``scanweaver.matrix_scan`` of ``spec`` (a
    symbolic extent is a function shape var)."""
    dims = {"batch": tvm.tirx.Var("b", "int64"), "L": tvm.tirx.Var("l", "int64")}
    params = [relax.Var(n, relax.TensorType([dims.get(d, d) for d in s], spec.operand_dtypes()[n]))
              for n, s in spec.operand_shapes().items()]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(make_scan(spec, params))
        bb.emit_func_output(out)
    return bb.get()


def check_compiled(vm, concrete, seed):
    """``vm``'s ``main`` on fresh operands of the selective scan ``concrete`` (passed as its
    matrix instance's) equals the selective oracle."""
    x = selective_arrays(concrete, np.random.default_rng(seed), np.float32)
    y = as_matrix_arrays(concrete, x)
    names = concrete.as_matrix().operand_names()
    got = vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(y[n])) for n in names])
    want = selective_reference(concrete, {n: v.astype(np.float64) for n, v in x.items()})
    for g, w, name in zip(got, want, ("o", "last")):
        assert_close(g.numpy().astype(np.float64).reshape(w.shape), w, "float32", name)


def test_symbolic_instance_through_lower_scans():
    """A ``scanweaver.matrix_scan`` of the instance with symbolic batch and L, lowered and
    compiled once, is right at several sizes."""
    import scanweaver_tvm as sw

    spec = selective_spec(batch="batch", length="L", groups=2).as_matrix()
    vm = relax.VirtualMachine(sw.compile(scan_module(spec), "llvm"), tvm.cpu())
    for batch, length in ((1, 1), (3, 40)):
        check_compiled(vm, selective_spec(batch=batch, length=length, groups=2), length)


def test_cuda_kernel_of_the_selective_form_compiles_for_the_instance():
    """The borrowed CUDA kernel builds (ptxas) on the instance's buffers; its run is the GPU
    check still to do."""
    spec = selective_spec(batch=1, dim=64, length=33, dstate=16).as_matrix()
    func = tir_schedules.realize(spec, "cuda", schedule="selective_gpu")
    assert [p.name for p in func.params] == spec.operand_names() + ["o", "last"]
    lib = tvm.compile(tvm.IRModule({"scanweaver_scan": func}), target="cuda")
    assert "scanweaver_scan" in lib.mod.imports[0].inspect_source()



def test_mlir_route_takes_the_selective_kernel_for_the_instance():
    """``realization="mlir"`` on a matrix scan in Mamba's form: the bridge's selective kernel
    on the instance's buffers, equal to the oracle."""
    import scanweaver_tvm as sw

    concrete = selective_spec(groups=2, length=19)
    vm = relax.VirtualMachine(sw.compile(scan_module(concrete.as_matrix()), "llvm",
                                         realization="mlir"), tvm.cpu())
    check_compiled(vm, concrete, 11)


@pytest.mark.parametrize("spec", [selective_spec(groups=3, dim=6, length=37),
                                  selective_spec(batch="batch", length="L", has_h0=False)])
def test_matrix_kernel_serves_the_selective_scan(spec):
    """``schedule="matrix_cpu"`` on a ``SelectiveScanSpec``: the matrix kernel generated for
    ``as_matrix()``, called with the selective scan's own arguments (what ``bench.scan`` times)."""
    func = tir_schedules.realize(spec, "llvm", schedule="matrix_cpu")
    assert [p.name for p in func.params] == list(spec.buffer_shapes())
    kernel = tvm.compile(tvm.IRModule({"scanweaver_scan": func}), target="llvm")["scanweaver_scan"]
    batch, length = (2, 37) if not spec.is_symbolic else (3, 29)
    concrete = selective_spec(batch=batch, dim=spec.dim, length=length, groups=spec.groups,
                              has_h0=spec.has_h0)
    x = selective_arrays(concrete, np.random.default_rng(length), np.float32)
    want = selective_reference(concrete, {n: v.astype(np.float64) for n, v in x.items()})
    got = run(kernel, list(x.values()), [w.shape for w in want], "float32")
    for g, w, name in zip(got, want, ("out", "last_state")):
        assert_close(g, w, "float32", name)
