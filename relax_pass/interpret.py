"""A float64 numpy interpreter for the Relax ops a recurrence region is made of.

Translation validation (``validate.py``) runs a chain as imported and its replacement on the
same random inputs; this module gives both a meaning.  Float casts are identities (the check
compares the algebra in float64, not the rounding of a dtype); ScanWeaver's own scan calls run
the float64 reference.  An op it does not know raises ``Unsupported`` naming it, never a guess.
"""
import contextlib
import math

import numpy as np
import tvm
from tvm import relax

from scanweaver_core import reference
from scanweaver_core.exprs import VarMap, call_args, op_name, tensor_shape
from scanweaver_core.scan_op import parse_scan
from scanweaver_core.spec import AffineScanSpec, DeltaScanSpec, MatrixScanSpec, MLSTMScanSpec, StabilizedScanSpec

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


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


class Unsupported(Exception):
    """The interpreter has no meaning for this expression (the message names it)."""


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _softplus(x, beta=1.0, threshold=20.0):
    return np.where(beta * x > threshold, x, np.logaddexp(0.0, beta * x) / beta)


UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "tanh": np.tanh, "abs": np.abs,
    "negative": np.negative, "square": np.square, "log1p": np.log1p, "expm1": np.expm1,
    "sin": np.sin, "cos": np.cos, "erf": _erf, "floor": np.floor, "ceil": np.ceil,
    "round": np.round, "sign": np.sign, "nn.silu": lambda x: x / (1.0 + np.exp(-x)),
    "nn.relu": lambda x: np.maximum(x, 0.0), "logical_not": np.logical_not,
    "bitwise_not": np.invert, "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite, "reciprocal": lambda x: 1.0 / x,
}
BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "power": np.power, "maximum": np.maximum, "minimum": np.minimum,
    "floor_divide": np.floor_divide, "equal": np.equal, "not_equal": np.not_equal,
    "less": np.less, "less_equal": np.less_equal, "greater": np.greater,
    "greater_equal": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
    "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
}


def const_ints(x):
    """The ints of a shape-like argument (a ShapeExpr, a Tuple of PrimValues, an Array);
    raises TypeError for one that is not a constant."""
    if x is None:
        return None
    if isinstance(x, (relax.Tuple, relax.ShapeExpr)):
        x = x.fields if isinstance(x, relax.Tuple) else x.values
    values = getattr(x, "values", x)
    out = []
    for v in values:
        v = getattr(v, "value", v)
        out.append(int(v))
    return out


def _axes(attr, ndim):
    return None if attr is None else tuple(int(a) % ndim for a in const_ints(attr))


def _np_dtype(dtype):
    dtype = str(dtype)
    if dtype in FLOAT_DTYPES:
        return np.float64
    return np.dtype("bool" if dtype == "bool" else dtype)


def _prim(x):
    return float(getattr(x, "value", x))


def _reduce(fn, call, x):
    a = call.attrs
    axes = _axes(a.axis, x.ndim)
    return fn(x, axis=axes, keepdims=bool(a.keepdims))


def _apply_call(call, args):  # pylint: disable=too-many-return-statements,too-many-branches
    name = op_name(call)[len("relax."):]
    a = call.attrs
    if name in UNARY:
        return UNARY[name](args[0])
    if name in BINARY:
        return BINARY[name](args[0], args[1])
    if name == "astype":
        return args[0].astype(_np_dtype(a.dtype))
    if name == "clip":
        return np.clip(args[0], _prim(call.args[1]), _prim(call.args[2]))
    if name == "where":
        return np.where(args[0], args[1], args[2])
    if name == "nn.softplus":
        return _softplus(args[0], float(a.beta), float(a.threshold))
    if name == "take":
        axis, index = int(a.axis) % args[0].ndim, np.asarray(args[1])
        if index.ndim == 0:      # one slice: a view (np.take would copy through its general path)
            return args[0][(slice(None),) * axis + (int(index),)]
        return np.take(args[0], index.astype(np.int64), axis=axis)
    if name == "strided_slice":
        x, axes = args[0], const_ints(call.args[1])
        begin, end = const_ints(call.args[2]), const_ints(call.args[3])
        strides = const_ints(call.args[4]) if len(call.args) > 4 else [1] * len(axes)
        index = [slice(None)] * x.ndim
        for ax, lo, hi, st in zip(axes, begin, end, strides):
            index[ax % x.ndim] = slice(lo, hi, st)
        return x[tuple(index)]
    if name == "concat":
        return np.concatenate(args[0], axis=int(a.axis))
    if name == "stack":
        return np.stack(args[0], axis=int(a.axis))
    if name == "nn.pad" and str(a.pad_mode) == "constant":
        # a negative width crops (RWKV's time shift pads (1, -1) along time)
        width = [int(w) for w in a.pad_width]
        x = args[0]
        crop = tuple(slice(max(0, -width[2 * d]), x.shape[d] - max(0, -width[2 * d + 1]))
                     for d in range(x.ndim))
        return np.pad(x[crop], [(max(0, width[2 * d]), max(0, width[2 * d + 1])) for d in range(x.ndim)],
                      constant_values=float(a.pad_value))
    if name == "scatter_nd":        # ONNX ScatterND (what ``o[:, :, t] = x`` exports to)
        return _scatter_nd(args[0], args[1], args[2], str(a.reduction))
    if name == "split":
        sections = a.indices_or_sections
        sections = int(sections) if not hasattr(sections, "__len__") else const_ints(sections)
        return tuple(np.split(args[0], sections, axis=int(a.axis)))
    if name == "expand_dims":
        x, axes = args[0], const_ints(a.axis)
        for ax in sorted(v % (x.ndim + len(axes)) for v in axes):
            x = np.expand_dims(x, ax)
        return x
    if name == "squeeze":
        return np.squeeze(args[0], _axes(a.axis, args[0].ndim))
    if name == "reshape":
        return args[0].reshape(const_ints(call.args[1]))
    if name == "permute_dims":
        return np.transpose(args[0], None if a.axes is None else const_ints(a.axes))
    if name == "broadcast_to":
        return np.broadcast_to(args[0], const_ints(call.args[1]))
    if name == "tile":
        return np.tile(args[0], const_ints(a.repeats))
    if name == "flip":
        return np.flip(args[0], int(a.axis))
    if name == "matmul":
        return np.matmul(args[0], args[1])
    if name == "einsum":
        return np.einsum(str(a.subscripts), *args[0], optimize=len(args[0]) > 2)
    if name == "slice_scatter":                  # (an in-place write to a slice: x[..., a:b] = y)
        out = np.array(args[0], copy=True)
        index = [slice(None)] * out.ndim
        index[int(a.axis) % out.ndim] = slice(*(int(_prim(call.args[n])) for n in (2, 3, 4)))
        out[tuple(index)] = args[1]
        return out
    if name == "topk":                           # (torch.max(x, dim) exports as topk k=1)
        return _topk(args[0], int(a.k), int(a.axis), bool(a.largest), str(a.ret_type), str(a.dtype))
    if name in ("sum", "mean", "max", "min", "prod", "variance"):
        return _reduce({"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min,
                        "prod": np.prod, "variance": np.var}[name], call, args[0])
    if name in ("cumsum", "cumprod"):
        fn = np.cumsum if name == "cumsum" else np.cumprod
        x = args[0] if a.axis is not None else args[0].reshape(-1)
        axis = 0 if a.axis is None else int(a.axis) % x.ndim
        out = fn(x, axis=axis)
        if bool(getattr(a, "exclusive", False)):      # the sum (product) of the ones before
            first = np.full_like(np.take(out, [0], axis=axis), 0 if name == "cumsum" else 1)
            out = np.concatenate([first, np.take(out, range(x.shape[axis] - 1), axis=axis)], axis)
        return out
    if name in ("zeros", "ones"):
        return np.full(const_ints(call.args[0]), 0 if name == "zeros" else 1, _np_dtype(a.dtype))
    if name in ("zeros_like", "ones_like"):
        return np.full_like(args[0], 0 if name == "zeros_like" else 1)
    if name == "full":
        return np.full(const_ints(call.args[0]), args[1], _np_dtype(a.dtype))
    if name == "full_like":
        return np.full_like(args[0], args[1])
    if name == "arange":
        start, end, step = (float(getattr(x, "value", x)) for x in call_args(call))
        return np.arange(start, end, step).astype(_np_dtype(a.dtype))
    if name in ("nn.softmax", "nn.log_softmax"):
        x = args[0] - args[0].max(axis=int(a.axis), keepdims=True)
        e = np.exp(x)
        total = e.sum(axis=int(a.axis), keepdims=True)
        return e / total if name == "nn.softmax" else x - np.log(total)
    if name == "nn.gelu":
        return 0.5 * args[0] * (1.0 + _erf(args[0] / math.sqrt(2.0)))
    if name == "nn.gelu_tanh":
        x = args[0]
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if name == "nn.layer_norm":
        x, axes = args[0], _axes(a.axes, args[0].ndim)
        mean = x.mean(axis=axes, keepdims=True)
        y = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + float(a.epsilon))
        y = y * args[1] if bool(a.scale) else y
        return y + args[2] if bool(a.center) else y
    if name == "nn.rms_norm":
        x, axes = args[0], _axes(a.axes, args[0].ndim)
        return x / np.sqrt((x ** 2).mean(axis=axes, keepdims=True) + float(a.epsilon)) * args[1]
    raise Unsupported(f"relax.{name}")


def _topk(x, k, axis, largest, ret_type, dtype):
    """``relax.topk``: the ``k`` largest (smallest) along ``axis``, in order, and their indices."""
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    index = np.take(order, np.arange(k), axis=axis)
    values = np.take_along_axis(x, index, axis=axis)
    index = index.astype(dtype)
    return {"both": (values, index), "values": values, "indices": index}[ret_type]


def _scatter_nd(data, indices, updates, reduction):
    """``data`` with ``updates`` written (or combined by ``reduction``) at ``indices``, the
    tuples along its last axis, in order (a later duplicate wins under "update")."""
    indices = np.asarray(indices).astype(np.int64)
    k = indices.shape[-1]
    out = np.array(data, dtype=np.result_type(data, updates), copy=True)
    where = tuple(np.moveaxis(indices.reshape(-1, k) % np.array(out.shape[:k]), -1, 0))
    updates = np.reshape(updates, (-1,) + out.shape[k:])
    if reduction == "update":
        for i, u in enumerate(updates):
            out[tuple(w[i] for w in where)] = u
        return out
    ufunc = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}.get(reduction)
    if ufunc is None:
        raise Unsupported(f"relax.scatter_nd with reduction {reduction}")
    ufunc.at(out, where, updates)
    return out


OTHER_OPS = ("astype clip where nn.softplus take strided_slice concat stack split expand_dims squeeze reshape "
             "permute_dims broadcast_to flip matmul einsum sum mean variance max min prod cumsum cumprod zeros "
             "ones zeros_like ones_like full full_like topk slice_scatter nn.softmax nn.log_softmax nn.gelu nn.gelu_tanh "
             "nn.layer_norm nn.rms_norm arange scatter_nd tile nn.pad").split()
SUPPORTED_OPS = frozenset(f"relax.{n}" for n in (*UNARY, *BINARY, *OTHER_OPS))


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
