"""Small readers of Relax expressions shared by the analyses."""
import tvm
from tvm import relax


def op_name(expr):
    return expr.op.name if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) else None


_SHAPES = {}        # var -> static shape (vars are immutable; reading a type is an FFI walk)


def tensor_shape(expr):
    """Static shape of a tensor-typed expression, or None."""
    if isinstance(expr, relax.Var):
        if expr not in _SHAPES:
            if len(_SHAPES) > 1 << 18:
                _SHAPES.clear()
            _SHAPES[expr] = _shape_of(expr)
        return _SHAPES[expr]
    return _shape_of(expr)


def _shape_of(expr):
    ty = getattr(expr, "ty", None)
    shape = getattr(ty, "shape", None)
    values = getattr(shape, "values", None)
    if values is None:
        return None
    try:
        return tuple(int(v) for v in values)
    except (TypeError, ValueError):
        return None


def tensor_dtype(expr):
    return str(getattr(getattr(expr, "ty", None), "dtype", ""))
