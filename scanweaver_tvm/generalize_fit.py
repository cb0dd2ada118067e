"""The trace points and the integer fit behind ``generalize``.

``generalize.py`` walks the traces side by side and rebuilds the module; each integer that
differs between traces is handed to ``_Fit``, which fits it as a polynomial in the dims, linear
in each, with integer coefficients, checked exactly at every trace point (``grid`` chooses the
points: the full grid of each dim's first two sizes, then points that only confirm).  The
arithmetic of fitting is kept apart from the walk over Relax nodes that uses it.
"""
import itertools

import numpy as np
import tvm
from tvm import tirx

__all__ = ["grid"]


def grid(sizes):
    """The trace points for ``sizes`` (dim -> (v1, v2, v3, ...)): every combination of each dim's
    first two values (what the fit needs), then one point per further value (all dims at their
    k-th value), which only confirms."""
    names = list(sizes)
    points = [dict(zip(names, combo)) for combo in itertools.product(*(sizes[n][:2] for n in names))]
    extra = min(len(v) for v in sizes.values()) if names else 0
    points += [{n: sizes[n][k] for n in names} for k in range(2, extra)]
    return points


class _Fit:
    """Fits integers seen at the trace points as polynomials in the dims' Vars."""

    def __init__(self, points, dims, lower=None):
        self.points, self.dims = points, dims
        names = list(dims)
        self.monomials = [s for r in range(len(names) + 1) for s in itertools.combinations(names, r)]
        self.design = np.array([[np.prod([p[n] for n in m]) for m in self.monomials] for p in points],
                               dtype=np.float64)
        self.analyzer = tvm.sym.Analyzer()
        self.positive = tvm.sym.Analyzer()      # knows every dim >= its lower bound (for proofs, not simplify)
        for name, var in dims.items():
            low = max(1, int((lower or {}).get(name) or 1))
            self.positive.update(var, tvm.sym.ConstIntBound(low, tvm.sym.ConstIntBound.POS_INF), override=True)

    def coefficients(self, values):
        """Integer coefficients per monomial, or None when no such polynomial fits exactly."""
        sol = np.linalg.lstsq(self.design, np.asarray(values, dtype=np.float64), rcond=None)[0]
        coefs = [int(round(c)) for c in sol]
        for p, v in zip(self.points, values):
            if sum(c * int(np.prod([p[n] for n in m])) for c, m in zip(coefs, self.monomials)) != v:
                return None
        return coefs

    def expr(self, values, dtype="int64"):
        """The PrimExpr through ``values`` (an IntImm when they agree), or None."""
        if all(v == values[0] for v in values):
            return tirx.IntImm(dtype, values[0])
        coefs = self.coefficients(values)
        if coefs is None:
            return None
        total = tirx.IntImm(dtype, 0)
        for c, m in zip(coefs, self.monomials):
            if c:
                term = tirx.IntImm(dtype, c)
                for n in m:
                    term = term * (self.dims[n] if dtype == "int64" else tirx.Cast(dtype, self.dims[n]))
                total = total + term
        return self.analyzer.simplify(total)

    def text(self, values):
        """The fitted polynomial as text (``"L"``, ``"2*L + 3"``, ``"batch*L"``), or None."""
        coefs = self.coefficients(values)
        if coefs is None:
            return None
        terms = []
        for c, m in reversed(list(zip(coefs, self.monomials))):
            if c:
                name = "*".join(m)
                terms.append(str(c) if not m else name if c == 1 else f"{c}*{name}")
        return " + ".join(terms).replace("+ -", "- ") or "0"

    def where(self):
        return ", ".join(" ".join(f"{n}={v}" for n, v in p.items()) for p in self.points)

    def evaluate(self, expr, point):
        """``expr`` at ``point``, as an int, or None if it does not reduce to one."""
        ana = tvm.sym.Analyzer()
        for n, var in self.dims.items():
            ana.bind(var, tirx.IntImm("int64", point[n]))
        out = ana.simplify(expr)
        return int(out.value) if isinstance(out, tirx.IntImm) else None
