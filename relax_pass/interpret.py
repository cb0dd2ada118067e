"""A float64 numpy interpreter for the Relax ops a recurrence region is made of.

Translation validation (``validate.py``) runs a chain as imported and its replacement on the
same random inputs; this module gives both a meaning.  Float casts are identities (the check
compares the algebra in float64, not the rounding of a dtype); ScanWeaver's own scan calls run
the float64 reference.  An op it does not know raises ``Unsupported`` naming it, never a guess;
what each op computes is ``interpret_ops.py``'s table.
"""
import contextlib

import numpy as np
import tvm
from tvm import relax

from scanweaver_core import reference
from scanweaver_core.exprs import VarMap, call_args, op_name, tensor_shape
from scanweaver_core.scan_op import parse_scan
from scanweaver_core.spec import AffineScanSpec, DeltaScanSpec, MatrixScanSpec, MLSTMScanSpec, StabilizedScanSpec

from .interpret_ops import FLOAT_DTYPES, SUPPORTED_OPS, Unsupported, _apply_call, const_ints


class _ConstantCache:
    """Constants as float64 arrays, kept across interpreter runs inside ``cached_constants``:
    each rewrite's validation evaluates the model up to its recurrence, so without it every
    layer converted every weight before it again (an lm embedding alone is 300 MB in float64).
    Entries hold their constant (so its address is not reused while cached); the least
    recently used go first beyond the budget."""

    def __init__(self, budget_bytes=1 << 31):
        self.entries, self.budget, self.size = {}, budget_bytes, 0

    def value(self, const):
        key = hash(const)
        hit = self.entries.pop(key, None)
        if hit is not None and not hit[0].same_as(const):
            self.size -= hit[1].nbytes
            hit = None
        if hit is None:
            hit = (const, _float64(const))
            hit[1].setflags(write=False)          # shared: no caller may write into it
            self.size += hit[1].nbytes
        self.entries[key] = hit                   # (re)inserted last: most recently used
        while self.size > self.budget and len(self.entries) > 1:
            self.size -= self.entries.pop(next(iter(self.entries)))[1].nbytes
        return hit[1]


def _float64(const):
    data = const.value.numpy()
    return data.astype(np.float64) if data.dtype.kind == "f" or str(data.dtype) == "bfloat16" else data


_CACHE = []      # the active _ConstantCache, if any


@contextlib.contextmanager
def cached_constants():
    """Within: constants are converted once (``FuseAffineRecurrences`` runs inside one)."""
    _CACHE.append(_ConstantCache())
    try:
        yield
    finally:
        _CACHE.pop()


def evaluable(value):
    """Whether the interpreter has a meaning for ``value`` itself (not looking at its inputs)."""
    if isinstance(value, relax.Call):
        name = op_name(value)
        return name in SUPPORTED_OPS or (name == "relax.call_pure_packed" and parse_scan(value) is not None)
    return True


def _tensor_args(call):
    """The arguments that carry tensors (shapes, attributes-as-arguments are read by the op)."""
    name, args = op_name(call), call_args(call)
    if name in ("relax.reshape", "relax.broadcast_to", "relax.strided_slice", "relax.clip"):
        return args[:1]
    if name in ("relax.zeros", "relax.ones", "relax.arange"):
        return ()
    if name in ("relax.full", "relax.full_like"):
        return args[:2]
    return args


def _scan(spec, ops):
    if isinstance(spec, AffineScanSpec):
        a, b = ops[0], ops[1]
        h0 = ops[2] if spec.has_h0 else None
        states = reference.affine_scan(np.reshape(a, spec.a_shape), b, h0, spec.axis, spec.reverse)
        out = {"states": states, "last": reference.last_state(states, spec.axis, spec.reverse)}
        got = [out[k] for k in spec.outputs]
    elif isinstance(spec, StabilizedScanSpec):
        got = _stabilized(spec, ops)
    elif isinstance(spec, MLSTMScanSpec):
        named = dict(zip(spec.operand_names(), ops))
        h0 = [named[f"{n}0"] for n in spec.state_names()] if spec.has_h0 else None
        got = reference.mlstm_scan(*(named[n] for n in "qkvif"), h0, spec.normalized, spec.eps,
                                   spec.reverse, spec.return_last_state)
        got = [got[0], *got[1]] if spec.return_last_state else [got]
    elif isinstance(spec, DeltaScanSpec):
        named = dict(zip(spec.operand_names(), ops))
        if spec.is_dplr:
            got = reference.dplr_scan(*(named[n] for n in "qkvab"), named.get("g"), named.get("S0"), spec.scale,
                                      spec.reverse, spec.return_last_state)
        else:
            got = reference.delta_scan(named["q"], named["k"], named["v"], named["beta"], named.get("g"),
                                       named.get("p"), named.get("S0"), spec.scale, spec.l2norm, spec.reverse,
                                       spec.return_last_state)
        got = list(got) if spec.return_last_state else [got]
    elif isinstance(spec, MatrixScanSpec):
        kwargs = {"g" if n == "dt" else n: x for n, x in zip(spec.operand_names(), ops)}
        got = reference.matrix_scan(decay=None if spec.decay == "selective" else spec.decay,
                                    reverse=spec.reverse, return_last_state=spec.return_last_state,
                                    dt_softplus=spec.dt_softplus, layout=spec.layout, **kwargs)
        got = list(got) if isinstance(got, tuple) else [got]
    else:
        names = ["u", "delta", "A", "B", "C"] + [k for k, on in (
            ("D", spec.has_D), ("z", spec.has_z), ("delta_bias", spec.has_delta_bias),
            ("h0", spec.has_h0)) if on]
        kwargs = dict(zip(names, ops))
        got = reference.selective_scan(delta_softplus=spec.delta_softplus,
                                       return_last_state=spec.return_last_state, **kwargs)
        got = list(got) if isinstance(got, tuple) else [got]
    return got[0] if len(got) == 1 else tuple(got)


def _stabilized(spec, ops):
    """The stabilized scan by its float64 recurrence (``reference.stabilized_scan``'s loop)."""
    named = dict(zip(spec.operand_names(), ops))
    h0 = [named[f"{n}0"] for n in spec.state_names()] if spec.has_h0 else None
    got = reference.stabilized_scan(named["k"], named.get("v"), named.get("w"), named.get("u"), h0,
                                    spec.reverse, spec.return_last_state, spec.layout, method="loop")
    return [got[0], *got[1]] if spec.return_last_state else [got]


def slice_span(val):
    """``(axis, start, stop)`` of ``strided_slice`` ``val`` when it is a unit-stride slice along
    one axis (bounds clamped to the extent), else None."""
    shape = tensor_shape(val.args[0])
    try:
        axes, begin, end = (const_ints(a) for a in val.args[1:4])
        strides = const_ints(val.args[4]) if len(val.args) > 4 else [1]
    except (TypeError, ValueError, AttributeError):
        return None
    if shape is None or len(axes) != 1 or strides not in ([1], []):
        return None
    axis, n = axes[0] % len(shape), shape[axes[0] % len(shape)]
    start, stop = (min(max(x + n if x < 0 else x, 0), n) for x in (begin[0], end[0]))
    return (axis, start, stop) if stop > start else None


def read_vars(value):
    """The vars ``value`` reads through calls, tuples and tuple items (cheaper than
    ``relax.analysis.free_vars``; what the interpreter evaluates first)."""
    found, stack = [], [value]
    while stack:
        x = stack.pop()
        if isinstance(x, relax.Var):
            found.append(x)
        elif isinstance(x, relax.Tuple):
            stack.extend(x.fields)
        elif isinstance(x, relax.TupleGetItem):
            stack.append(x.tuple_value)
        elif isinstance(x, relax.Call):
            stack.extend(call_args(x))
    return found


# what evaluating a region on probe inputs may raise: the region is then not matched
EVAL_ERRORS = (Unsupported, ValueError, TypeError, IndexError, KeyError, ArithmeticError)


class Interpreter:
    """Evaluate expressions of one function lazily: ``value_of`` maps a bound var to its value,
    ``env`` holds the given inputs (var -> array).  Results are memoized per var."""

    def __init__(self, value_of, missing=None, shared=None, opaque=(), ops=None):
        self.value_of = value_of    # (a VarMap for speed: a dict keyed by vars calls TVM's __eq__)
        self.memo = VarMap()
        self.ops = ops              # the op names it may evaluate (None: all it knows)
        self.missing = missing      # var -> value for unbound vars (parameters), else Unsupported
        self.shared = shared        # var -> value or None: values taken from elsewhere
        # vars whose unsupported ops read as ``missing`` (probe inputs)
        self.opaque = opaque if isinstance(opaque, VarMap) else VarMap((v, True) for v in opaque)

    def __call__(self, expr):
        stack, deps = [expr], VarMap()
        while stack:                 # evaluate dependencies first, without deep recursion
            e = stack[-1]
            found = deps.get(e)
            if found is None:
                found = deps[e] = self._deps(e)
            pending = [d for d in found if d not in self.memo]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            if isinstance(e, relax.Var) and e not in self.memo:
                value = self.value_of[e]
                if e in self.opaque and not evaluable(value):
                    self.memo[e] = self.missing(e)
                else:
                    self.memo[e] = self._eval(value)
        return self._eval(expr) if not isinstance(expr, relax.Var) else self.memo[expr]

    def _deps(self, e):
        if isinstance(e, relax.Var):
            if e in self.memo:
                return []
            got = self.shared(e) if self.shared is not None else None
            if got is not None:
                self.memo[e] = got
                return []
            if e not in self.value_of:
                if self.missing is None:
                    raise Unsupported(f"no value for {e.name}")
                self.memo[e] = self.missing(e)
                return []
            if e in self.opaque and not evaluable(self.value_of[e]):
                return []            # read as a probe input when evaluated
            e = self.value_of[e]
        return read_vars(e)

    def _eval(self, e):
        if isinstance(e, relax.Var):
            return self.memo[e]
        if isinstance(e, tvm.ir.expr.GenericConst):
            return _CACHE[-1].value(e) if _CACHE else _float64(e)
        if isinstance(e, relax.Tuple):
            return tuple(self._eval(f) for f in e.fields)
        if isinstance(e, relax.TupleGetItem):
            return self._eval(e.tuple_value)[int(e.index)]
        if isinstance(e, relax.ShapeExpr):
            return tuple(int(v) for v in e.values)
        if isinstance(e, (tvm.tirx.FloatImm, tvm.tirx.IntImm)):
            return np.float64(e.value) if isinstance(e, tvm.tirx.FloatImm) else np.int64(e.value)
        if isinstance(e, relax.Call):
            name = op_name(e)
            if name is None or (self.ops is not None and name not in self.ops):
                raise Unsupported(f"call of {e.op}")
            scan = parse_scan(e) if name == "relax.call_pure_packed" else None
            if scan is not None:
                spec, operands = scan
                return _scan(spec, [self._eval(o) for o in operands])
            args = [self._eval(x) for x in _tensor_args(e)]
            return _apply_call(e, args)
        raise Unsupported(type(e).__name__)


def random_input(ty, rng, scale=1.0):
    """A probe value for a var of type ``ty``: floats in [0, scale), bools at random, ints 0."""
    if isinstance(ty, relax.TupleType):
        return tuple(random_input(f, rng, scale) for f in ty.fields)
    shape = getattr(getattr(ty, "shape", None), "values", None)
    dtype = str(getattr(ty, "dtype", ""))
    if shape is None:
        raise Unsupported(f"input of type {ty} (no static shape)")
    shape = tuple(int(v) for v in shape)
    if dtype in FLOAT_DTYPES:
        return rng.uniform(0.0, scale, shape)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    return np.zeros(shape, np.dtype(dtype))
