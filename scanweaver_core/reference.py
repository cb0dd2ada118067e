"""Float64 numpy oracles for both scan forms: the reference every test compares against.

Deliberately the plain sequential loop, written for clarity, not speed.
"""
import numpy as np

from .algebra import apply
from .spec import AffineScanSpec, MatrixScanSpec, SelectiveScanSpec

__all__ = ["affine_scan", "last_state", "softplus", "selective_scan", "matrix_scan"]


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


def affine_scan(a, b, h0=None, axis=-1, reverse=False):
    """All states ``h_t = a_t*h_{t-1} + b_t`` along ``axis`` (float64, b's shape).

    ``a`` broadcasts against ``b``; ``h0`` (b's shape without the axis) defaults to zeros.
    """
    a, b = np.asarray(a), np.asarray(b)
    spec = AffineScanSpec.create(b.shape, a.shape, axis, reverse, h0 is not None, "float32")
    a = np.moveaxis(np.broadcast_to(_f64(a).reshape(spec.a_shape), b.shape), spec.axis, 0)
    b = np.moveaxis(_f64(b), spec.axis, 0)
    h = np.zeros(b.shape[1:]) if h0 is None else _f64(h0).copy()
    out = np.empty_like(b)
    steps = range(b.shape[0] - 1, -1, -1) if reverse else range(b.shape[0])
    for t in steps:
        h = apply((a[t], b[t]), h)
        out[t] = h
    return np.moveaxis(out, 0, spec.axis)


def last_state(states, axis=-1, reverse=False):
    """The final state of a scan's output: the last step, or the first one when reversed."""
    return np.take(states, 0 if reverse else states.shape[axis] - 1, axis=axis)


def softplus(x):
    return np.logaddexp(0.0, x)


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   h0=None, return_last_state=False):
    """Mamba's selective scan in float64.

    ``h = exp(delta*A) h + delta*B*u`` per (batch, channel, state), ``y = sum_n C*h``,
    ``out = (y + D*u) * silu(z)``.  Returns ``out (B,D,L)`` or ``(out, last_state (B,D,N))``.
    """
    spec = SelectiveScanSpec.for_arrays(*(np.asarray(x) if x is not None else None for x in
                                          (u, delta, A, B, C, D, z, delta_bias)),
                                        delta_softplus=delta_softplus,
                                        h0=None if h0 is None else np.asarray(h0),
                                        return_last_state=return_last_state, check_dtypes=False)
    u, delta, A, B, C = (_f64(x) for x in (u, delta, A, B, C))
    if delta_bias is not None:
        delta = delta + _f64(delta_bias)[None, :, None]
    if delta_softplus:
        delta = softplus(delta)
    if spec.groups:  # (B,G,N,L) -> (B,D,N,L): channel d reads group d // (D/G)
        B = np.repeat(B, spec.dim // spec.groups, axis=1)
        C = np.repeat(C, spec.dim // spec.groups, axis=1)
    else:            # (B,N,L) -> (B,1,N,L)
        B, C = B[:, None], C[:, None]
    h = np.zeros((spec.batch, spec.dim, spec.dstate)) if h0 is None else _f64(h0).copy()
    y = np.empty_like(u)
    for t in range(spec.length):
        decay = np.exp(delta[:, :, t, None] * A[None])                  # (B,D,N)
        drive = delta[:, :, t, None] * B[:, :, :, t] * u[:, :, t, None]  # (B,D,N)
        h = apply((decay, drive), h)
        y[:, :, t] = np.sum(h * C[:, :, :, t], axis=-1)
    out = y if D is None else y + _f64(D)[None, :, None] * u
    if z is not None:
        z = _f64(z)
        out = out * z / (1.0 + np.exp(-z))
    return (out, h) if return_last_state else out


def matrix_scan(q, k, v, g=None, decay=None, h0=None, reverse=False, return_last_state=False,
                A=None, dt_bias=None, dt_softplus=False, D=None, z=None, layout="time_major"):
    """The matrix-state recurrence of ``MatrixScanSpec`` in float64: per (batch, head)
    ``S = g_t * S + outer(k_t, v_t)`` (``g_t`` a scalar, a K-vector scaling rows or a V-vector
    scaling columns, per ``decay``; with ``A`` the selective decay: ``g`` is dt, optionally
    ``softplus(dt + dt_bias)``, ``S = exp(dt_t[v] * A[k, v]) * S + outer(k_t, dt_t * v_t)``),
    ``o_t = (q_t @ S + D * v_t) * silu(z_t)`` (skip and gate when given).  Arrays in
    ``layout`` (see the spec) broadcast on B and H (``g`` also on L).  Returns ``o`` or
    ``(o, S)`` in that layout."""
    arrays = {n: None if x is None else np.asarray(x) for n, x in
              dict(q=q, k=k, v=v, g=g, h0=h0, A=A, dt_bias=dt_bias, D=D, z=z).items()}
    spec = MatrixScanSpec.for_arrays(*(arrays[n] for n in "qkvg"), decay=decay, h0=arrays["h0"],
                                     reverse=reverse, return_last_state=return_last_state,
                                     check_dtypes=False, A=arrays["A"], dt_bias=arrays["dt_bias"],
                                     dt_softplus=dt_softplus, D=arrays["D"], z=arrays["z"],
                                     layout=layout)
    if layout == "channel_major":   # to (B, H, L, .) and (B, H, K, V), and back at the end
        arrays = {n: None if x is None else x if n in ("dt_bias", "D") else np.swapaxes(x, -1, -2)
                  for n, x in arrays.items()}
    x = {n: _f64(a) for n, a in arrays.items()}
    bh = (spec.batch, spec.heads)
    q, k, v = (np.broadcast_to(x[n], bh + x[n].shape[2:]) for n in "qkv")
    if g is not None:
        g = np.broadcast_to(x["g"], bh + (spec.length, x["g"].shape[-1]))
    if spec.decay == "selective":
        g = g + x["dt_bias"][None, :, None, :] if dt_bias is not None else g
        g = softplus(g) if dt_softplus else g
    state = np.zeros((spec.batch, spec.heads, spec.key, spec.value)) if h0 is None else x["h0"].copy()
    out = np.empty((spec.batch, spec.heads, spec.length, spec.value))
    steps = range(spec.length - 1, -1, -1) if reverse else range(spec.length)
    for t in steps:
        decay_t, v_t = 1.0, v[:, :, t]
        if spec.decay in ("scalar", "key"):
            decay_t = g[:, :, t, :, None]                # (B, H, 1 | K, 1)
        elif spec.decay == "value":
            decay_t = g[:, :, t, None, :]                # (B, H, 1, V)
        elif spec.decay == "selective":
            decay_t = np.exp(g[:, :, t, None, :] * x["A"][None])    # (B, H, K, V)
            v_t = g[:, :, t] * v_t
        state = apply((decay_t, k[:, :, t, :, None] * v_t[:, :, None, :]), state)
        out[:, :, t] = np.einsum("bhk,bhkv->bhv", q[:, :, t], state)
    if D is not None:
        out = out + x["D"][None, :, None, :] * v
    if z is not None:
        out = out * x["z"] / (1.0 + np.exp(-x["z"]))
    if layout == "channel_major":
        out, state = np.swapaxes(out, -1, -2), np.swapaxes(state, -1, -2)
    return (out, state) if return_last_state else out
