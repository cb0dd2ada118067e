"""Float64 numpy oracles for every scan form: the reference every test compares against.

Deliberately the plain sequential loop, written for clarity, not speed.
"""
import numpy as np

from .algebra import LOG_FLOOR, apply, log_apply, log_step
from .spec import (AffineScanSpec, DeltaScanSpec, MatrixScanSpec, MLSTMScanSpec, SelectiveScanSpec,
                   StabilizedScanSpec)

__all__ = ["affine_scan", "last_state", "softplus", "selective_scan", "matrix_scan",
           "stabilized_scan", "mlstm_scan", "delta_scan", "dplr_scan"]


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


def stabilized_scan(k, v=None, w=None, u=None, h0=None, reverse=False, return_last_state=False,
                    layout="time_major", method="direct"):
    """``StabilizedScanSpec``'s recurrence in float64: ``out`` (k's shape), or ``(out, state)``
    with ``state`` the tuple ``(num, den, max)`` after the last step (``(den, max)`` without
    ``v``), stabilized as the spec says.

    ``method="direct"`` computes every step from its definition, not from the previous one:
    the state after step t is the sum over steps s <= t of ``exp(k_s + w_{s+1} + ... + w_t)
    (v_s, 1)`` (and the initial state's ``exp(max0 + w_1 + ... + w_t) (num0, den0)``), whose
    log-weights are formed in float64 and summed by log-sum-exp (``max`` is their maximum,
    which is what the recurrence's max is).  O(L^2); ``method="loop"`` is the sequential
    stabilized recurrence (``algebra.log_apply``), O(L), what the interpreter runs."""
    arrays = [None if x is None else np.asarray(x) for x in (k, v, w, u)]
    h0 = None if h0 is None else tuple(np.asarray(x) for x in h0)
    spec = StabilizedScanSpec.for_arrays(*arrays, h0=h0, reverse=reverse,
                                         return_last_state=return_last_state, layout=layout,
                                         check_dtypes=False)
    k, v, w, u = (_f64(x) for x in arrays)
    if layout == "channel_major":          # to (B, L, C), and back at the end
        k, v = (None if x is None else np.swapaxes(x, 1, 2) for x in (k, v))
        w = np.swapaxes(w, 1, 2) if spec.decay == "step" else w
    w = np.zeros_like(k) if w is None else np.broadcast_to(w, k.shape)
    if reverse:
        k, v, w = (None if x is None else x[:, ::-1] for x in (k, v, w))
    state0 = None if h0 is None else tuple(_f64(x) for x in h0)
    if state0 is not None and v is None:
        state0 = (None,) + state0
    run = {"direct": _stabilized_direct, "loop": _stabilized_loop}[method]
    out, state = run(k, v, w, None if u is None else _f64(u), state0)
    if reverse:
        out = out[:, ::-1]
    if layout == "channel_major":
        out = np.swapaxes(out, 1, 2)
    out = np.ascontiguousarray(out)
    state = state if v is not None else state[1:]
    return (out, state) if return_last_state else out


def _readout(num, den, top):
    """``num / den``, or ``log(exp(top) den)`` without values."""
    if num is None:
        with np.errstate(divide="ignore"):
            return top + np.log(den)
    return num / den


def _stabilized_loop(k, v, w, u, state0):
    """The recurrence step by step, time on axis 1 (forward)."""
    batch, length, channels = k.shape
    if state0 is None:
        state0 = (None if v is None else np.zeros((batch, channels)), np.zeros((batch, channels)),
                  np.full((batch, channels), LOG_FLOOR))
    state = tuple(None if x is None else x.copy() for x in state0)
    out = np.empty_like(k)
    for t in range(length):
        v_t = None if v is None else v[:, t]
        if u is not None:   # read the state before the update, with the bonus step
            out[:, t] = _readout(*log_apply(log_step(0.0, u + k[:, t], v_t), state))
        state = log_apply(log_step(w[:, t], k[:, t], v_t), state)
        if u is None:
            out[:, t] = _readout(*state)
    return out, state


def _logsumexp_terms(logw, weights):
    """``(num', den', max)`` of terms ``exp(logw[i]) * weights[i]`` (time on axis 0; weights
    a (num weights or None, den weights) pair)."""
    top = np.maximum(np.max(logw, axis=0), LOG_FLOOR)   # all -inf: the empty sum's max
    scale = np.exp(logw - top)
    num = None if weights[0] is None else np.sum(scale * weights[0], axis=0)
    return num, np.sum(scale * weights[1], axis=0), top


def _stabilized_direct(k, v, w, u, state0):
    """Every step from the definition, time on axis 1 (forward); O(L^2)."""
    batch, length, channels = k.shape
    cum = np.cumsum(w, axis=1)                     # W_t = w_1 + ... + w_t
    own = np.moveaxis(k - cum, 1, 0)               # k_s - W_s, (L, B, C)
    vals = None if v is None else np.moveaxis(v, 1, 0)
    ones = np.ones_like(own)
    if state0 is not None:                         # the initial state is a step before step 0
        num0, den0, max0 = state0
        own = np.concatenate([max0[None], own])
        vals = None if vals is None else np.concatenate([num0[None], vals])
        ones = np.concatenate([den0[None], ones])
    first = 0 if state0 is None else 1             # where step 0's term sits

    def state_after(t):                            # the state after step t (t = -1: the start)
        n = first + t + 1
        if n == 0:
            return None
        shift = cum[:, t] if t >= 0 else 0.0
        return _logsumexp_terms(own[:n] + shift, (None if vals is None else vals[:n], ones[:n]))

    out = np.empty_like(k)
    for t in range(length):
        if u is None:
            out[:, t] = _readout(*state_after(t))
            continue
        n = first + t
        shift = cum[:, t - 1] if t >= 1 else 0.0   # terms before step t, plus the bonus term
        logw = np.concatenate([own[:n] + shift, (u + k[:, t])[None]])
        num_w = None if vals is None else np.concatenate([vals[:n], v[:, t][None]])
        out[:, t] = _readout(*_logsumexp_terms(logw, (num_w, np.concatenate([ones[:n], np.ones((1, batch, channels))]))))
    state = state_after(length - 1)
    return out, state


def mlstm_scan(q, k, v, i, f, h0=None, normalized=True, eps=1e-6, reverse=False,
               return_last_state=False, method="loop"):
    """``MLSTMScanSpec``'s recurrence in float64: ``h`` (B, H, L, V), or ``(h, state)`` with
    ``state`` the tuple ``(C, n, m)`` after the last step (``(C, m)`` unnormalized).

    ``method="loop"`` is the stabilized recurrence as the spec writes it; ``"direct"`` forms
    each step's unstabilized sums from their definition, the log-weight of step s at t being
    ``i_s + f_{s+1} + ... + f_t`` (the initial state's ``m0 + f_1 + ... + f_t``), ``m_t`` their
    maximum, and scales them by ``exp(-m_t)``: an independent derivation, O(L^2)."""
    arrays = [np.asarray(x) for x in (q, k, v, i, f)]
    h0 = None if h0 is None else tuple(np.asarray(x) for x in h0)
    spec = MLSTMScanSpec.for_arrays(*arrays, h0=h0, normalized=normalized, eps=eps, reverse=reverse,
                                    return_last_state=return_last_state, check_dtypes=False)
    q, k, v, i, f = (_f64(x) for x in arrays)
    if reverse:
        q, k, v, i, f = (x[:, :, ::-1] for x in (q, k, v, i, f))
    b, h, key, value = spec.batch, spec.heads, spec.key, spec.value
    if h0 is None:
        state0 = (np.zeros((b, h, key, value)), np.zeros((b, h, key)), np.zeros((b, h)))
    else:
        parts = [_f64(x) for x in h0]
        state0 = (parts[0], parts[1], parts[2]) if normalized else (parts[0], np.zeros((b, h, key)), parts[1])
    run = {"loop": _mlstm_loop, "direct": _mlstm_direct}[method]
    out, (c, n, m) = run(q, k, v, i, f, state0, normalized, eps)
    if reverse:
        out = out[:, :, ::-1]
    out = np.ascontiguousarray(out)
    state = (c, n, m) if normalized else (c, m)
    return (out, state) if return_last_state else out


def _mlstm_readout(q, c, n, m, normalized, eps):
    num = np.einsum("bhk,bhkv->bhv", q, c)
    if not normalized:
        return num
    qn = np.abs(np.einsum("bhk,bhk->bh", q, n))
    return num / (np.maximum(qn, np.exp(-m)) + eps)[..., None]


def _mlstm_loop(q, k, v, i, f, state0, normalized, eps):
    c, n, m = (x.copy() for x in state0)
    out = np.empty(q.shape[:3] + (v.shape[-1],))
    for t in range(q.shape[2]):
        m_new = np.maximum(f[:, :, t] + m, i[:, :, t])
        decay, gate = np.exp(f[:, :, t] + m - m_new), np.exp(i[:, :, t] - m_new)
        c = decay[..., None, None] * c + gate[..., None, None] * k[:, :, t, :, None] * v[:, :, t, None, :]
        n = decay[..., None] * n + gate[..., None] * k[:, :, t]
        m = m_new
        out[:, :, t] = _mlstm_readout(q[:, :, t], c, n, m, normalized, eps)
    return out, (c, n, m)


def _mlstm_direct(q, k, v, i, f, state0, normalized, eps):
    c0, n0, m0 = state0
    fcum = np.cumsum(f, axis=2)
    out = np.empty(q.shape[:3] + (v.shape[-1],))
    for t in range(q.shape[2]):
        logw = i[:, :, :t + 1] + fcum[:, :, t, None] - fcum[:, :, :t + 1]     # (B, H, t + 1)
        log0 = m0 + fcum[:, :, t]
        m = np.maximum(log0, logw.max(axis=2))
        w, w0 = np.exp(logw - m[..., None]), np.exp(log0 - m)
        c = w0[..., None, None] * c0 + np.einsum("bhs,bhsk,bhsv->bhkv", w, k[:, :, :t + 1], v[:, :, :t + 1])
        n = w0[..., None] * n0 + np.einsum("bhs,bhsk->bhk", w, k[:, :, :t + 1])
        out[:, :, t] = _mlstm_readout(q[:, :, t], c, n, m, normalized, eps)
    return out, (c, n, m)


def delta_scan(q, k, v, beta, g=None, p=None, h0=None, scale=1.0, l2norm=False, reverse=False,
               return_last_state=False, method="loop"):
    """``DeltaScanSpec``'s recurrence in float64: ``o`` (B, H, L, V), or ``(o, S)`` with the
    state after the last step.

    ``method="loop"`` runs the steps as the spec writes them (decay, read, delta update,
    readout); ``"scan"`` forms each step's transition ``M_t = (I - beta_t k_t p_t^T) D_t`` and
    input ``U_t = beta_t k_t v_t^T`` as matrices and combines them with the scan's operator
    ``(M2, U2) o (M1, U1) = (M2 M1, M2 U1 + U2)`` in log2(L) rounds (Hillis-Steele): the
    associative form the kernels may use, derived independently of the loop."""
    arrays = [None if x is None else np.asarray(x) for x in (q, k, v, beta, g, p, h0)]
    spec = DeltaScanSpec.for_arrays(*arrays[:6], h0=arrays[6], scale=scale, l2norm=l2norm,
                                    reverse=reverse, return_last_state=return_last_state, check_dtypes=False)
    q, k, v, beta, g, p, h0 = (_f64(x) for x in arrays)
    if l2norm:
        q, k = _l2norm(q), _l2norm(k)
        p = None if p is None else _l2norm(p)
    p = k if p is None else p
    if spec.group > 1:          # value head h reads q/k/p head h // group
        q, k, p = (np.repeat(x, spec.group, axis=1) for x in (q, k, p))
    b, h, length = spec.batch, spec.heads, spec.length
    decay = (np.ones((b, h, length, spec.key)) if g is None else
             np.exp(g)[..., None] * np.ones(spec.key) if g.ndim == 3 else np.exp(g))
    if reverse:
        q, k, p, v, beta, decay = (x[:, :, ::-1] for x in (q, k, p, v, beta, decay))
    state0 = np.zeros((b, h, spec.key, spec.value)) if h0 is None else h0
    run = {"loop": _delta_loop, "scan": _delta_by_scan}[method]
    out, state = run(q * scale, k, v, beta, decay, p, state0)
    if reverse:
        out = out[:, :, ::-1]
    out = np.ascontiguousarray(out)
    return (out, state) if return_last_state else out


def _l2norm(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def _delta_loop(q, k, v, beta, decay, p, state):
    s = state.copy()
    out = np.empty(v.shape)
    for t in range(v.shape[2]):
        s = decay[:, :, t, :, None] * s
        read = np.einsum("bhk,bhkv->bhv", p[:, :, t], s)
        s = s + beta[:, :, t, None, None] * k[:, :, t, :, None] * (v[:, :, t] - read)[:, :, None, :]
        out[:, :, t] = np.einsum("bhk,bhkv->bhv", q[:, :, t], s)
    return out, s


def _delta_by_scan(q, k, v, beta, decay, p, state):
    key = k.shape[-1]
    bk = beta[..., None, None] * k[..., :, None]                       # (B, H, L, K, 1)
    m = (np.eye(key) - bk * p[..., None, :]) * decay[..., None, :]     # (I - b k p^T) D
    return _linear_by_scan(q, m, bk * v[..., None, :], state)          # U = beta k v^T


def _linear_by_scan(q, m, u, state):
    """``o_t = q_t^T S_t`` of ``S_t = M_t S_(t-1) + U_t`` (M (B, H, L, K, K), U (B, H, L, K, V)),
    the prefix pairs combined in log2(L) rounds (Hillis-Steele)."""
    step = 1
    while step < u.shape[2]:                    # prefix (M, U) of every step, log2(L) rounds
        m_prev, u_prev = m[:, :, :-step], u[:, :, :-step]
        m_new, u_new = m.copy(), u.copy()
        m_new[:, :, step:] = m[:, :, step:] @ m_prev
        u_new[:, :, step:] = m[:, :, step:] @ u_prev + u[:, :, step:]
        m, u, step = m_new, u_new, 2 * step
    states = m @ state[:, :, None] + u                                 # (B, H, L, K, V)
    out = np.einsum("bhlk,bhlkv->bhlv", q, states)
    return out, states[:, :, -1]


def dplr_scan(q, k, v, a, b, g=None, h0=None, scale=1.0, reverse=False, return_last_state=False,
              method="loop"):
    """``DeltaScanSpec``'s DPLR rule in float64, ``S_t = D_t S_(t-1) + b_t (a_t^T S_(t-1)) +
    k_t v_t^T``, ``o_t = scale S_t^T q_t``: ``o`` (B, H, L, V), or ``(o, S)``.  ``method="loop"``
    steps as written; ``"scan"`` combines the pairs ``(D_t + b_t a_t^T, k_t v_t^T)``."""
    arrays = [None if x is None else np.asarray(x) for x in (q, k, v, a, b, g, h0)]
    spec = DeltaScanSpec.for_arrays(arrays[0], arrays[1], arrays[2], None, arrays[5], h0=arrays[6], scale=scale,
                                    reverse=reverse, return_last_state=return_last_state, check_dtypes=False,
                                    a=arrays[3], b=arrays[4])
    q, k, v, a, b, g, h0 = (_f64(x) for x in arrays)
    if spec.group > 1:
        q, k, a, b = (np.repeat(x, spec.group, axis=1) for x in (q, k, a, b))
    batch, h, length = spec.batch, spec.heads, spec.length
    decay = (np.ones((batch, h, length, spec.key)) if g is None else
             np.exp(g)[..., None] * np.ones(spec.key) if g.ndim == 3 else np.exp(g))
    if reverse:
        q, k, v, a, b, decay = (x[:, :, ::-1] for x in (q, k, v, a, b, decay))
    state = np.zeros((batch, h, spec.key, spec.value)) if h0 is None else h0.copy()
    if method == "loop":
        out = np.empty(v.shape)
        for t in range(length):
            read = np.einsum("bhk,bhkv->bhv", a[:, :, t], state)
            state = (decay[:, :, t, :, None] * state + b[:, :, t, :, None] * read[:, :, None, :]
                     + k[:, :, t, :, None] * v[:, :, t, None, :])
            out[:, :, t] = np.einsum("bhk,bhkv->bhv", scale * q[:, :, t], state)
    else:
        m = decay[..., :, None] * np.eye(spec.key) + b[..., :, None] * a[..., None, :]
        out, state = _linear_by_scan(scale * q, m, k[..., :, None] * v[..., None, :], state)
    if reverse:
        out = out[:, :, ::-1]
    out = np.ascontiguousarray(out)
    return (out, state) if return_last_state else out
