"""Translation validation of one rewrite: is the replacement what the chain computed?

Before ``FuseAffineRecurrences`` keeps a rewrite it checks (a) that every value it replaces keeps
exactly its type (shape and dtype) and that the function's signature is unchanged, and (b) that
the original region and its replacement agree on seeded random probe inputs.  The inputs are
the values the replacement reads from the rest of the function; both sides are evaluated from
them in float64 (``interpret.py``) and must agree to 1e-6 of their magnitude.  Probes are
uniform in [0, scale): decays and gates are usually positive, and a region that overflows at
scale 1 is retried at 0.1 and 0.01 before validation gives up ("inconclusive": not rewritten).
"""
import time

import numpy as np
import tvm_ffi
from tvm import relax

from scanweaver_core.exprs import VarMap

from .interpret import Interpreter, random_input
from .interpret_ops import Unsupported

RTOL = 1e-6
SCALES = (1.0, 0.1, 0.01)


class ValidationFailed(Exception):
    """The rewrite does not provably keep what the function computes (the message says why)."""


def _values(func):
    return VarMap((b.var, b.value) for blk in func.body.blocks for b in blk.bindings)


def _type_text(ty):
    return str(ty).replace("T.int64(", "").replace(")", "")


def check_types(old_func, new_func, replaced):
    """(a): the signature and every replaced value's type are unchanged."""
    old_sig = [p.ty for p in old_func.params] + [old_func.ret_ty]
    new_sig = [p.ty for p in new_func.params] + [new_func.ret_ty]
    if len(old_sig) != len(new_sig) or not all(tvm_ffi.structural_equal(x, y) for x, y in zip(old_sig, new_sig)):
        raise ValidationFailed(f"the function's signature changed: returns {new_func.ret_ty}, "
                               f"was {old_func.ret_ty}")
    for var, new in replaced:
        if not tvm_ffi.structural_equal(var.ty, new.ty):
            raise ValidationFailed(f"{var.name} would become {_type_text(new.ty)}, "
                                   f"was {_type_text(var.ty)}")


def _probe(old_values, new_values, same, replaced, scale, seed, given=()):
    """Both sides on one set of probe inputs: the parameters, and the values of ops the
    interpreter does not know outside the rewritten region, are random; everything else is
    computed from them.  A value bound identically on both sides is computed once (on the
    original side) and shared, so the two sides always see consistent inputs.  The vars of
    ``given`` (bound the same on both sides) are probe inputs too: the check is then local
    to what is computed from them."""
    rng = np.random.default_rng(seed)
    leaves = VarMap()
    for var in given:
        leaves[var] = random_input(var.ty, rng, scale)

    def leaf(var):
        if var not in leaves:
            leaves[var] = random_input(var.ty, rng, scale)
        return leaves[var]

    old_side = Interpreter(old_values, missing=leaf, opaque=same)
    new_side = Interpreter(new_values, missing=leaf, shared=lambda v: old_side(v) if v in same else None)
    for var in given:
        old_side.memo[var] = leaves[var]
    return [(var, old_side(var), new_side(new)) for var, new in replaced]


def check_values(old_func, new_func, replaced, seed=0, given=()):
    """(b): both sides agree on probe inputs (``given``: see ``_probe``)."""
    old_values, new_values = _values(old_func), _values(new_func)
    same = VarMap((v, True) for v, val in old_values.items() if v in new_values and new_values[v].same_as(val))
    params = VarMap((p, True) for p in new_func.params)
    # a replacement nobody reads was pruned with the dead steps: nothing to compare
    replaced = [(v, n) for v, n in replaced if not isinstance(n, relax.Var) or n in new_values or n in params]
    try:
        for scale in SCALES:
            pairs = _probe(old_values, new_values, same, replaced, scale, seed, given)
            if all(np.all(np.isfinite(np.asarray(old, dtype=np.float64))) for _, old, _ in pairs):
                break
        else:
            raise ValidationFailed("inconclusive: the original overflows on probe inputs at every scale")
    except Unsupported as err:
        raise ValidationFailed(f"cannot evaluate {err} on probe inputs") from None
    for var, old, new in pairs:
        old, new = np.asarray(old, dtype=np.float64), np.asarray(new, dtype=np.float64)
        if old.shape != new.shape:
            raise ValidationFailed(f"{var.name}: shape {new.shape} on probe inputs, was {old.shape}")
        err = float(np.max(np.abs(old - new), initial=0.0)) / max(1.0, float(np.max(np.abs(old), initial=0.0)))
        if not err <= RTOL:
            raise ValidationFailed(f"{var.name} differs on probe inputs: relative error {err:.3g}")


def validate(old_func, new_func, replaced, given=()):
    """``(ok, message, seconds)`` for one rewrite's ``replaced`` ``[(old var, new expr)]``;
    ``given``: vars bound alike on both sides taken as probe inputs (a region's operands)."""
    start = time.perf_counter()
    try:
        check_types(old_func, new_func, replaced)
        check_values(old_func, new_func, replaced, given=given)
    except ValidationFailed as err:
        return False, str(err), time.perf_counter() - start
    return True, "", time.perf_counter() - start
