"""The selective scan's buffers and its per-step staging, shared by its CPU and CUDA kernels:
the argument list in the README order, delta after bias and softplus, and the output's skip
and gate, all in float32."""
from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .fast_math import F32, silu, softplus
from .layout import buffer_layout, extent_vars


def extents(spec):
    """``(batch, length)``: ints, or the spec's int64 Vars where symbolic (pass to ``declare``)."""
    resolve = extent_vars(spec)
    return resolve(spec.batch), resolve(spec.length)


def declare(spec, batch, length):
    """The PrimFunc arguments in the README order (``batch``, ``length`` from ``extents``);
    absent options are None."""
    dt, (b, d, l, n) = spec.dtype, (batch, spec.dim, length, spec.dstate)
    bc = (b, spec.groups, n, l) if spec.groups else (b, n, l)
    bufs = {"u": ((b, d, l), dt), "delta": ((b, d, l), dt), "A": ((d, n), F32),
            "B": (bc, dt), "C": (bc, dt),
            "D": ((d,), F32) if spec.has_D else None,
            "z": ((b, d, l), dt) if spec.has_z else None,
            "delta_bias": ((d,), F32) if spec.has_delta_bias else None,
            "h0": ((b, d, n), dt) if spec.has_h0 else None,
            "out": ((b, d, l), dt),
            "last_state": ((b, d, n), dt) if spec.return_last_state else None}
    return {name: (T.arg(name, T.buffer(*sd, layout=buffer_layout(sd[0]))) if sd else None)
            for name, sd in bufs.items()}


def stage_delta(spec, ops, b, d, t, dt, du, native=False):
    """Store delta (after bias and softplus) and delta*u of channel d at step t, in float32,
    into the slots ``dt`` and ``du`` (``(buffer, index)`` pairs).  The input is stored before
    the softplus binds it: TVM's bf16 legalization miscompiles a Let whose value loads bf16."""
    (dbuf, di), (ubuf, ui) = dt, du
    x = tirx.Cast(F32, ops["delta"][b, d, t])
    T.buffer_store(dbuf, x + ops["delta_bias"][d] if spec.has_delta_bias else x, [di])
    if spec.delta_softplus:
        T.buffer_store(dbuf, softplus(dbuf[di], native), [di])
    T.buffer_store(ubuf, dbuf[di] * tirx.Cast(F32, ops["u"][b, d, t]), [ui])


def stage_output(spec, ops, b, d, t, y, scratch, native=False):
    """Turn the slot ``y`` (holding sum_n C*h) into ``(y + D*u) * silu(z)``, in float32;
    ``scratch`` receives z first (same bf16 reason).  Callers then cast y to the input dtype."""
    (ybuf, yi), (sbuf, si) = y, scratch
    if spec.has_D:
        T.buffer_store(ybuf, ybuf[yi] + tirx.Cast(F32, ops["u"][b, d, t]) * ops["D"][d], [yi])
    if spec.has_z:
        T.buffer_store(sbuf, tirx.Cast(F32, ops["z"][b, d, t]), [si])
        T.buffer_store(ybuf, ybuf[yi] * silu(sbuf[si], native), [yi])


def bc_index(spec, b, g, n, t):
    """Index of B/C for group g (ignored without groups)."""
    return (b, g, n, t) if spec.groups else (b, n, t)
