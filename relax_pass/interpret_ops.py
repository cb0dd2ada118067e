"""The float64 numpy meaning of each Relax op the interpreter knows.

``interpret.py`` walks a function's bindings (order, memoized values, constants, ScanWeaver's
own scan calls, probe inputs); what each ``relax.*`` op computes is this module's table
(``UNARY``, ``BINARY`` and ``_apply_call``), with ``SUPPORTED_OPS`` naming them all.  Kept
apart so the interpreter's evaluation and the ops' numpy semantics can each be read (and
extended: a new op is one entry here) without the other.  An op without a meaning raises
``Unsupported`` naming it, never a guess.
"""
import math

import numpy as np
from tvm import relax

from scanweaver_core.exprs import call_args, op_name

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


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
