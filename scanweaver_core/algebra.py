"""The affine-pair algebra, written once.

A step ``h -> a*h + u`` is the pair ``(a, u)``.  Pairs compose associatively, which is what
lets a recurrence run as a parallel scan.  The functions use only ``*`` and ``+``, so the same
code serves numpy arrays (the reference), Python floats and TIR expressions (the realizations).
"""

IDENTITY = (1.0, 0.0)


def compose(first, second):
    """The pair that applies ``first`` and then ``second``: ``(a2*a1, a2*u1 + u2)``."""
    a1, u1 = first
    a2, u2 = second
    return a2 * a1, a2 * u1 + u2


def apply(pair, h):
    """Apply a pair to a state: ``a*h + u``."""
    a, u = pair
    return a * h + u


# The max-stabilized (log-space) monoid: online softmax's, RWKV's WKV, logcumsumexp.
#
# A step multiplies the state by ``exp(w)`` and adds ``exp(m) * (n, d)``; an element is
# ``(w, m, n, d)`` and a state ``(num, den, max)``, which stands for ``exp(max) * (num, den)``
# (RWKV's order).  Composition keeps the larger exponent and rescales the other side by
# ``exp(smaller - larger) <= 1``, so nothing overflows.  ``exp`` and ``maximum`` are passed in
# (numpy's by default; a kernel passes its own), the rest is ``+`` and ``*``; ``n`` may be None
# (a den-only scan: logcumsumexp).  The identity's max is a very negative finite number (RWKV's
# -1e38), so that ``max - max`` is 0, never ``inf - inf``.
LOG_FLOOR = -1e38
LOG_IDENTITY = (0.0, LOG_FLOOR, 0.0, 0.0)


def _np_ops():
    import numpy as np  # pylint: disable=import-outside-toplevel
    return np.exp, np.maximum


def log_compose(first, second, exp=None, maximum=None):
    """The element that applies ``first`` and then ``second``:
    ``(w1 + w2, M, e1*n1 + e2*n2, e1*d1 + e2*d2)`` with ``M = max(m1 + w2, m2)``,
    ``e1 = exp(m1 + w2 - M)``, ``e2 = exp(m2 - M)``."""
    if exp is None or maximum is None:
        exp, maximum = _np_ops()
    w1, m1, n1, d1 = first
    w2, m2, n2, d2 = second
    shifted = m1 + w2
    top = maximum(shifted, m2)
    e1, e2 = exp(shifted - top), exp(m2 - top)
    num = None if n1 is None or n2 is None else e1 * n1 + e2 * n2
    return w1 + w2, top, num, e1 * d1 + e2 * d2


def log_apply(element, state, exp=None, maximum=None):
    """Apply an element to a state ``(num, den, max)``: the state as an element (its decay is
    never read) composed with ``element``."""
    num, den, top = state
    _, top, num, den = log_compose((0.0, top, num, den), element, exp, maximum)
    return num, den, top


def log_step(w, k, v=None):
    """The element of one step ``state -> exp(w) state + exp(k) (v, 1)``."""
    return w, k, v, 1.0
