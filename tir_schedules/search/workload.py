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

from scanweaver_core.algebra import LOG_FLOOR, log_apply, log_step
from scanweaver_core.spec import (AffineScanSpec, DeltaScanSpec, MatrixScanSpec, MLSTMScanSpec, SelectiveScanSpec,
                                  StabilizedScanSpec)

BLOCK = "scan"
SPEC_ATTR = "scanweaver.spec"
F32 = "float32"
_KINDS = {"affine": AffineScanSpec, "selective": SelectiveScanSpec, "matrix": MatrixScanSpec,
          "stabilized": StabilizedScanSpec, "mlstm": MLSTMScanSpec, "delta": DeltaScanSpec}


def form_of(spec):
    """``"affine"``, ``"selective"``, ``"matrix"``, ``"stabilized"``, ``"mlstm"`` or ``"delta"``: the ``FORM`` of the
    spec's realizations."""
    for form, kind in _KINDS.items():
        if isinstance(spec, kind):
            return form
    raise TypeError(f"spec: expected one of {[k.__name__ for k in _KINDS.values()]}, "
                    f"got {type(spec).__name__}")


def spec_to_json(spec):
    """The spec as JSON, tagged with its form (the workload carries it as a function attribute,
    so a builder in another process knows what to realize)."""
    return json.dumps({"form": form_of(spec), **dataclasses.asdict(spec)}, sort_keys=True)


def spec_from_json(text):
    fields = json.loads(text)
    kind = _KINDS[fields.pop("form")]
    # JSON has no tuples: the shape fields (affine's outputs too) come back as lists
    return kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


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
    return {"affine": _affine, "selective": _selective, "matrix": _matrix,
            "stabilized": _stabilized, "mlstm": _mlstm, "delta": _delta}[form_of(spec)](spec)


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


def _matrix(spec):
    """One block per (batch, head, state column c): the K-vector S[:, c] and its readout
    sum_i q[i] S[i, c] (o_t[c] = q_t^T S_t[:, c]), then the skip ``+ D[c] v[c]`` and the gate
    ``* silu(z[c])``; the selective decay is ``exp(dt'[c] A[i, c])`` with the input
    ``k[i] dt'[c] v[c]``, dt' = softplus(dt + dt_bias) (each optional).  Indices are logical,
    (b, h, t, .); operands broadcast on B, H (g also on L) are read at index 0 there, and a
    channel-major buffer swaps its last two."""
    dt, heads, n_k, n_v = spec.dtype, spec.heads, spec.key, spec.value
    shapes = spec.buffer_shapes()
    dtypes = {**spec.operand_dtypes(), "o": dt, "last": dt}
    logical = {**spec.logical_shapes(), "o": (spec.batch, heads, spec.length, n_v),
               "last": (spec.batch, heads, n_k, n_v)}
    lanes = spec.batch * heads * n_v
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name("main")
            T.func_attr({"tirx.noalias": True, SPEC_ATTR: spec_to_json(spec)})
            bufs = {name: T.arg(name, T.buffer(shape, dtypes[name])) for name, shape in shapes.items()}

            def at(name, index):
                index = [0 if n == 1 else i for n, i in zip(logical[name], index)]
                swap = spec.layout == "channel_major" and name not in ("dt_bias", "D")
                return index[:-2] + index[:-3:-1] if swap else index

            def load(name, *index):
                return _f32(bufs[name][tuple(at(name, index))], dtypes[name])

            def store(name, value, index):
                T.buffer_store(bufs[name], value if dt == F32 else tirx.Cast(dt, value),
                               at(name, index))

            with T.sblock("root"):
                with T.serial(0, lanes) as lane:
                    with T.sblock(BLOCK):
                        vl = T.axis.spatial(lanes, lane)
                        bi, hi, c = vl // (heads * n_v), vl // n_v % heads, vl % n_v
                        state = T.sblock_alloc_buffer((n_k,), F32, scope="local")
                        y = T.sblock_alloc_buffer((3,), F32, scope="local")   # o, dt', z
                        with T.serial(0, n_k) as i:
                            T.buffer_store(state, load("h0", bi, hi, i, c) if spec.has_h0 else
                                           tirx.const(0.0, F32), [i])
                        with T.serial(0, spec.length) as s:
                            t = spec.length - 1 - s if spec.reverse else s
                            T.buffer_store(y, tirx.const(0.0, F32), [0])
                            v_t = load("v", bi, hi, t, c)
                            if spec.decay == "selective":
                                x = load("dt", bi, hi, t, c)
                                T.buffer_store(y, x + load("dt_bias", hi, c) if spec.has_dt_bias
                                               else x, [1])
                                if spec.dt_softplus:
                                    T.buffer_store(y, tirx.max(y[1], 0.0) +
                                                   T.log1p(T.exp(-tirx.abs(y[1]))), [1])
                            with T.serial(0, n_k) as i:
                                g_at = {"scalar": 0, "key": i, "value": c}.get(spec.decay)
                                if spec.decay == "selective":
                                    decay = T.exp(y[1] * load("A", hi, i, c))
                                    old, kv = decay * state[i], load("k", bi, hi, t, i) * (y[1] * v_t)
                                else:
                                    old = state[i] if g_at is None else load("g", bi, hi, t, g_at) * state[i]
                                    kv = load("k", bi, hi, t, i) * v_t
                                T.buffer_store(state, old + kv, [i])
                                T.buffer_store(y, y[0] + load("q", bi, hi, t, i) * state[i], [0])
                            if spec.has_skip:
                                T.buffer_store(y, y[0] + load("D", hi, c) * v_t, [0])
                            if spec.has_gate:
                                T.buffer_store(y, load("z", bi, hi, t, c), [2])
                                T.buffer_store(y, y[0] * y[2] / (1.0 + T.exp(-y[2])), [0])
                            store("o", y[0], [bi, hi, t, c])
                        if spec.return_last_state:
                            with T.serial(0, n_k) as i:
                                store("last", state[i], [bi, hi, i, c])
    return ib.get()


def _stabilized(spec):
    """One block per (batch, channel): the state (num, den, max) in a local buffer, the step
    ``algebra.log_apply`` (with the bonus readout before it)."""
    dtypes = spec.buffer_dtypes()
    lanes = spec.batch * spec.channels
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name("main")
            T.func_attr({"tirx.noalias": True, SPEC_ATTR: spec_to_json(spec)})
            bufs = {n: T.arg(n, T.buffer(shape, dtypes[n])) for n, shape in spec.buffer_shapes().items()}
            with T.sblock("root"):
                with T.serial(0, lanes) as lane:
                    with T.sblock(BLOCK):
                        vl = T.axis.spatial(lanes, lane)
                        b, c = vl // spec.channels, vl % spec.channels
                        h = T.sblock_alloc_buffer((4,), F32, scope="local")
                        start = {"num": 0.0, "den": 0.0, "max": LOG_FLOOR}
                        for i, name in enumerate(("num", "den", "max")):
                            given = spec.has_h0 and name in spec.state_names()
                            T.buffer_store(h, bufs[f"{name}0"][b, c] if given else tirx.const(start[name], F32), [i])
                        with T.serial(0, spec.length) as s:
                            t = spec.length - 1 - s if spec.reverse else s
                            at = [b, t, c] if spec.layout == "time_major" else [b, c, t]
                            k = _f32(bufs["k"][at], spec.dtype)
                            v = _f32(bufs["v"][at], spec.dtype) if spec.has_values else None
                            w = tirx.const(0.0, F32) if spec.decay == "none" else \
                                bufs["w"][c] if spec.decay == "channel" else _f32(bufs["w"][at], spec.dtype)
                            state = (h[0] if spec.has_values else None, h[1], h[2])
                            ops = (T.exp, tirx.max)
                            if spec.has_bonus:
                                read = log_apply(log_step(tirx.const(0.0, F32), bufs["u"][c] + k, v), state, *ops)
                                T.buffer_store(h, _readout(read), [3])
                            new = log_apply(log_step(w, k, v), state, *ops)
                            for i, x in enumerate(new):
                                if x is not None:
                                    T.buffer_store(h, x, [i])
                            if not spec.has_bonus:
                                T.buffer_store(h, _readout((h[0] if spec.has_values else None, h[1], h[2])), [3])
                            out = h[3]
                            T.buffer_store(bufs["out"], tirx.Cast(spec.dtype, out) if spec.dtype != F32 else out, at)
                        if spec.return_last_state:
                            for i, name in enumerate(("num", "den", "max")):
                                if name in spec.state_names():
                                    T.buffer_store(bufs[f"last_{name}"], h[i], [b, c])
    return ib.get()


def _mlstm(spec):
    """One block per (batch, head, column c of V): the column ``C[:, c]``, the normalizer ``n``
    and the max ``m`` in local buffers, the step as ``MLSTMScanSpec`` writes it; the first
    column of a head writes the final ``n`` and ``m``."""
    dtypes, n_k = spec.buffer_dtypes(), spec.key
    lanes = spec.batch * spec.heads * spec.value
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name("main")
            T.func_attr({"tirx.noalias": True, SPEC_ATTR: spec_to_json(spec)})
            bufs = {n: T.arg(n, T.buffer(shape, dtypes[n])) for n, shape in spec.buffer_shapes().items()}
            with T.sblock("root"):
                with T.serial(0, lanes) as lane:
                    with T.sblock(BLOCK):
                        vl = T.axis.spatial(lanes, lane)
                        b, h, c = vl // (spec.heads * spec.value), vl // spec.value % spec.heads, vl % spec.value
                        col = T.sblock_alloc_buffer((n_k,), F32, scope="local")
                        nrm = T.sblock_alloc_buffer((n_k,), F32, scope="local")
                        m = T.sblock_alloc_buffer((4,), F32, scope="local")   # m, num, den, new m
                        with T.serial(0, n_k) as i:
                            T.buffer_store(col, bufs["C0"][b, h, i, c] if spec.has_h0 else tirx.const(0.0, F32), [i])
                            given = spec.has_h0 and spec.normalized
                            T.buffer_store(nrm, bufs["n0"][b, h, i] if given else tirx.const(0.0, F32), [i])
                        T.buffer_store(m, bufs["m0"][b, h] if spec.has_h0 else tirx.const(0.0, F32), [0])
                        with T.serial(0, spec.length) as s:
                            t = spec.length - 1 - s if spec.reverse else s
                            f = _f32(bufs["f"][b, h, t], spec.dtype)
                            ig = _f32(bufs["i"][b, h, t], spec.dtype)
                            T.buffer_store(m, tirx.max(f + m[0], ig), [3])
                            T.buffer_store(m, tirx.const(0.0, F32), [1])
                            T.buffer_store(m, tirx.const(0.0, F32), [2])
                            with T.serial(0, n_k) as i:
                                a, g = T.exp(f + m[0] - m[3]), T.exp(ig - m[3])
                                k = _f32(bufs["k"][b, h, t, i], spec.dtype)
                                q = _f32(bufs["q"][b, h, t, i], spec.dtype)
                                T.buffer_store(col, a * col[i] + g * k * _f32(bufs["v"][b, h, t, c], spec.dtype), [i])
                                T.buffer_store(nrm, a * nrm[i] + g * k, [i])
                                T.buffer_store(m, m[1] + q * col[i], [1])
                                T.buffer_store(m, m[2] + q * nrm[i], [2])
                            T.buffer_store(m, m[3], [0])
                            out = m[1] / (tirx.max(T.abs(m[2]), T.exp(-m[0])) + tirx.const(spec.eps, F32)) \
                                if spec.normalized else m[1]
                            T.buffer_store(bufs["h"], out if spec.dtype == F32 else tirx.Cast(spec.dtype, out),
                                           [b, h, t, c])
                        if spec.return_last_state:
                            with T.serial(0, n_k) as i:
                                T.buffer_store(bufs["last_C"], col[i], [b, h, i, c])
                            with T.If(c == 0):
                                with T.Then():
                                    if spec.normalized:
                                        with T.serial(0, n_k) as i:
                                            T.buffer_store(bufs["last_n"], nrm[i], [b, h, i])
                                    T.buffer_store(bufs["last_m"], m[0], [b, h])
    return ib.get()


def _delta(spec):
    """One block per (batch, head, column c of V): the column ``S[:, c]`` in a local buffer (the
    delta rule's columns are independent: ``u_c = beta (v_c - p^T D S[:, c])``), the step as
    ``DeltaScanSpec`` writes it (either rule), q/k/p norms recomputed per column."""
    dtypes, n_k = spec.buffer_dtypes(), spec.key
    lanes = spec.batch * spec.heads * spec.value
    zero = tirx.const(0.0, F32)
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name("main")
            T.func_attr({"tirx.noalias": True, SPEC_ATTR: spec_to_json(spec)})
            bufs = {n: T.arg(n, T.buffer(shape, dtypes[n])) for n, shape in spec.buffer_shapes().items()}
            with T.sblock("root"):
                with T.serial(0, lanes) as lane:
                    with T.sblock(BLOCK):
                        vl = T.axis.spatial(lanes, lane)
                        b, h, c = vl // (spec.heads * spec.value), vl // spec.value % spec.heads, vl % spec.value
                        hk = h // spec.group
                        col = T.sblock_alloc_buffer((n_k,), F32, scope="local")
                        acc = T.sblock_alloc_buffer((5,), F32, scope="local")   # read, out, |q|^2, |k|^2, |p|^2
                        with T.serial(0, n_k) as i:
                            T.buffer_store(col, bufs["S0"][b, h, i, c] if spec.has_h0 else zero, [i])
                        with T.serial(0, spec.length) as s:
                            t = spec.length - 1 - s if spec.reverse else s
                            names = ["q", "k"] + (["p"] if spec.separate_read else []) + \
                                (["a", "b"] if spec.is_dplr else [])

                            def ld(name, i):
                                return _f32(bufs[name][b, hk, t, i], spec.dtype)

                            def norm(j):
                                return T.sqrt(acc[2 + j] + tirx.const(1e-6, F32)) if spec.l2norm else None
                            for j in range(5):
                                T.buffer_store(acc, zero, [j])
                            if spec.l2norm:
                                with T.serial(0, n_k) as i:
                                    for j, n in enumerate(names):
                                        T.buffer_store(acc, acc[2 + j] + ld(n, i) * ld(n, i), [2 + j])

                            def vec(name, i):
                                j = names.index(name)
                                x = ld(name, i) if norm(j) is None else ld(name, i) / norm(j)
                                return x * tirx.const(spec.scale, F32) if name == "q" else x
                            with T.serial(0, n_k) as i:
                                d = (T.exp(_f32(bufs["g"][b, h, t], spec.dtype)) if spec.decay == "head" else
                                     T.exp(_f32(bufs["g"][b, h, t, i], spec.dtype)) if spec.decay == "key" else None)
                                if spec.is_dplr:            # the DPLR rule reads before the decay
                                    T.buffer_store(acc, acc[0] + vec("a", i) * col[i], [0])
                                if d is not None:
                                    T.buffer_store(col, d * col[i], [i])
                                if not spec.is_dplr:
                                    T.buffer_store(acc, acc[0] + vec("p" if spec.separate_read else "k", i) * col[i], [0])
                            v_c = _f32(bufs["v"][b, h, t, c], spec.dtype)
                            if not spec.is_dplr:
                                T.buffer_store(acc, _f32(bufs["beta"][b, h, t], spec.dtype) * (v_c - acc[0]), [0])
                            with T.serial(0, n_k) as i:
                                new = (col[i] + vec("b", i) * acc[0] + vec("k", i) * v_c if spec.is_dplr else
                                       col[i] + vec("k", i) * acc[0])
                                T.buffer_store(col, new, [i])
                                T.buffer_store(acc, acc[1] + vec("q", i) * col[i], [1])
                            T.buffer_store(bufs["o"], acc[1] if spec.dtype == F32 else tirx.Cast(spec.dtype, acc[1]),
                                           [b, h, t, c])
                        if spec.return_last_state:
                            with T.serial(0, n_k) as i:
                                T.buffer_store(bufs["last_S"], col[i], [b, h, i, c])
    return ib.get()


def _readout(state):
    num, den, top = state
    return num / den if num is not None else top + T.log(den)
