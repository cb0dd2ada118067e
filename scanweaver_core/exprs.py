"""Small readers of Relax expressions (and of TVM's errors) shared by the analyses."""
import tvm
from tvm import relax


def error_line(err):
    """The line of a TVM error that says what went wrong (its last; the type when empty)."""
    text = str(err).strip()
    return text.splitlines()[-1] if text else type(err).__name__


_CALLS = {}         # hash(call) -> (call, op name, args): reading a node's fields is an FFI call


def _call_facts(call):
    key = hash(call)
    got = _CALLS.get(key)
    if got is None:
        if len(_CALLS) > 1 << 18:
            _CALLS.clear()
        name = call.op.name if isinstance(call.op, tvm.ir.Op) else None
        got = _CALLS[key] = (call, name, tuple(call.args))
    return got


def op_name(expr):
    return _call_facts(expr)[1] if isinstance(expr, relax.Call) else None


def call_args(call):
    """``call.args`` as a tuple, read once per node."""
    return _call_facts(call)[2]


_SHAPES = {}        # hash(var) -> static shape (vars are immutable; reading a type is an FFI walk)


def tensor_shape(expr):
    """Static shape of a tensor-typed expression, or None."""
    if isinstance(expr, relax.Var):
        key = hash(expr)
        if key not in _SHAPES:
            if len(_SHAPES) > 1 << 18:
                _SHAPES.clear()
            _SHAPES[key] = (expr, _shape_of(expr))    # the var is kept: its handle stays its own
        return _SHAPES[key][1]
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


_DTYPES = {}        # hash(var) -> (var, dtype string), as _SHAPES


def tensor_dtype(expr):
    if isinstance(expr, relax.Var):
        key = hash(expr)
        got = _DTYPES.get(key)
        if got is None:
            if len(_DTYPES) > 1 << 18:
                _DTYPES.clear()
            got = _DTYPES[key] = (expr, _dtype_of(expr))
        return got[1]
    return _dtype_of(expr)


def _dtype_of(expr):
    return str(getattr(getattr(expr, "ty", None), "dtype", ""))


class VarMap:
    """A dict keyed by Relax objects, by handle.  A plain dict calls ``__eq__`` on every lookup
    with a fresh Python wrapper of the same node (``value.args[0]`` makes a new one each time),
    and TVM's ``__eq__`` reads the node's type over FFI: ~1 us a lookup, the analyses' main cost.
    The handle (``hash``) identifies a live node exactly."""

    __slots__ = ("_items",)

    def __init__(self, pairs=()):
        self._items = {}
        for k, v in (pairs.items() if hasattr(pairs, "items") else pairs):
            self._items[hash(k)] = (k, v)

    def __getitem__(self, key):
        return self._items[hash(key)][1]

    def __setitem__(self, key, value):
        self._items[hash(key)] = (key, value)

    def __contains__(self, key):
        return hash(key) in self._items

    def get(self, key, default=None):
        got = self._items.get(hash(key))
        return default if got is None else got[1]

    def setdefault(self, key, default):
        return self._items.setdefault(hash(key), (key, default))[1]

    def __len__(self):
        return len(self._items)

    def __iter__(self):
        return (k for k, _ in self._items.values())

    def keys(self):
        return list(self)

    def values(self):
        return [v for _, v in self._items.values()]

    def items(self):
        return list(self._items.values())

    def update(self, other):
        for k, v in (other.items() if hasattr(other, "items") else other):
            self[k] = v
