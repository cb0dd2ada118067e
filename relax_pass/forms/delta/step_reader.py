"""One step of a delta-rule loop read by value: its map and the operands it reads.

``delta.py`` finds the state chain and builds the match; this module holds what it asks of each
step (steps 2 and 3 of ``delta.py``'s reading): ``_StepReader`` evaluates the step's map
``S_(t-1) -> S_t`` in float64 on chosen previous states, checks it is linear, and finds ``k``,
``beta``, ``v``, the decay, ``p`` (or the DPLR rule's ``a`` and ``b``), ``q`` and the scale
among the step's per-step tensors by value.  The numerical reading is kept apart from the graph
walking and the emitter so each can be read on its own.
"""
import numpy as np

from scanweaver_core.exprs import VarMap, tensor_dtype, tensor_shape

from ..mlstm.loop_reader import _closure, _Probe
from ..stabilized.reader import RTOL


class NotDelta(Exception):
    """The loop is not a delta-rule scan (the message says why)."""


def _bh(x, b, h):
    """``x`` as (B, H, n) when its size allows (views of per-step vectors and scalars)."""
    x = np.asarray(x, dtype=np.float64)
    if x.size % (b * h):
        return None
    return x.reshape(b, h, -1)


def _close(got, want, tol=RTOL):
    want = np.asarray(want, dtype=np.float64)
    return got.shape == want.shape and \
        float(np.max(np.abs(got - want), initial=0.0)) <= tol * max(1.0, float(np.max(np.abs(want), initial=0.0)))


class _StepReader:
    """One step's map and the operands it reads (every probe shares the same leaf inputs)."""

    def __init__(self, reader, step, states, leaf, rng, transposed=False):
        self.reader, self.step, self.rng, self.transposed = reader, step, rng, transposed
        self.b, self.h, self.key, self.value = (int(n) for n in tensor_shape(step.S))
        if transposed:                    # a (B, H, V, K) state, its transition applied on the right
            self.key, self.value = self.value, self.key
        self.leaf, self.states = leaf, states
        stop = VarMap((x, True) for x in states)
        self.cands = [x for x in _closure(reader, [step.S, step.y], stop, depth=24)
                      if x not in stop and tensor_dtype(x) in ("float32", "float64", "float16", "bfloat16")]

    def probe(self, prev_value):
        """The step evaluated from the (B, H, K, V) state ``prev_value``."""
        given = VarMap()
        given[self.step.prev] = np.swapaxes(prev_value, -1, -2) if self.transposed else prev_value
        return _Probe(self.reader, given, self.leaf)

    def state(self, probe):
        """The state after the step, (B, H, K, V), under ``probe``."""
        b, h, key, value = self.b, self.h, self.key, self.value
        if self.transposed:
            return np.swapaxes(np.reshape(probe(self.step.S), (b, h, value, key)), -1, -2)
        return np.reshape(probe(self.step.S), (b, h, key, value))

    def values(self, probe, size, cands=None):
        """``[(var, (B, H, size) value)]`` of the state-free candidates (``cands``, else the
        step's) with ``size`` values per head."""
        out = []
        for x in self.cands if cands is None else cands:
            if x in self.dependent:
                continue
            shape = tensor_shape(x)      # (B, H, ...) only: a (B*H, ...) view would lift scrambled
            if shape is None or tuple(shape[:2]) != (self.b, self.h) or int(np.prod(shape)) != self.b * self.h * size:
                continue
            val = _bh(probe(x), self.b, self.h)
            if val is not None:
                out.append((x, val))
        return out

    def read(self):
        """``(ops, spec fields)`` of this step, or ``NotDelta``."""
        b, h, key, value = self.b, self.h, self.key, self.value
        zero = self.probe(np.zeros((b, h, key, value)))
        u0 = self.state(zero)
        rs = [self.rng.standard_normal((b, h, key, value)) for _ in range(-(-key // value) + 1)]
        probes = [self.probe(r) for r in rs]
        outs = [self.state(pr) - u0 for pr in probes]
        self.dependent = VarMap((x, True) for x in self.cands         # what the state reaches
                                if not np.array_equal(np.asarray(zero(x)), np.asarray(probes[0](x))))
        left = np.concatenate(rs[:-1], axis=-1)                           # (B, H, K, V * n)
        right = np.concatenate(outs[:-1], axis=-1)
        m = right @ np.linalg.pinv(left)                                  # M R = f(R) - U
        if not _close(outs[-1], m @ rs[-1]):
            raise NotDelta(f"step {self.step.S.name}: the state is not a linear map of the previous "
                           "one applied to every column alike")
        ops = {}
        ks = self.values(zero, key)
        scalars = self.values(zero, 1) + [(None, np.ones((b, h, 1)))]    # (None: beta = 1)
        vectors = self.values(zero, value)
        found = None
        for x, kv in ks:                          # k: the left factor of U = beta k v^T
            if not _rank1_left(u0, kv):
                continue
            bv = np.einsum("bhk,bhkv->bhv", kv, u0) / np.einsum("bhk,bhk->bh", kv, kv)[..., None]
            found = next(((x, kv, s, v) for s, sv in scalars for v, vv in vectors if _close(sv * vv, bv)), None)
            if found is not None:
                break
        if found is None:
            raise NotDelta(f"step {self.step.S.name}: its input is not an outer product beta k v^T "
                           "of a per-step key, value and beta (or 1)")
        ops["k"], kv, ops["beta"], ops["v"] = found                      # kv: (B, H, K)
        beta = np.ones((b, h)) if ops["beta"] is None else _bh(zero(ops["beta"]), b, h)[..., 0]
        fields = {"rule": "delta"}
        try:
            decay, w = _decay_and_read(m, beta[..., None] * kv)
        except NotDelta:
            if ops["beta"] is not None:
                raise
            decay = self._rank1_term(m, ks, ops)                          # the DPLR rule
            fields["rule"] = "dplr"
        if np.allclose(decay, 1.0, rtol=0, atol=1e-9):
            fields["decay"] = "none"
        else:
            per_head = np.allclose(decay, decay[..., :1], rtol=1e-9, atol=1e-12)
            fields["decay"] = "head" if per_head else "key"
            want = decay[..., :1] if per_head else decay
            g = _decay_var(self.values(zero, 1 if per_head else key), want)
            if g is None:
                raise NotDelta(f"step {self.step.S.name}: the decay of its state is not exp of a "
                               "per-step tensor, nor one")
            ops["g"], self.step.log_decay = g
        with np.errstate(all="ignore"):
            p = None if fields["rule"] == "dplr" else w / decay
        if p is None or _close(p, kv):
            fields["separate_read"] = False
        else:
            read = next((x for x, pv in ks if _close(pv, p)), None)
            if read is None:
                raise NotDelta(f"step {self.step.S.name}: the state is read (v - S^T p) with no "
                               "per-step p found")
            ops["p"], fields["separate_read"] = read, True
        stop = VarMap((x, True) for x in self.states)
        near_y = [x for x in _closure(self.reader, [self.step.y], stop, depth=24)]   # nearest first
        ops["q"], fields["scale"] = self._readout(zero, self.values(zero, key, near_y))
        return ops, fields

    def _rank1_term(self, m, ks, ops):
        """The decay ``d`` of ``m = diag(d) + b a^T`` with ``b`` and ``a`` per-step K-vectors
        (into ``ops``), or ``NotDelta``."""
        for xb, bv in ks:
            try:
                decay, a = _decay_and_read(m, -bv)
            except NotDelta:
                continue
            xa = next((x for x, av in ks if _close(av, a)), None)
            if xa is not None:
                ops["a"], ops["b"] = xa, xb
                return decay
        raise NotDelta(f"step {self.step.S.name}: the transition of its state is neither a diagonal minus "
                       "beta k p^T (a delta rule) nor a diagonal plus b a^T of per-step vectors (DPLR)")

    def _readout(self, probe, ks):
        s = self.state(probe)
        y = _bh(probe(self.step.y), self.b, self.h)
        if y is None or y.shape[-1] != self.value:
            raise NotDelta(f"step {self.step.S.name}: its readout {self.step.y.name} has no (B, H, V) shape")
        for x, qv in ks:
            z = np.einsum("bhk,bhkv->bhv", qv, s)
            den = float(np.sum(z * z))
            if den == 0.0:
                continue
            scale = float(np.sum(y * z)) / den
            if _close(y, scale * z):
                return x, scale
        raise NotDelta(f"step {self.step.S.name}: its readout {self.step.y.name} is not scale * S_t^T q")


def _rank1_left(u, k):
    """``u`` (B, H, K, V) = k c^T for some c (k (B, H, K) nonzero per head)."""
    nk = np.einsum("bhk,bhk->bh", k, k)
    if np.any(nk == 0):
        return False
    c = np.einsum("bhk,bhkv->bhv", k, u) / nk[..., None]
    return _close(u, k[..., :, None] * c[..., None, :])


def _decay_and_read(m, bk):
    """``(d, w)`` with ``m = diag(d) - bk w^T`` (least squares off the diagonal for w)."""
    key = m.shape[-1]
    off = ~np.eye(key, dtype=bool)
    w = np.empty(m.shape[:-1])
    for j in range(key):
        rows = off[:, j]
        num = -np.einsum("bhi,bhi->bh", m[..., rows, j], bk[..., rows])
        den = np.einsum("bhi,bhi->bh", bk[..., rows], bk[..., rows])
        with np.errstate(all="ignore"):
            w[..., j] = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
    d = np.diagonal(m, axis1=-2, axis2=-1) + bk * w
    if not _close(m, d[..., :, None] * np.eye(key) - bk[..., :, None] * w[..., None, :]):
        raise NotDelta("the transition is not a diagonal minus beta k p^T (not a delta rule)")
    return d, w


def _decay_var(cands, want):
    """``(var, is_log)``: a candidate whose exp is ``want``, else one equal to it."""
    for x, val in cands:
        with np.errstate(all="ignore"):
            if _close(np.exp(val), want):
                return x, True
    for x, val in cands:
        if _close(val, want):
            return x, False
    return None
