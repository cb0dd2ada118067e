"""The canonical workload of a scan: what a MetaSchedule task is keyed by.

A plain sequential scan written with ``T.sblock``s (one block per lane, the step loop inside),
with exactly the arguments of every realization of the spec (names, shapes, dtypes, order).
So it is correct and runnable on its own, the runner's argument info taken from it fits the
realized kernel, and its structural hash is a stable database key for the spec.  The search
never schedules it: it only annotates the ``scan`` block with the sampled knobs
(``realize.py`` turns those into the real kernel).
"""
import dataclasses
import json

import tvm
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from scanweaver_core.spec import AffineScanSpec, SelectiveScanSpec

BLOCK = "scan"
SPEC_ATTR = "scanweaver.spec"
F32 = "float32"
_KINDS = {"affine": AffineScanSpec, "selective": SelectiveScanSpec}


def spec_to_json(spec):
    """The spec as JSON, tagged with its form (the workload carries it as a function attribute,
    so a builder in another process knows what to realize)."""
    form = "affine" if isinstance(spec, AffineScanSpec) else "selective"
    return json.dumps({"form": form, **dataclasses.asdict(spec)}, sort_keys=True)


def spec_from_json(text):
    fields = json.loads(text)
    kind = _KINDS[fields.pop("form")]
    if kind is AffineScanSpec:
        fields["shape"], fields["a_shape"] = tuple(fields["shape"]), tuple(fields["a_shape"])
        fields["outputs"] = tuple(fields["outputs"])
    return kind(**fields)


def workload_spec(mod):
    """The spec a workload (or an annotated copy of it) was made from."""
    func = mod["main"] if hasattr(mod, "functions_items") else mod
    text = func.attrs.get(SPEC_ATTR) if func.attrs is not None else None
    if text is None:
        raise ValueError(f"workload: function has no {SPEC_ATTR!r} attribute; "
                         "not made by tir_schedules.search.scan_workload")
    return spec_from_json(str(text))


def require_static(spec):
    """Raise ``ValueError`` for a symbolic spec: tuning times kernels, so every extent must be
    concrete (a symbolic scan keeps its realization's default config)."""
    if getattr(spec, "is_symbolic", False):
        raise ValueError(f"spec: {spec} has symbolic extents; tuning needs concrete shapes "
                         "(a symbolic scan is not tunable and keeps its default config)")


def scan_workload(spec):
    """The workload PrimFunc ``main`` of ``spec`` (concrete extents only: tuning measures it)."""
    require_static(spec)
    if isinstance(spec, AffineScanSpec):
        return _affine(spec)
    if isinstance(spec, SelectiveScanSpec):
        return _selective(spec)
    raise TypeError(f"spec: expected AffineScanSpec or SelectiveScanSpec, got {type(spec).__name__}")


def workload_module(spec):
    """``IRModule({"main": scan_workload(spec)})``: the form tuning records are keyed by."""
    return tvm.IRModule({"main": scan_workload(spec)})


def _f32(x, dtype):
    return x if dtype == F32 else tirx.Cast(F32, x)


def _unravel(index, shape):
    out = []
    for n in reversed(shape):
        out.append(tirx.floormod(index, n))
        index = tirx.floordiv(index, n)
    return list(reversed(out))


def _affine(spec):
    dt, ax, length = spec.dtype, spec.axis, spec.length
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name("main")
            T.func_attr({"tirx.noalias": True, SPEC_ATTR: spec_to_json(spec)})
            a = T.arg("a", T.buffer(spec.a_shape, dt))
            b = T.arg("b", T.buffer(spec.shape, dt))
            h0 = T.arg("h0", T.buffer(spec.state_shape, dt)) if spec.has_h0 else None
            states = T.arg("states", T.buffer(spec.shape, dt)) if "states" in spec.outputs else None
            last = T.arg("last", T.buffer(spec.state_shape, dt)) if "last" in spec.outputs else None
            with T.sblock("root"):
                with T.serial(0, spec.lanes) as lane:
                    with T.sblock(BLOCK):
                        vl = T.axis.spatial(spec.lanes, lane)
                        h = T.sblock_alloc_buffer((1,), F32, scope="local")
                        rest = _unravel(vl, spec.state_shape) if spec.state_shape else []
                        T.buffer_store(h, _f32(h0[tuple(rest)], dt) if h0 is not None else
                                       tirx.const(0.0, F32), [0])
                        with T.serial(0, length) as s:
                            t = length - 1 - s if spec.reverse else s
                            idx = rest[:ax] + [t] + rest[ax:]
                            a_idx = [0 if n == 1 else i for i, n in zip(idx, spec.a_shape)]
                            T.buffer_store(h, _f32(a[tuple(a_idx)], dt) * h[0] + _f32(b[tuple(idx)], dt), [0])
                            if states is not None:
                                T.buffer_store(states, tirx.Cast(dt, h[0]) if dt != F32 else h[0], idx)
                        if last is not None:
                            T.buffer_store(last, tirx.Cast(dt, h[0]) if dt != F32 else h[0], rest)
    return ib.get()


def _selective(spec):
    dt, n_state = spec.dtype, spec.dstate
    per_group = spec.dim // (spec.groups or 1)
    shapes = {"u": (spec.batch, spec.dim, spec.length), "A": (spec.dim, n_state), "BC": spec.bc_shape,
              "state": (spec.batch, spec.dim, n_state)}
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name("main")
            T.func_attr({"tirx.noalias": True, SPEC_ATTR: spec_to_json(spec)})
            u = T.arg("u", T.buffer(shapes["u"], dt))
            delta = T.arg("delta", T.buffer(shapes["u"], dt))
            A = T.arg("A", T.buffer(shapes["A"], F32))
            B = T.arg("B", T.buffer(shapes["BC"], dt))
            C = T.arg("C", T.buffer(shapes["BC"], dt))
            D = T.arg("D", T.buffer((spec.dim,), F32)) if spec.has_D else None
            z = T.arg("z", T.buffer(shapes["u"], dt)) if spec.has_z else None
            bias = T.arg("delta_bias", T.buffer((spec.dim,), F32)) if spec.has_delta_bias else None
            h0 = T.arg("h0", T.buffer(shapes["state"], dt)) if spec.has_h0 else None
            out = T.arg("out", T.buffer(shapes["u"], dt))
            last = T.arg("last_state", T.buffer(shapes["state"], dt)) if spec.return_last_state else None
            with T.sblock("root"):
                with T.serial(0, spec.batch * spec.dim) as lane:
                    with T.sblock(BLOCK):
                        vl = T.axis.spatial(spec.batch * spec.dim, lane)
                        bi, d = vl // spec.dim, vl % spec.dim
                        g = d // per_group
                        h = T.sblock_alloc_buffer((n_state,), F32, scope="local")
                        v = T.sblock_alloc_buffer((3,), F32, scope="local")  # delta, y, z
                        with T.serial(0, n_state) as n:
                            T.buffer_store(h, _f32(h0[bi, d, n], dt) if h0 is not None else
                                           tirx.const(0.0, F32), [n])
                        with T.serial(0, spec.length) as t:
                            x = _f32(delta[bi, d, t], dt) + (bias[d] if bias is not None else 0.0)
                            T.buffer_store(v, x, [0])
                            if spec.delta_softplus:
                                T.buffer_store(v, tirx.max(v[0], 0.0) + T.log1p(T.exp(-tirx.abs(v[0]))), [0])
                            T.buffer_store(v, tirx.const(0.0, F32), [1])
                            with T.serial(0, n_state) as n:
                                bc = (bi, g, n, t) if spec.groups else (bi, n, t)
                                decay = T.exp(v[0] * A[d, n])
                                drive = v[0] * _f32(B[bc], dt) * _f32(u[bi, d, t], dt)
                                T.buffer_store(h, decay * h[n] + drive, [n])
                                T.buffer_store(v, v[1] + _f32(C[bc], dt) * h[n], [1])
                            if D is not None:
                                T.buffer_store(v, v[1] + _f32(u[bi, d, t], dt) * D[d], [1])
                            if z is not None:
                                T.buffer_store(v, _f32(z[bi, d, t], dt), [2])
                                T.buffer_store(v, v[1] * v[2] / (1.0 + T.exp(-v[2])), [1])
                            T.buffer_store(out, tirx.Cast(dt, v[1]) if dt != F32 else v[1], [bi, d, t])
                        if last is not None:
                            with T.serial(0, n_state) as n:
                                T.buffer_store(last, tirx.Cast(dt, h[n]) if dt != F32 else h[n], [bi, d, n])
    return ib.get()
