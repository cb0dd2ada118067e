"""Roles and layouts of a chunked region's operands (``chunked.py`` finds the region).

Given the region's output on random operands, each tensor's dims are named ("B", "H", "L",
"K", "V"; None for a unit dim) in every way consistent with their extents (dims in order
first, a missing batch before a missing head), and the first naming under which
``reference.matrix_scan`` gives that output (and the final state where other uses read one)
is the match.  q, k and v are told apart first by extents, else by probe runs.
"""
import itertools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from tvm import relax

from scanweaver_core import reference
from scanweaver_core.exprs import VarMap, tensor_dtype, tensor_shape
from scanweaver_core.spec import MatrixScanSpec

MAX_CANDIDATES = 96     # role/layout assignments checked against the oracle per region
RTOL = 1e-6


class NotChunked(Exception):
    """The region is not a chunked matrix scan (the message says why)."""


@dataclass(frozen=True)
class Operand:
    """A tensor of the graph read as a scan operand: ``labels[d]`` names what dim ``d`` runs
    along (``"B"``, ``"H"``, ``"L"``, ``"K"``, ``"V"``; None for a unit dim).  ``expr``, when
    given, is what to emit instead: ``var`` below the broadcast that repeats it over heads
    (``narrow.narrowed``: Mamba-2's B and C with one group), unbound."""
    var: relax.Var
    labels: tuple
    expr: object = None

    def source(self):
        return self.var if self.expr is None else self.expr



def _labelings(shape, time_axis, allowed, required=()):
    """Each way to name the dims of ``shape``: ``time_axis`` is ``"L"`` (None: no time), unit
    dims are None, the others distinct labels of ``allowed`` (``required`` ones present);
    those keeping ``allowed``'s order first."""
    dims = [d for d, n in enumerate(shape) if d != time_axis and n != 1]
    out = []
    for names in itertools.permutations(allowed, len(dims)):
        if not set(required) <= set(names):
            continue
        labels = [None] * len(shape)
        if time_axis is not None:
            labels[time_axis] = "L"
        for d, name in zip(dims, names):
            labels[d] = name
        inversions = sum(allowed.index(a) > allowed.index(b) for a, b in itertools.combinations(names, 2))
        batch_only = "B" in names and "H" not in names      # (a unit batch is likelier)
        out.append(((inversions, batch_only), tuple(labels)))
    return [labels for _, labels in sorted(out, key=lambda p: p[0])]


def _extents(shape, labels, known):
    """``known`` extended by this tensor's labelled extents, or None when one disagrees."""
    known = dict(known)
    for n, label in zip(shape, labels):
        if label is None or label == "L":
            continue
        if known.setdefault(label, n) != n:
            return None
    return known


def to_canonical(x, labels, inner):
    """A numpy array in the scan's (B, H, L, inner) layout (1 where a label is absent)."""
    order = [labels.index(r) for r in ("B", "H", "L", inner) if r in labels]
    y = np.transpose(x, order + [d for d in range(x.ndim) if d not in order])
    kept = [r for r in ("B", "H", "L", inner) if r in labels]
    shape = [y.shape[kept.index(r)] if r in kept else 1 for r in ("B", "H", "L", inner)]
    return y.reshape(shape)


def from_canonical(o, labels, shape, roles=("B", "H", "L", "V")):
    """The inverse: ``o`` in ``roles`` order to a tensor of ``shape`` named by ``labels``."""
    kept = [r for r in labels if r is not None]
    o = o.reshape([o.shape[roles.index(r)] if r in kept else 1 for r in roles])
    o = np.squeeze(o, axis=tuple(i for i, r in enumerate(roles) if r not in kept))
    remaining = [r for r in roles if r in kept]
    return np.transpose(o, [remaining.index(r) for r in kept]).reshape(shape)



def assign_roles(orders, env, y, finals, exit_var, exit_axis, log_decay, side, sources, length,
                 padded):
    """The first role/layout assignment under which the oracle gives ``y`` and ``finals(last,
    known)`` (the region's other uses read as the oracle's final state ``last``; None when
    they are not) holds."""
    y_shape = tensor_shape(exit_var)
    checked = 0
    for q, k, v in orders:
        for out_labels in _labelings(y_shape, exit_axis, ("B", "H", "V"), ("V",)):
            # (the output is full on batch and heads: a lane it lacks has extent 1 everywhere)
            known0 = _extents(y_shape, out_labels, {r: 1 for r in ("B", "H") if r not in out_labels})
            for v_labels in _labelings(tensor_shape(v), sources[v], ("B", "H", "V"), ("V",)):
                known1 = _extents(tensor_shape(v), v_labels, known0)
                if known1 is None:
                    continue
                for k_labels, q_labels in _key_labelings(q, k, sources, known1):
                    known2 = _extents(tensor_shape(q), q_labels,
                                      _extents(tensor_shape(k), k_labels, known1))
                    for g_labels in _decay_labelings(log_decay, sources, known2):
                        for h0_labels in _state_labelings(side, known2):
                            checked += 1
                            if checked > MAX_CANDIDATES:
                                raise NotChunked(f"no assignment of q, k, v and their dims among the "
                                                 f"first {MAX_CANDIDATES} gives the matrix scan")
                            got = _oracle(env, y, (q, q_labels), (k, k_labels), (v, v_labels),
                                          log_decay, g_labels, side, h0_labels, y_shape, out_labels,
                                          known2, length, padded)
                            if got is None:
                                continue
                            final = finals(got.last, known2)
                            if final is None:
                                continue
                            spec = _spec(known2, length, (q, q_labels), (k, k_labels), (v, v_labels),
                                         log_decay, g_labels, bool(side), bool(final),
                                         tensor_dtype(exit_var), got.decay)
                            return dict(spec=spec, q=Operand(q, q_labels), k=Operand(k, k_labels),
                                        v=Operand(v, v_labels),
                                        log_decay=None if log_decay is None else Operand(log_decay, g_labels),
                                        h0=Operand(side[0], h0_labels) if side else None,
                                        out_labels=out_labels, final=tuple(final), decay_values=got.decay,
                                        scale=got.scale)
    if finals.external:
        raise NotChunked(f"no assignment gives the matrix scan with "
                         f"{', '.join(u.name for u in finals.external)} as its final state")
    raise NotChunked("no assignment of q, k, v and their dims gives the matrix scan")


def _dim_sizes(x, time_axis):
    """The extents of ``x``'s dims other than time and unit ones, sorted."""
    return sorted(n for d, n in enumerate(tensor_shape(x)) if d != time_axis and n != 1)


def role_orders(probe, exit_var, linear, env, exit_axis, sources, length):
    """(q, k, v) orders of the three linear inputs, likeliest first: v has the output's
    extents; when the extents do not tell (v's are q's or k's), one element changed at a step
    changes the output at that step only through q, at every later step through k and v, and
    at one feature only through v (a probe run per input)."""
    orders = list(itertools.permutations(linear))
    out_extents = _dim_sizes(exit_var, exit_axis)
    fits = [o for o in orders if _dim_sizes(o[2], sources[o[2]]) == out_extents]
    if 1 <= len(fits) <= 2:      # v known: the oracle tells q from k cheaper than a probe
        return fits + [o for o in orders if o not in fits]
    probed = linear
    y = probe(env, [exit_var])[0]
    t0 = length // 2
    reach = {x: (False, 0) for x in linear}
    for x in probed:
        env2 = VarMap(env.items())
        bumped = np.array(env[x])
        idx = [0] * bumped.ndim
        idx[sources[x]] = t0
        bumped[tuple(idx)] += 1.0
        env2[x] = bumped
        changed = np.abs(probe(env2, [exit_var])[0] - y) > 1e-12 * max(1.0, float(np.max(np.abs(y))))
        per_step = np.moveaxis(changed, exit_axis, 0).reshape(changed.shape[exit_axis], -1)
        reach[x] = (list(np.nonzero(per_step.any(1))[0]) == [t0], int(changed.sum()))

    def unlikely(order):
        q, k, v = order
        return (order not in fits, not reach[q][0], reach[k][1] < reach[v][1])
    return sorted(orders, key=unlikely)



def _key_labelings(q, k, sources, known):
    for k_labels in _labelings(tensor_shape(k), sources[k], ("B", "H", "K"), ("K",)):
        known_k = _extents(tensor_shape(k), k_labels, known)
        if known_k is None:
            continue
        for q_labels in _labelings(tensor_shape(q), sources[q], ("B", "H", "K"), ("K",)):
            if _extents(tensor_shape(q), q_labels, known_k) is not None:
                yield k_labels, q_labels


def _decay_labelings(log_decay, sources, known):
    if log_decay is None:
        yield None
        return
    shape = tensor_shape(log_decay)
    for labels in _labelings(shape, sources[log_decay], ("B", "H", "K")):
        if _extents(shape, labels, known) is not None:
            yield labels


def _state_labelings(side, known):
    if not side:
        yield None
        return
    shape = tensor_shape(side[0])
    for labels in _labelings(shape, None, ("B", "H", "K", "V"), ("K", "V")):
        if _extents(shape, labels, known) is not None:
            yield labels


def _full(known, role):
    return known.get(role, 1)


class OracleFit(NamedTuple):
    """The oracle's output in the exit's layout, its final state (B, H, K, V), the constant
    decay per head it was given (None: the graph's log-decay, or none) and the scale per head
    of the output (None: 1; a scale on the scores, ``q @ k^T * scale``)."""
    o: np.ndarray
    last: np.ndarray
    decay: object
    scale: object = None


def _oracle(env, y, q, k, v, log_decay, g_labels, side, h0_labels, y_shape, out_labels, known,
            length, padded):
    """The ``OracleFit`` of the matrix scan under this assignment when it equals the region's
    output, else None.  With no log-decay in the graph, the decay may be a constant per head
    (MiniMax's slopes, retention's gammas): it is read off the output's first steps; and the
    output may be scaled per head (a scale on the scores): read off by least squares."""
    qa, ka, va = (to_canonical(env[x], labels, inner)[:, :, :length] for (x, labels), inner in
                  ((q, "K"), (k, "K"), (v, "V")))
    g, decay, constant = None, "none", None
    if log_decay is not None:
        decay = "key" if "K" in g_labels else "scalar"
        g = np.exp(to_canonical(env[log_decay], g_labels, "K")[:, :, :length])
    h0 = None
    if side:
        h0 = _state_canonical(env[side[0]], h0_labels, known)
    bh = (_full(known, "B"), _full(known, "H"))
    try:
        y_roles = np.broadcast_to(to_canonical(y, out_labels, "V")[:, :, :length], bh + (length, va.shape[-1]))
    except ValueError:
        return None
    if log_decay is None:
        try:
            constant = _constant_decay(qa, ka, va, h0, y_roles, bh)
        except ValueError:                          # shapes that do not broadcast
            return None
        if constant is not None:
            decay, g = "scalar", constant.reshape(1, -1, 1, 1)
    try:
        o, last = reference.matrix_scan(qa, ka, va, g, decay=decay, h0=h0, return_last_state=True)
    except ValueError:                              # shapes the spec refuses
        return None
    if o.shape != y_roles.shape:
        return None
    scale = _output_scale(o, y_roles)
    if scale is not None:
        o = o * scale.reshape(1, -1, 1, 1)
    pad = [(0, 0)] * 4
    pad[2] = (0, padded - length)
    o_shape = list(y_shape)
    try:
        got = from_canonical(np.pad(o, pad), out_labels, o_shape)
    except ValueError:
        return None
    return OracleFit(got, last, constant, scale) if _close(got, y) else None


def _output_scale(o, y):
    """The per-head ``c`` that best makes ``c * o`` be ``y`` (both (B, H, L, V)); None when it
    is 1 (or ``o`` is 0 on a head)."""
    return _unless_one(_head_fit(o, y))


def _constant_decay(q, k, v, h0, y, bh):
    """The per-head ``g`` with which ``y`` is the scan at its first steps (None when it is 1:
    no decay): ``o_0 = g q_0 h0 + (q_0.k_0) v_0`` with an initial state, else
    ``o_1 = c (g (q_1.k_0) v_0 + (q_1.k_1) v_1)`` with ``c`` from ``o_0 = c (q_0.k_0) v_0`` (a
    scale on the scores); least squares over batch and value."""
    q, k, v = (np.broadcast_to(x, bh + x.shape[2:]) for x in (q, k, v))
    y = np.broadcast_to(y, bh + y.shape[2:])
    if h0 is not None:
        c = np.einsum("bhk,bhkv->bhv", q[:, :, 0], h0)
        r = y[:, :, 0] - np.einsum("bhk,bhk->bh", q[:, :, 0], k[:, :, 0])[..., None] * v[:, :, 0]
    else:
        first = np.einsum("bhk,bhk->bh", q[:, :, 0], k[:, :, 0])[..., None] * v[:, :, 0]
        scale = _head_fit(first, y[:, :, 0])
        if scale is None or np.any(np.abs(scale) <= 1e-12):
            return None
        c = np.einsum("bhk,bhk->bh", q[:, :, 1], k[:, :, 0])[..., None] * v[:, :, 0]
        r = y[:, :, 1] / scale[:, None] - np.einsum("bhk,bhk->bh", q[:, :, 1], k[:, :, 1])[..., None] * v[:, :, 1]
    return _unless_one(_head_fit(c, r))


def _head_fit(x, y):
    """The per-head (axis 1) least-squares ``c`` of ``c * x = y`` over every other axis; None
    when ``x`` is 0 on a head."""
    axes = tuple(d for d in range(x.ndim) if d != 1)
    den = (x * x).sum(axis=axes)
    if np.any(den <= 1e-12):
        return None
    return (x * y).sum(axis=axes) / den


def _unless_one(c):
    """``c``, or None when it is None or 1 on every head."""
    return None if c is None or np.all(np.abs(c - 1.0) <= 1e-9) else c


def _close(a, b):
    return a.shape == b.shape and float(np.max(np.abs(a - b), initial=0.0)) <= RTOL * max(
        1.0, float(np.max(np.abs(b), initial=0.0)))


def _state_canonical(x, labels, known):
    order = [labels.index(r) for r in ("B", "H", "K", "V") if r in labels]
    y = np.transpose(x, order + [d for d in range(x.ndim) if d not in order])
    kept = [r for r in ("B", "H", "K", "V") if r in labels]
    return y.reshape([y.shape[kept.index(r)] if r in kept else 1 for r in ("B", "H", "K", "V")]) \
        * np.ones((_full(known, "B"), _full(known, "H"), 1, 1))


def state_layout(var, value, last, known):
    """The labels under which ``value`` (of ``var``) is the final state ``last`` (B, H, K, V),
    else None."""
    shape = tensor_shape(var)
    for labels in _labelings(shape, None, ("B", "H", "K", "V"), ("K", "V")):
        if _extents(shape, labels, known) is None:
            continue
        try:
            got = from_canonical(last, labels, shape, roles=("B", "H", "K", "V"))
        except ValueError:
            continue
        if _close(got, value):
            return labels
    return None


def _spec(known, length, q, k, v, log_decay, g_labels, has_h0, final, dtype, constant=None):
    def shape(labels, inner):
        return tuple(_full(known, r) if r in labels else 1 for r in ("B", "H")) + (length, _full(known, inner))

    decay, g_shape = "none", None
    if constant is not None:
        decay, g_shape = "scalar", (1, len(constant), 1, 1)
    elif log_decay is not None:
        decay = "key" if "K" in g_labels else "scalar"
        g_shape = tuple(_full(known, r) if r in g_labels else 1 for r in ("B", "H")) + (
            length, _full(known, "K") if decay == "key" else 1)
    return MatrixScanSpec.create(
        _full(known, "B"), _full(known, "H"), length, _full(known, "K"), _full(known, "V"),
        q_shape=shape(q[1], "K"), k_shape=shape(k[1], "K"), v_shape=shape(v[1], "V"),
        decay=decay, g_shape=g_shape, has_h0=has_h0, dtype=dtype, return_last_state=final)
