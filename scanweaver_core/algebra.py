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
