"""Evaluate small Relax subgraphs with numpy, to check what they compute.

The selective-scan matcher must know that ``exp``'s argument is ``delta[b, d, l] * A[d, n]``
and the step input ``delta*B*u`` with the right index placement, or that a per-step readout is
``einsum('bdn,bn->bd', h, C_t)``, however the frontend wrote them: broadcast ``multiply``s of
``expand_dims``/``permute_dims``/``reshape`` views and ``matmul``s (PyTorch), or one ``einsum``
each (ONNX).  Running those few view/linear ops on random probe inputs checks the multilinear
map they compute against the intended einsum, for any spelling.
"""
import numpy as np
import tvm
from tvm import relax

from .steps import op_name, tensor_shape

VIEW_OPS = ("relax.expand_dims", "relax.permute_dims", "relax.reshape", "relax.broadcast_to",
            "relax.squeeze")


def _ints(x):
    if x is None:
        return None
    values = getattr(x, "values", x)
    return [int(v) for v in values]


def _apply(name, call, args):
    a = call.attrs
    if name == "relax.expand_dims":
        x = args[0]
        for ax in sorted(int(v) % (x.ndim + len(a.axis)) for v in a.axis):
            x = np.expand_dims(x, ax)
        return x
    if name == "relax.permute_dims":
        return np.transpose(args[0], _ints(a.axes))
    if name == "relax.reshape":
        return args[0].reshape(_ints(call.args[1]))
    if name == "relax.broadcast_to":
        return np.broadcast_to(args[0], _ints(call.args[1]))
    if name == "relax.squeeze":
        return np.squeeze(args[0], None if a.axis is None else tuple(_ints(a.axis)))
    if name == "relax.matmul":
        return np.matmul(args[0], args[1])
    if name == "relax.multiply":
        return args[0] * args[1]
    if name == "relax.add":
        return args[0] + args[1]
    if name == "relax.sum":
        return np.sum(args[0], axis=None if a.axis is None else tuple(_ints(a.axis)), keepdims=bool(a.keepdims))
    if name == "relax.einsum":
        return np.einsum(str(a.subscripts), *args)
    if name == "relax.exp":
        return np.exp(args[0])
    if name == "relax.log":
        return np.log(args[0])
    if name == "relax.greater":
        return args[0] > args[1]
    if name == "relax.where":
        return np.where(args[0], args[1], args[2])
    if name == "relax.nn.softplus":
        return np.logaddexp(0.0, args[0])
    if name == "relax.sigmoid":
        return 1.0 / (1.0 + np.exp(-args[0]))
    if name == "relax.nn.silu":
        return args[0] / (1.0 + np.exp(-args[0]))
    raise KeyError(name)


SUPPORTED = VIEW_OPS + ("relax.matmul", "relax.multiply", "relax.add", "relax.sum", "relax.einsum",
                        "relax.sigmoid", "relax.nn.silu", "relax.exp", "relax.log", "relax.greater",
                        "relax.where", "relax.nn.softplus")


def inputs(call):
    """The tensors a supported op reads: not the target shape of ``reshape``/``broadcast_to``,
    and the fields of ``einsum``'s operand tuple."""
    name = op_name(call)
    if name in ("relax.reshape", "relax.broadcast_to"):
        return list(call.args[:1])
    if name == "relax.einsum" and isinstance(call.args[0], relax.Tuple):
        return list(call.args[0].fields)
    return list(call.args)


def evaluate(value_of, expr, env):
    """numpy value of ``expr`` given ``env`` (var -> array); None if it needs anything else."""
    memo = {}

    def go(e):
        if isinstance(e, relax.Var):
            if e in env:
                return env[e]
            if e in memo:
                return memo[e]
            call = value_of.get(e)
            name = op_name(call)
            if name not in SUPPORTED:
                raise KeyError(name)
            args = [go(x) for x in inputs(call)]
            memo[e] = _apply(name, call, args)
            return memo[e]
        if isinstance(e, tvm.ir.expr.GenericConst):
            return e.value.numpy()
        raise KeyError(type(e).__name__)

    try:
        return go(expr)
    except (KeyError, ValueError, TypeError):
        return None


def view_chain(value_of, expr):
    """``expr`` and every tensor below it through view ops, top first."""
    chain = [expr]
    while isinstance(expr, relax.Var) and op_name(value_of.get(expr)) in VIEW_OPS:
        expr = value_of[expr].args[0]
        chain.append(expr)
    return chain


def viewed_tensor(value_of, expr, shapes):
    """The first tensor below ``expr`` (through views) whose shape is in ``shapes``, or None."""
    return next((x for x in view_chain(value_of, expr) if tensor_shape(x) in shapes), None)


def multiply_factors(value_of, expr):
    """The leaves of a tree of ``multiply`` bindings."""
    call = value_of.get(expr) if isinstance(expr, relax.Var) else None
    if op_name(call) == "relax.multiply":
        return multiply_factors(value_of, call.args[0]) + multiply_factors(value_of, call.args[1])
    return [expr]
